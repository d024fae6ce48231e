//! The DNS of sandboxes behind the egress proxy: names their policy allows are answered with
//! the addresses the proxy would connect to (the config's `[egress.hosts]` first, then the
//! controller's own resolver, each address held to the policy); every other name is answered
//! NXDOMAIN at once, and an `egress.denied` event names it. Served over UDP and TCP beside the
//! proxy, on the internal network's gateway; a client is told apart by its address, as the
//! proxy tells them apart.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_protocol::egress::{self, Denial, Egress, HostVerdict};
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use super::proxy::{Hosts, Sandboxes, accept_each, resolve};

/// How long an answer may be cached. Short: the addresses only matter to programs that look
/// before they go through the proxy.
const TTL: u32 = 30;
/// Queries answered at once; more are dropped (the client asks again).
const IN_FLIGHT: usize = 256;
/// A TCP client's time to send a query, and to read its answer.
const TCP_TIMEOUT: Duration = Duration::from_secs(10);
/// A refused name is reported once per sandbox in this window (a lookup asks for A and AAAA,
/// and resolvers ask again).
const REPORT_WINDOW: Duration = Duration::from_secs(10);
/// Names remembered for that; past this many the memory starts afresh.
const REPORTED: usize = 4096;
/// The answer size a client without EDNS accepts over UDP.
const UDP_PLAIN: usize = 512;

/// What a query asks: its one question's name and type.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    pub name: Name,
    pub qtype: RecordType,
}

/// The question of a query, or why it gets none answered (`FORMERR`, `NOTIMP`, `REFUSED`).
pub fn question(query: &Message) -> Result<Question, ResponseCode> {
    if query.metadata.op_code != OpCode::Query {
        return Err(ResponseCode::NotImp);
    }
    let [q] = query.queries.as_slice() else {
        return Err(ResponseCode::FormErr);
    };
    if q.query_class != DNSClass::IN {
        return Err(ResponseCode::Refused);
    }
    Ok(Question {
        name: q.name.clone(),
        qtype: q.query_type,
    })
}

/// The answer to `query`: the addresses of its type among `verdict`'s (none is NODATA), or
/// NXDOMAIN for a name refused. Cut to `limit` bytes with the truncation bit set, as a UDP
/// client then asks again over TCP.
pub fn answer(
    query: &Message,
    q: &Question,
    verdict: &Result<Vec<IpAddr>, Denial>,
    limit: usize,
) -> Vec<u8> {
    let mut m = reply(query, ResponseCode::NoError);
    m.queries = query.queries.clone();
    match verdict {
        Err(_) => m.metadata.response_code = ResponseCode::NXDomain,
        Ok(addrs) => {
            for ip in addrs {
                let data = match (q.qtype, ip) {
                    (RecordType::A, IpAddr::V4(_)) | (RecordType::AAAA, IpAddr::V6(_)) => {
                        RData::from(*ip)
                    }
                    _ => continue,
                };
                m.answers
                    .push(Record::from_rdata(q.name.clone(), TTL, data));
            }
        }
    }
    encode(m, limit)
}

/// An answer with no records and `code` (to a query that could not be read, or not be
/// answered).
pub fn refusal(query: &Message, code: ResponseCode) -> Vec<u8> {
    let mut m = reply(query, code);
    if code != ResponseCode::FormErr {
        m.queries = query.queries.clone();
    }
    encode(m, UDP_PLAIN)
}

fn reply(query: &Message, code: ResponseCode) -> Message {
    let mut m = Message::error_msg(query.metadata.id, query.metadata.op_code, code);
    m.metadata.recursion_desired = query.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    if let Some(e) = &query.edns {
        let mut edns = hickory_proto::op::Edns::new();
        edns.set_max_payload(e.max_payload().max(UDP_PLAIN as u16));
        m.edns = Some(edns);
    }
    m
}

fn encode(mut m: Message, limit: usize) -> Vec<u8> {
    loop {
        let bytes = m.to_vec().unwrap_or_default();
        if bytes.len() <= limit || m.answers.is_empty() {
            return bytes;
        }
        m.answers.pop();
        m.metadata.truncation = true;
    }
}

/// The DNS server of the sandboxes a [`Sandboxes`] book knows.
pub struct Dns {
    sandboxes: Arc<dyn Sandboxes>,
    hosts: Hosts,
    slots: Arc<tokio::sync::Semaphore>,
    /// When each (sandbox, name) refused was last reported.
    reported: Mutex<HashMap<(String, String), Instant>>,
}

