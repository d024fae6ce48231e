//! Routers built from the operation tables: a route is served by naming its operation, whose
//! method and path come from the table, and a program's router is checked, when it is built,
//! to serve its document's operations exactly once each ([`Routes::finish`]).

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::Router;
use axum::extract::Request;
use axum::handler::Handler;
use axum::response::IntoResponse;
use axum::routing::{MethodFilter, MethodRouter, Route, any, any_service, on, on_service};
use tower::{Layer, Service};

use super::{Document, Kind, Method, Operation};

/// An axum router and the operations it serves, each with the path it is served at.
pub struct Routes<S = ()> {
    router: Router<S>,
    bound: Vec<(&'static Operation, String)>,
}

impl<S: Clone + Send + Sync + 'static> Default for Routes<S> {
    fn default() -> Self {
        Routes::new()
    }
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    pub fn new() -> Self {
        Routes {
            router: Router::new(),
            bound: Vec::new(),
        }
    }

    /// Serves `op` with `handler` at its route, for its method (every method for a relay or an
    /// MCP endpoint).
    pub fn bind<H, T>(self, op: &'static Operation, handler: H) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        self.bind_with(op, handler, |m| m)
    }

    /// [`Routes::bind`], the method router passed through `f` first (a layer, a fallback for
    /// the methods `op` does not take).
    pub fn bind_with<H, T>(
        mut self,
        op: &'static Operation,
        handler: H,
        f: impl FnOnce(MethodRouter<S>) -> MethodRouter<S>,
    ) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        let methods = match op.kind {
            Kind::Call(m) => on(filter(m), handler),
            Kind::Relay | Kind::Mcp => any(handler),
        };
        self.router = self.router.route(op.route(), f(methods));
        self.bound.push((op, op.route().to_string()));
        self
    }

    /// Serves `op` with a tower service (an MCP server's).
    pub fn bind_service<T>(mut self, op: &'static Operation, service: T) -> Self
    where
        T: Service<Request, Error = Infallible> + Clone + Send + Sync + 'static,
        T::Response: IntoResponse + 'static,
        T::Future: Send + 'static,
    {
        let methods: MethodRouter<S> = match op.kind {
            Kind::Call(m) => on_service(filter(m), service),
            Kind::Relay | Kind::Mcp => any_service(service),
        };
        self.router = self.router.route(op.route(), methods);
        self.bound.push((op, op.route().to_string()));
        self
    }

    pub fn merge(mut self, other: Routes<S>) -> Self {
        self.router = self.router.merge(other.router);
        self.bound.extend(other.bound);
        self
    }

    /// Serves `other` under `prefix` (its operations' [`Operation::nest`]).
    pub fn nest(mut self, prefix: &str, other: Routes<S>) -> Self {
        self.router = self.router.nest(prefix, other.router);
        self.bound.extend(
            other
                .bound
                .into_iter()
                .map(|(op, path)| (op, format!("{prefix}{path}"))),
        );
        self
    }

    pub fn fallback<H, T>(mut self, handler: H) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        self.router = self.router.fallback(handler);
        self
    }

    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<Route> + Clone + Send + Sync + 'static,
        L::Service: Service<Request> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request>>::Response: IntoResponse + 'static,
        <L::Service as Service<Request>>::Error: Into<Infallible> + 'static,
        <L::Service as Service<Request>>::Future: Send + 'static,
    {
        self.router = self.router.layer(layer);
        self
    }

    pub fn route_layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<Route> + Clone + Send + Sync + 'static,
        L::Service: Service<Request> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request>>::Response: IntoResponse + 'static,
        <L::Service as Service<Request>>::Error: Into<Infallible> + 'static,
        <L::Service as Service<Request>>::Future: Send + 'static,
    {
        self.router = self.router.route_layer(layer);
        self
    }

    /// The operations served, by operationId, with the path each is served at.
    pub fn bound(&self) -> impl Iterator<Item = (&'static Operation, &str)> {
        self.bound.iter().map(|(op, path)| (*op, path.as_str()))
    }

    /// What keeps this router from serving exactly `doc`: an operation of it not served, served
    /// twice or at another path than its own, or one served that it does not list.
    pub fn mismatches(&self, doc: &Document) -> Vec<String> {
        let mut served: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (op, path) in &self.bound {
            served.entry(op.id).or_default().push(path);
        }
        let mut out = Vec::new();
        for op in doc.operations() {
            match served.remove(op.id).as_deref() {
                None => out.push(format!("{} is not served", op.id)),
                Some([path]) if *path == op.path => {}
                Some(paths) => out.push(format!("{} ({}) is served at {paths:?}", op.id, op.path)),
            }
        }
        out.extend(
            served
                .into_keys()
                .map(|id| format!("{id} is served but not in the document")),
        );
        out
    }

    /// The router, which serves `doc`'s operations exactly once each at their paths.
    ///
    /// # Panics
    ///
    /// When it does not ([`Routes::mismatches`]): a router built wrong is a bug found at
    /// start-up, by any test that starts the program.
    pub fn finish(self, doc: &Document) -> Router<S> {
        let wrong = self.mismatches(doc);
        assert!(
            wrong.is_empty(),
            "the {} router does not serve its document: {}",
            doc.title,
            wrong.join("; ")
        );
        self.router
    }
}

