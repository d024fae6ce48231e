//! The fake API server's storage: namespaced objects as the JSON a real API server keeps
//! (checked against the `k8s-openapi` types on every write), one resourceVersion counter, a
//! bounded event history for watches, label and field selectors, and the garbage collector's
//! ownerReference cascade.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast;

/// The resources the fake serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Pod,
    Secret,
    ConfigMap,
    NetworkPolicy,
    Service,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Pod,
        Kind::Secret,
        Kind::ConfigMap,
        Kind::NetworkPolicy,
        Kind::Service,
    ];

    pub fn plural(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::Secret => "secrets",
            Kind::ConfigMap => "configmaps",
            Kind::NetworkPolicy => "networkpolicies",
            Kind::Service => "services",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::Service => "Service",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Kind::NetworkPolicy => "networking.k8s.io/v1",
            _ => "v1",
        }
    }

    /// The API group (`""` for core).
    pub fn group(self) -> &'static str {
        match self {
            Kind::NetworkPolicy => "networking.k8s.io",
            _ => "",
        }
    }

    /// The resource a request path names: `(group, version, plural)`.
    pub fn from_path(group: &str, version: &str, plural: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.group() == group && version == "v1" && k.plural() == plural)
    }

    /// The kind an ownerReference or `k8s_openapi::Resource::KIND` names.
    pub fn from_kind(kind: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == kind)
    }

    /// Whether `obj` deserialises into this kind's `k8s-openapi` type (what a real API
    /// server's schema validation would reject, roughly).
    fn validate(self, obj: &Value) -> Result<(), String> {
        use k8s_openapi::api::{core::v1, networking::v1 as net};
        let o = obj.clone();
        let r = match self {
            Kind::Pod => serde_json::from_value::<v1::Pod>(o).map(drop),
            Kind::Secret => serde_json::from_value::<v1::Secret>(o).map(drop),
            Kind::ConfigMap => serde_json::from_value::<v1::ConfigMap>(o).map(drop),
            Kind::NetworkPolicy => serde_json::from_value::<net::NetworkPolicy>(o).map(drop),
            Kind::Service => serde_json::from_value::<v1::Service>(o).map(drop),
        };
        r.map_err(|e| format!("{} is invalid: {e}", self.name()))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

/// One change, as a watch delivers it.
#[derive(Clone, Debug)]
pub struct Event {
    pub kind: Kind,
    pub namespace: String,
    /// `ADDED`, `MODIFIED`, `DELETED`.
    pub typ: &'static str,
    pub object: Value,
    pub rv: u64,
}

/// An API error, answered as a `Status` object.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub name: Option<String>,
    pub kind: Option<Kind>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            name: None,
            kind: None,
        }
    }

    pub fn not_found(kind: Kind, name: &str) -> ApiError {
        ApiError {
            name: Some(name.into()),
            kind: Some(kind),
            ..ApiError::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", kind.plural()),
            )
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// The `metav1.Status` a real API server answers.
    pub fn status(&self) -> Value {
        let mut details = serde_json::Map::new();
        if let Some(n) = &self.name {
            details.insert("name".into(), json!(n));
        }
        if let Some(k) = self.kind {
            details.insert("kind".into(), json!(k.plural()));
            if !k.group().is_empty() {
                details.insert("group".into(), json!(k.group()));
            }
        }
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if !details.is_empty() {
            s["details"] = Value::Object(details);
        }
        s
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// How a delete treats the object's dependents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

impl Propagation {
    pub fn parse(s: &str) -> ApiResult<Propagation> {
        match s {
            "Background" => Ok(Propagation::Background),
            "Foreground" => Ok(Propagation::Foreground),
            "Orphan" => Ok(Propagation::Orphan),
            other => Err(ApiError::bad_request(format!(
                "unsupported propagationPolicy {other:?}: Background, Foreground or Orphan"
            ))),
        }
    }
}

/// What the store asks the fake kubelet to do.
#[derive(Clone, Debug)]
pub enum KubeletWork {
    /// A Pod was created: schedule and start it.
    Start(Key),
    /// A Pod was marked for deletion: stop its containers, then remove it.
    Stop(Key, u64),
}

const HISTORY: usize = 4096;
const FOREGROUND: &str = "foregroundDeletion";

pub struct Store {
    rv: u64,
    uids: u64,
    salt: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Event>,
    /// The newest resourceVersion no longer in `history` (a watch from before it is 410).
    compacted: u64,
    pub events: broadcast::Sender<Arc<Event>>,
    kubelet: tokio::sync::mpsc::UnboundedSender<KubeletWork>,
}

/// RFC 3339 "now", as metadata timestamps are written.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

fn meta(obj: &Value) -> &Value {
    &obj["metadata"]
}

pub fn uid_of(obj: &Value) -> Option<&str> {
    meta(obj)["uid"].as_str()
}

fn owner_uids(obj: &Value) -> Vec<String> {
    meta(obj)["ownerReferences"]
        .as_array()
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r["uid"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn terminating(obj: &Value) -> bool {
    !meta(obj)["deletionTimestamp"].is_null()
}

impl Store {
    pub fn new(kubelet: tokio::sync::mpsc::UnboundedSender<KubeletWork>) -> Store {
        let salt = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.finish()
        };
        Store {
            rv: 1000,
            uids: 0,
            salt,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted: 0,
            events: broadcast::channel(8192).0,
            kubelet,
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Forgets the event history: a watch from any earlier resourceVersion is 410 Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    fn next_uid(&mut self) -> String {
        self.uids += 1;
        let a = self.salt ^ self.uids.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (a >> 32) as u32,
            (a >> 16) as u16,
            (a & 0xfff) as u16,
            (self.uids & 0xfff) as u16,
            self.uids
        )
    }

    fn emit(&mut self, key: &Key, typ: &'static str, object: Value) {
        let e = Event {
            kind: key.kind,
            namespace: key.namespace.clone(),
            typ,
            object,
            rv: self.rv,
        };
        if self.history.len() == HISTORY
            && let Some(old) = self.history.pop_front()
        {
            self.compacted = old.rv;
        }
        self.history.push_back(e.clone());
        let _ = self.events.send(Arc::new(e));
    }

    /// The events after `rv`; `None` when the history no longer reaches back to it.
    pub fn events_since(&self, rv: u64) -> Option<Vec<Event>> {
        if rv < self.compacted {
            return None;
        }
        Some(self.history.iter().filter(|e| e.rv > rv).cloned().collect())
    }

    fn bump(&mut self, obj: &mut Value) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
    }

    pub fn get(&self, key: &Key) -> ApiResult<Value> {
        self.objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(key.kind, &key.name))
    }

    pub fn all(&self) -> impl Iterator<Item = (&Key, &Value)> {
        self.objects.iter()
    }

    pub fn create(&mut self, kind: Kind, namespace: &str, mut obj: Value) -> ApiResult<Value> {
        check_body(kind, &obj)?;
        if obj["metadata"].is_null() {
            obj["metadata"] = json!({});
        }
        let name = self.new_name(kind, &mut obj)?;
        check_metadata(kind, namespace, &name, &obj)?;
        let key = Key {
            kind,
            namespace: namespace.to_string(),
            name: name.clone(),
        };
        if self.objects.contains_key(&key) {
            return Err(ApiError {
                name: Some(name.clone()),
                kind: Some(kind),
                ..ApiError::new(
                    409,
                    "AlreadyExists",
                    format!("{} \"{name}\" already exists", kind.plural()),
                )
            });
        }
        obj["apiVersion"] = json!(kind.api_version());
        obj["kind"] = json!(kind.name());
        let uid = self.next_uid();
        let m = &mut obj["metadata"];
        m["namespace"] = json!(namespace);
        m["uid"] = json!(uid);
        m["creationTimestamp"] = json!(now_rfc3339());
        m["generation"] = json!(1);
        if let Some(m) = m.as_object_mut() {
            m.remove("deletionTimestamp");
        }
        set_defaults(kind, &mut obj);
        self.bump(&mut obj);
        self.objects.insert(key.clone(), obj.clone());
        self.emit(&key, "ADDED", obj.clone());
        if kind == Kind::Pod {
            let _ = self.kubelet.send(KubeletWork::Start(key));
        }
        Ok(obj)
    }

    /// The name of an object being created: its own, or one made from its `generateName`
    /// (written into its metadata); a 422 when it has neither.
    fn new_name(&self, kind: Kind, obj: &mut Value) -> ApiResult<String> {
        match (
            meta(obj)["name"].as_str(),
            meta(obj)["generateName"].as_str(),
        ) {
            (Some(n), _) if !n.is_empty() => Ok(n.to_string()),
            (_, Some(g)) => {
                let n = format!("{g}{:05x}", (self.salt ^ self.uids) & 0xfffff);
                obj["metadata"]["name"] = json!(n);
                Ok(n)
            }
            _ => Err(ApiError::new(
                422,
                "Invalid",
                format!("{} is invalid: metadata.name: Required value", kind.name()),
            )),
        }
    }

    /// Replaces an object (PUT): the stored resourceVersion must match when one is sent.
    pub fn replace(&mut self, key: &Key, mut obj: Value) -> ApiResult<Value> {
        let old = self.get(key)?;
        key.kind.validate(&obj).map_err(ApiError::bad_request)?;
        if let Some(rv) = meta(&obj)["resourceVersion"].as_str()
            && Some(rv) != meta(&old)["resourceVersion"].as_str()
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{}\": the object has been modified; \
                     please apply your changes to the latest version and try again",
                    key.kind.plural(),
                    key.name
                ),
            ));
        }
        for k in [
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "deletionTimestamp",
        ] {
            obj["metadata"][k] = old["metadata"][k].clone();
        }
        if key.kind == Kind::Pod {
            // Status is the kubelet's (the status subresource); the spec is immutable but
            // for a few fields.
            obj["status"] = old["status"].clone();
            obj["spec"] = old["spec"].clone();
        }
        obj["apiVersion"] = json!(key.kind.api_version());
        obj["kind"] = json!(key.kind.name());
        self.store_modified(key, obj)
    }

    /// A JSON merge patch (RFC 7386; also how strategic-merge and apply patches are treated).
    pub fn merge_patch(&mut self, key: &Key, patch: &Value) -> ApiResult<Value> {
        let mut obj = self.get(key)?;
        let keep = obj["metadata"].clone();
        merge(&mut obj, patch);
        for k in ["uid", "creationTimestamp", "namespace", "name"] {
            obj["metadata"][k] = keep[k].clone();
        }
        key.kind.validate(&obj).map_err(ApiError::bad_request)?;
        self.store_modified(key, obj)
    }

    fn store_modified(&mut self, key: &Key, mut obj: Value) -> ApiResult<Value> {
        self.bump(&mut obj);
        self.objects.insert(key.clone(), obj.clone());
        self.emit(key, "MODIFIED", obj.clone());
        self.collect_garbage();
        Ok(obj)
    }

    /// The kubelet's status write (no validation beyond the type's).
    pub fn set_pod_status(&mut self, key: &Key, status: Value) -> bool {
        let Some(mut obj) = self.objects.get(key).cloned() else {
            return false;
        };
        if obj["status"] == status {
            return true;
        }
        obj["status"] = status;
        let _ = self.store_modified(key, obj);
        true
    }

    /// The kubelet's binding: node and IP known.
    pub fn bind_pod(&mut self, key: &Key, node: &str) -> bool {
        let Some(mut obj) = self.objects.get(key).cloned() else {
            return false;
        };
        obj["spec"]["nodeName"] = json!(node);
        let _ = self.store_modified(key, obj);
        true
    }

    pub fn delete(
        &mut self,
        key: &Key,
        propagation: Option<Propagation>,
        grace_seconds: Option<u64>,
    ) -> ApiResult<Value> {
        let mut obj = self.get(key)?;
        let propagation = propagation.unwrap_or(Propagation::Background);
        let uid = uid_of(&obj).unwrap_or_default().to_string();
        match propagation {
            Propagation::Orphan => {
                let dependents: Vec<Key> = self.dependents_of(&uid);
                for d in dependents {
                    if let Some(mut dep) = self.objects.get(&d).cloned() {
                        if let Some(refs) = dep["metadata"]["ownerReferences"].as_array_mut() {
                            refs.retain(|r| r["uid"].as_str() != Some(uid.as_str()));
                        }
                        let _ = self.store_modified(&d, dep);
                    }
                }
            }
            Propagation::Foreground => {
                let m = &mut obj["metadata"];
                if m["finalizers"].is_null() {
                    m["finalizers"] = json!([]);
                }
                let f = m["finalizers"].as_array_mut().unwrap();
                if !f.iter().any(|x| x == FOREGROUND) {
                    f.push(json!(FOREGROUND));
                }
            }
            Propagation::Background => {}
        }
        let graceful = key.kind == Kind::Pod;
        if propagation == Propagation::Foreground || graceful {
            if !terminating(&obj) {
                let grace = grace_seconds.unwrap_or_else(|| {
                    obj["spec"]["terminationGracePeriodSeconds"]
                        .as_u64()
                        .unwrap_or(30)
                });
                obj["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                obj["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                let obj = self.store_modified(key, obj.clone())?;
                if graceful {
                    let _ = self.kubelet.send(KubeletWork::Stop(key.clone(), grace));
                }
                if propagation == Propagation::Foreground {
                    for d in self.dependents_of(&uid) {
                        let _ = self.delete(&d, Some(Propagation::Background), None);
                    }
                    self.collect_garbage();
                }
                return Ok(self.objects.get(key).cloned().unwrap_or(obj));
            }
            return Ok(obj);
        }
        self.remove(key);
        Ok(obj)
    }

    /// The kubelet's last word on a terminating Pod (or a delete that needs no kubelet):
    /// the object is gone, its dependents are collected.
    pub fn remove(&mut self, key: &Key) {
        if let Some(mut obj) = self.objects.remove(key) {
            self.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
            self.emit(key, "DELETED", obj);
            self.collect_garbage();
        }
    }

    /// Whether a terminating Pod's kubelet may remove it (its finalizers are done).
    pub fn finalizers_done(&self, key: &Key) -> bool {
        self.objects.get(key).is_none_or(|o| {
            meta(o)["finalizers"]
                .as_array()
                .is_none_or(|f| f.iter().all(|x| x == FOREGROUND))
        })
    }

    fn dependents_of(&self, uid: &str) -> Vec<Key> {
        self.objects
            .iter()
            .filter(|(_, o)| owner_uids(o).iter().any(|u| u == uid))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The garbage collector: an object whose every owner is gone is deleted (in the
    /// background); a foreground-deleted owner goes once no dependent is left.
    fn collect_garbage(&mut self) {
        loop {
            let live: BTreeSet<String> = self
                .objects
                .values()
                .filter_map(|o| uid_of(o).map(String::from))
                .collect();
            let orphaned: Vec<Key> = self
                .objects
                .iter()
                .filter(|(_, o)| {
                    let owners = owner_uids(o);
                    !owners.is_empty()
                        && !terminating(o)
                        && owners.iter().all(|u| !live.contains(u))
                })
                .map(|(k, _)| k.clone())
                .collect();
            let finished: Vec<Key> = self
                .objects
                .iter()
                .filter(|(k, o)| {
                    terminating(o)
                        && meta(o)["finalizers"]
                            .as_array()
                            .is_some_and(|f| f.iter().any(|x| x == FOREGROUND))
                        // A Pod goes once its kubelet has stopped it (`remove`).
                        && k.kind != Kind::Pod
                        && self.dependents_of(uid_of(o).unwrap_or_default()).is_empty()
                })
                .map(|(k, _)| k.clone())
                .collect();
            if orphaned.is_empty() && finished.is_empty() {
                return;
            }
            for k in orphaned {
                let _ = self.delete(&k, Some(Propagation::Background), None);
            }
            for k in finished {
                if let Some(o) = self.objects.remove(&k) {
                    self.rv += 1;
                    let mut o = o;
                    o["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                    self.emit(&k, "DELETED", o);
                }
            }
        }
    }

    /// Objects of `kind` in `namespace` (every namespace when `None`) that match both
    /// selectors, by name.
    pub fn list(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        labels: &Selector,
        fields: &FieldSelector,
    ) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| k.kind == kind && namespace.is_none_or(|n| n == k.namespace))
            .filter(|(_, o)| labels.matches(o) && fields.matches(o))
            .map(|(_, o)| o.clone())
            .collect()
    }
}

/// RFC 7386.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// A create's body: a JSON object of the kind its path names that the kind's `k8s-openapi`
/// type takes.
fn check_body(kind: Kind, obj: &Value) -> ApiResult<()> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    }
    if let Some(k) = obj["kind"].as_str()
        && k != kind.name()
    {
        return Err(ApiError::bad_request(format!(
            "the body is a {k}, the path names {}",
            kind.plural()
        )));
    }
    kind.validate(obj).map_err(ApiError::bad_request)
}