impl Dns {
    pub fn new(sandboxes: Arc<dyn Sandboxes>, hosts: Hosts) -> Arc<Dns> {
        Arc::new(Dns {
            sandboxes,
            hosts: super::proxy::normalised(hosts),
            slots: Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT)),
            reported: Mutex::new(HashMap::new()),
        })
    }

    /// The answer to the datagram `bytes` from `peer`, if it gets one (a client the book does
    /// not know gets REFUSED; bytes that are no DNS message get nothing).
    pub async fn respond(
        &self,
        bytes: &[u8],
        peer: IpAddr,
        limit: Option<usize>,
    ) -> Option<Vec<u8>> {
        let query = Message::from_vec(bytes).ok()?;
        // An answer is never answered (no loop between two servers).
        if query.metadata.message_type == MessageType::Response {
            return None;
        }
        let q = match question(&query) {
            Ok(q) => q,
            Err(code) => return Some(refusal(&query, code)),
        };
        let Some((sandbox, policy)) = self.sandboxes.lookup(peer) else {
            return Some(refusal(&query, ResponseCode::Refused));
        };
        let verdict = self.verdict(&policy, &q).await;
        if let Err(reason) = verdict {
            self.report(&sandbox, &q, reason);
        }
        let limit = limit.unwrap_or_else(|| match &query.edns {
            Some(e) => usize::from(e.max_payload()).max(UDP_PLAIN),
            None => UDP_PLAIN,
        });
        Some(answer(&query, &q, &verdict, limit))
    }

    /// The addresses `policy` lets the sandbox reach under the question's name.
    async fn verdict(&self, policy: &Egress, q: &Question) -> Result<Vec<IpAddr>, Denial> {
        let name = q.name.to_ascii();
        let name = egress::normalise(&name);
        match egress::host_verdict(policy, &name) {
            HostVerdict::Deny(d) => Err(d),
            HostVerdict::Connect(ip) => Ok(vec![ip]),
            HostVerdict::Resolve => {
                let addrs = resolve(&self.hosts, &name)
                    .await
                    .map_err(|_| Denial::Unresolved)?;
                egress::reachable(policy, &addrs)
            }
        }
    }

    /// An `egress.denied` event for a name refused by the policy (not for a name that does
    /// not exist), once per sandbox and name in [`REPORT_WINDOW`].
    fn report(&self, sandbox: &str, q: &Question, reason: Denial) {
        if reason == Denial::Unresolved || !matches!(q.qtype, RecordType::A | RecordType::AAAA) {
            return;
        }
        let name = egress::normalise(&q.name.to_ascii());
        let now = Instant::now();
        {
            let mut seen = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            if seen.len() >= REPORTED {
                seen.clear();
            }
            let key = (sandbox.to_string(), name.clone());
            if seen
                .get(&key)
                .is_some_and(|t| now.duration_since(*t) < REPORT_WINDOW)
            {
                return;
            }
            seen.insert(key, now);
        }
        self.sandboxes.name_refused(sandbox, &name, reason);
    }

    /// Serves UDP and TCP on `at` (both bound, or neither serves) until the runtime ends.
    pub async fn listen(self: Arc<Self>, at: SocketAddr) -> std::io::Result<()> {
        let udp = UdpSocket::bind(at).await?;
        let tcp = TcpListener::bind(at).await?;
        tokio::spawn(self.clone().serve_udp(udp));
        tokio::spawn(self.serve_tcp(tcp));
        Ok(())
    }

    /// Answers datagrams on `socket` until the task is dropped.
    pub async fn serve_udp(self: Arc<Self>, socket: UdpSocket) {
        let socket = Arc::new(socket);
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, peer) = match socket.recv_from(&mut buf).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(error = %e, "egress DNS: receive failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                continue;
            };
            let (me, socket, bytes) = (self.clone(), socket.clone(), buf[..n].to_vec());
            tokio::spawn(async move {
                let _permit = permit;
                if let Some(a) = me.respond(&bytes, peer.ip(), None).await {
                    let _ = socket.send_to(&a, peer).await;
                }
            });
        }
    }

    /// Answers connections on `listener` until the task is dropped.
    pub async fn serve_tcp(self: Arc<Self>, listener: TcpListener) {
        let slots = self.slots.clone();
        accept_each(listener, slots, "egress DNS", move |stream, peer| {
            let me = self.clone();
            async move {
                let _ = tokio::time::timeout(TCP_TIMEOUT, me.tcp(stream, peer)).await;
            }
        })
        .await
    }

    /// One TCP connection: length-prefixed queries, each answered, until the client stops.
    async fn tcp(&self, mut s: TcpStream, peer: SocketAddr) -> std::io::Result<()> {
        loop {
            let len = match s.read_u16().await {
                Ok(l) => usize::from(l),
                Err(_) => return Ok(()),
            };
            let mut bytes = vec![0u8; len];
            s.read_exact(&mut bytes).await?;
            let Some(a) = self
                .respond(&bytes, peer.ip(), Some(usize::from(u16::MAX)))
                .await
            else {
                return Ok(());
            };
            let mut out = (a.len() as u16).to_be_bytes().to_vec();
            out.extend_from_slice(&a);
            s.write_all(&out).await?;
        }
    }
}
