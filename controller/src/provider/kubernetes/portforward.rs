//! Reaching agents from outside the cluster: a loopback listener per sandbox port whose every
//! connection is carried through the API server's port-forward to the Pod (`pods/portforward`,
//! WebSocket). The listeners live as long as the provider knows the sandbox.

use std::net::SocketAddr;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

/// A listening forward; dropping it stops accepting (connections in flight finish).
pub struct Forward {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Listens on 127.0.0.1 (a port the system picks) and forwards each connection to `port` of
/// the Pod `pod`.
pub async fn listen(api: Api<Pod>, pod: String, port: u16) -> std::io::Result<Forward> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let (mut conn, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "port-forward listener failed");
                    return;
                }
            };
            let api = api.clone();
            let pod = pod.clone();
            tokio::spawn(async move {
                let _ = conn.set_nodelay(true);
                if let Err(e) = carry(&api, &pod, port, &mut conn).await {
                    tracing::debug!(%pod, port, %peer, error = %e, "port-forward connection ended");
                }
            });
        }
    });
    Ok(Forward { addr, task })
}

async fn carry(
    api: &Api<Pod>,
    pod: &str,
    port: u16,
    conn: &mut tokio::net::TcpStream,
) -> anyhow::Result<()> {
    let mut forwarder = api.portforward(pod, &[port]).await?;
    let mut upstream = forwarder
        .take_stream(port)
        .ok_or_else(|| anyhow::anyhow!("the port-forward has no stream for {port}"))?;
    let errors = forwarder.take_error(port);
    let copied = tokio::io::copy_bidirectional(conn, &mut upstream).await;
    drop(upstream);
    if let Some(errors) = errors
        && let Ok(Some(e)) =
            tokio::time::timeout(std::time::Duration::from_millis(200), errors).await
    {
        anyhow::bail!("the kubelet said: {e}");
    }
    forwarder.abort();
    copied?;
    Ok(())
}