/// A new object's name (an RFC 1123 subdomain), namespace (the request's, when it names one)
/// and label keys and values, as the API server checks them.
fn check_metadata(kind: Kind, namespace: &str, name: &str, obj: &Value) -> ApiResult<()> {
    if !valid_name(name) {
        return Err(ApiError::new(
            422,
            "Invalid",
            format!(
                "{} \"{name}\" is invalid: metadata.name: a lowercase RFC 1123 subdomain \
                 must consist of lower case alphanumeric characters, '-' or '.'",
                kind.name()
            ),
        ));
    }
    if let Some(ns) = meta(obj)["namespace"].as_str()
        && ns != namespace
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on \
             the request",
        ));
    }
    if let Some(labels) = meta(obj)["labels"].as_object() {
        for (k, v) in labels {
            let v = v.as_str().unwrap_or_default();
            if !valid_label_value(v) || !valid_label_key(k) {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    format!(
                        "{} \"{name}\" is invalid: metadata.labels: Invalid value: \
                         \"{v}\": a valid label must be an empty string or consist of \
                         alphanumeric characters, '-', '_' or '.', and must start and end \
                         with an alphanumeric character (at most 63 characters)",
                        kind.name()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The fields the API server fills in on create: a Pod's `Pending` status, QoS class and
/// restart policy; a Secret's type, and its `stringData` moved into `data`, base64-encoded.
fn set_defaults(kind: Kind, obj: &mut Value) {
    match kind {
        Kind::Pod => {
            obj["status"] = json!({"phase": "Pending", "qosClass": qos_class(obj)});
            if obj["spec"]["restartPolicy"].is_null() {
                obj["spec"]["restartPolicy"] = json!("Always");
            }
        }
        Kind::Secret => {
            if obj["type"].is_null() {
                obj["type"] = json!("Opaque");
            }
            if let Some(sd) = obj.get("stringData").and_then(|v| v.as_object()).cloned() {
                use base64::Engine as _;
                for (k, v) in sd {
                    let b = base64::engine::general_purpose::STANDARD
                        .encode(v.as_str().unwrap_or_default());
                    obj["data"][k] = json!(b);
                }
                obj.as_object_mut().unwrap().remove("stringData");
            }
        }
        _ => {}
    }
}

fn qos_class(pod: &Value) -> &'static str {
    let containers = pod["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut any = false;
    let mut guaranteed = !containers.is_empty();
    for c in &containers {
        let r = &c["resources"];
        let (req, lim) = (&r["requests"], &r["limits"]);
        any |= req.as_object().is_some_and(|m| !m.is_empty())
            || lim.as_object().is_some_and(|m| !m.is_empty());
        for res in ["cpu", "memory"] {
            let l = &lim[res];
            let q = if req[res].is_null() { l } else { &req[res] };
            guaranteed &= !l.is_null() && q == l;
        }
    }
    match (guaranteed, any) {
        (true, _) => "Guaranteed",
        (false, true) => "Burstable",
        _ => "BestEffort",
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && n.as_bytes()[0].is_ascii_alphanumeric()
        && n.as_bytes()[n.len() - 1].is_ascii_alphanumeric()
}

fn valid_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.as_bytes()[0].is_ascii_alphanumeric()
            && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric())
}

fn valid_label_key(k: &str) -> bool {
    let name = match k.rsplit_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 {
                return false;
            }
            name
        }
        None => k,
    };
    !name.is_empty() && valid_label_value(name)
}

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector` (equality- and set-based).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    pub fn parse(s: &str) -> ApiResult<Selector> {
        let bad =
            |why: &str| ApiError::bad_request(format!("unable to parse requirement: {why}: {s:?}"));
        let mut parts = Vec::new();
        let (mut depth, mut start) = (0usize, 0usize);
        for (i, c) in s.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.checked_sub(1).ok_or_else(|| bad("unbalanced ')'"))?,
                ',' if depth == 0 => {
                    parts.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if depth != 0 {
            return Err(bad("unbalanced '('"));
        }
        parts.push(&s[start..]);
        let mut reqs = Vec::new();
        for p in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
            let set = |rest: &str| -> ApiResult<Vec<String>> {
                let rest = rest.trim();
                let inner = rest
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| bad("a set must be in parentheses"))?;
                Ok(inner
                    .split(',')
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .collect())
            };
            let req = if let Some(k) = p.strip_prefix('!') {
                Requirement::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                Requirement::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once("==") {
                Requirement::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once('=') {
                Requirement::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = p.split_once(" notin ") {
                Requirement::NotIn(k.trim().into(), set(rest)?)
            } else if let Some((k, rest)) = p.split_once(" in ") {
                Requirement::In(k.trim().into(), set(rest)?)
            } else if p.contains(' ') || p.contains('(') {
                return Err(bad("unknown operator"));
            } else {
                Requirement::Exists(p.to_string())
            };
            let key = match &req {
                Requirement::Eq(k, _)
                | Requirement::NotEq(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k) => k,
            };
            if !valid_label_key(key) {
                return Err(bad("invalid label key"));
            }
            reqs.push(req);
        }
        Ok(Selector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels[k].as_str();
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: `path=value`, `path==value`, `path!=value` on dotted paths
/// (`metadata.name`, `status.phase`, `spec.nodeName`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> ApiResult<FieldSelector> {
        let mut out = Vec::new();
        for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (path, eq, value) = if let Some((k, v)) = p.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector {p:?}: expected field=value"
                )));
            };
            out.push((path.trim().to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let mut v = obj;
            for seg in path.split('.') {
                v = &v[seg];
            }
            let got = match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (got == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(labels: Value) -> Value {
        json!({"metadata": {"labels": labels}})
    }

    #[test]
    fn label_selectors_parse_equality_and_set_requirements() {
        let o = labelled(json!({"berth.controller": "c1", "berth.managed": "true", "app": "x"}));
        for (sel, want) in [
            ("berth.controller=c1", true),
            ("berth.controller==c1,berth.managed=true", true),
            ("berth.controller=c2", false),
            ("berth.controller!=c2", true),
            ("berth.controller in (c1, c3)", true),
            ("berth.controller in (c2,c3)", false),
            ("berth.controller notin (c2,c3),app", true),
            ("!app", false),
            ("!missing,app in (x)", true),
            ("", true),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&o), want, "{sel}");
        }
        for bad in ["a in b", "a in (b", "a foo (b)", "bad key!x=1"] {
            let e = Selector::parse(bad).unwrap_err();
            assert_eq!(e.code, 400, "{bad}");
        }
    }

    #[test]
    fn field_selectors_read_dotted_paths() {
        let o = json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}});
        assert!(FieldSelector::parse("metadata.name=p").unwrap().matches(&o));
        assert!(
            FieldSelector::parse("metadata.name=p,status.phase!=Failed")
                .unwrap()
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("status.phase=Pending")
                .unwrap()
                .matches(&o)
        );
        assert!(FieldSelector::parse("nonsense").is_err());
    }

    #[test]
    fn deleting_an_owner_collects_its_dependents_and_orphan_keeps_them() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut s = Store::new(tx);
        let owner = s
            .create(
                Kind::ConfigMap,
                "ns",
                json!({"metadata": {"name": "owner"}}),
            )
            .unwrap();
        let uid = uid_of(&owner).unwrap().to_string();
        let owned = |name: &str| {
            json!({"metadata": {"name": name, "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}]},
                "data": {"token": "dA=="}})
        };
        s.create(Kind::Secret, "ns", owned("a")).unwrap();
        s.create(Kind::Secret, "ns", owned("b")).unwrap();
        let e = s.create(Kind::Secret, "ns", owned("a")).unwrap_err();
        assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
        let key = |kind, name: &str| Key {
            kind,
            namespace: "ns".into(),
            name: name.into(),
        };
        s.delete(&key(Kind::ConfigMap, "owner"), None, None)
            .unwrap();
        assert!(s.get(&key(Kind::Secret, "a")).is_err());
        assert!(s.get(&key(Kind::Secret, "b")).is_err());
        // Orphan: the dependent stays, without its reference.
        let owner = s
            .create(
                Kind::ConfigMap,
                "ns",
                json!({"metadata": {"name": "owner"}}),
            )
            .unwrap();
        let uid = uid_of(&owner).unwrap().to_string();
        s.create(
            Kind::Secret,
            "ns",
            json!({"metadata": {"name": "c", "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}]}}),
        )
        .unwrap();
        s.delete(
            &key(Kind::ConfigMap, "owner"),
            Some(Propagation::Orphan),
            None,
        )
        .unwrap();
        let c = s.get(&key(Kind::Secret, "c")).unwrap();
        assert_eq!(c["metadata"]["ownerReferences"], json!([]));
        let e = s.get(&key(Kind::ConfigMap, "owner")).unwrap_err();
        assert_eq!(e.status()["reason"], "NotFound");
    }

    #[test]
    fn invalid_objects_are_rejected_before_they_are_stored() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut s = Store::new(tx);
        let e = s
            .create(
                Kind::Pod,
                "ns",
                json!({"metadata": {"name": "p"}, "spec": {"containers": 5}}),
            )
            .unwrap_err();
        assert_eq!(e.code, 400, "{e:?}");
        let e = s
            .create(
                Kind::ConfigMap,
                "ns",
                json!({"metadata": {"name": "Upper"}}),
            )
            .unwrap_err();
        assert_eq!(e.code, 422);
        let e = s
            .create(
                Kind::ConfigMap,
                "ns",
                json!({"metadata": {"name": "l", "labels": {"x": "a/b"}}}),
            )
            .unwrap_err();
        assert_eq!(e.code, 422);
    }
}