fn filter(m: Method) -> MethodFilter {
    match m {
        Method::Get => MethodFilter::GET,
        Method::Post => MethodFilter::POST,
        Method::Put => MethodFilter::PUT,
        Method::Delete => MethodFilter::DELETE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{Operation, native};

    const DOC: Document = Document {
        title: "test",
        description: "",
        security_schemes: || serde_json::json!({}),
        surfaces: &[&[&native::HEALTHZ, &native::EXEC, &native::COMMAND_GET]],
    };

    fn routes() -> Routes {
        Routes::new()
            .bind(&native::HEALTHZ, || async { "ok" })
            .nest(
                crate::routes::native::PREFIX,
                Routes::new()
                    .bind(&native::EXEC, || async { "ran" })
                    .bind(&native::COMMAND_GET, || async { "one" }),
            )
    }

    #[test]
    fn a_router_serving_its_document_exactly_finishes() {
        assert_eq!(routes().mismatches(&DOC), Vec::<String>::new());
        let _ = routes().finish(&DOC);
    }

    #[test]
    fn an_operation_left_out_served_twice_or_elsewhere_is_named() {
        let missing = Routes::<()>::new().bind(&native::HEALTHZ, || async { "ok" });
        assert_eq!(
            missing.mismatches(&DOC),
            ["exec is not served", "command_get is not served"]
        );
        // Not nested: served at `/exec`, not `/v1/exec`.
        let elsewhere = routes().bind(&native::EXEC, || async { "ran" });
        assert_eq!(
            elsewhere.mismatches(&DOC),
            [r#"exec (/v1/exec) is served at ["/v1/exec", "/exec"]"#]
        );
        let extra = routes().bind(&native::SHUTDOWN, || async { "bye" });
        assert_eq!(
            extra.mismatches(&DOC),
            ["shutdown is served but not in the document"]
        );
    }

    #[test]
    #[should_panic(expected = "exec is not served")]
    fn finish_refuses_a_router_missing_an_operation() {
        let _ = Routes::<()>::new()
            .bind(&native::HEALTHZ, || async { "ok" })
            .bind(&native::COMMAND_GET, || async { "one" })
            .finish(&DOC);
    }

    #[tokio::test]
    async fn the_method_comes_from_the_operation() {
        use tower::ServiceExt;
        const PUT: Operation = Operation::put("/x", "x_put", "");
        const DELETE: Operation = Operation::delete("/x", "x_delete", "");
        const RELAY: Operation = Operation::relay("/r", "r", "");
        // Two operations on one path are one route with both methods.
        let router = Routes::<()>::new()
            .bind(&PUT, || async { "put" })
            .bind(&DELETE, || async { "deleted" })
            .bind(&RELAY, || async { "relayed" })
            .router;
        for (method, path, status) in [
            ("PUT", "/x", 200),
            ("DELETE", "/x", 200),
            ("GET", "/x", 405),
            ("PATCH", "/r", 200),
            ("GET", "/r", 200),
        ] {
            let req = Request::builder()
                .method(method)
                .uri(path)
                .body(axum::body::Body::empty())
                .unwrap();
            let answer = router.clone().oneshot(req).await.unwrap();
            assert_eq!(answer.status(), status, "{method} {path}");
        }
    }
}
