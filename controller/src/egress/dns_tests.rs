//! The sandboxes' DNS on loopback, asked as a stub resolver asks (UDP, then TCP for a
//! truncated answer), with the fake book of the proxy's tests: one sandbox that may reach
//! `up.test`, `private.test` by name and 127.0.0.1.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use super::dns::Dns;
use super::proxy::{Hosts, Sandboxes};
use super::tests::{FakeBook, book, hosts};

/// The server on loopback (UDP and TCP on one port) for `book`, with `hosts`.
async fn serve(book: Arc<FakeBook>, hosts: Hosts) -> SocketAddr {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = tcp.local_addr().unwrap();
    let udp = UdpSocket::bind(at).await.unwrap();
    let dns = Dns::new(book as Arc<dyn Sandboxes>, hosts);
    tokio::spawn(dns.clone().serve_udp(udp));
    tokio::spawn(dns.serve_tcp(tcp));
    at
}

fn query(name: &str, t: RecordType) -> Message {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_str(name).unwrap(), t));
    m
}

/// One datagram out, its answer back (or none within a second).
async fn udp(at: SocketAddr, bytes: &[u8]) -> Option<Message> {
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    s.send_to(bytes, at).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(Duration::from_secs(1), s.recv(&mut buf))
        .await
        .ok()?
        .unwrap();
    Some(Message::from_vec(&buf[..n]).unwrap())
}

async fn ask(at: SocketAddr, name: &str, t: RecordType) -> Message {
    udp(at, &query(name, t).to_vec().unwrap())
        .await
        .expect("an answer")
}

fn addresses(m: &Message) -> Vec<IpAddr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn allowed_names_are_answered_and_refused_ones_are_nxdomain_at_once_and_reported() {
    let b = book(false);
    let at = serve(b.clone(), hosts("127.0.0.1".parse().unwrap())).await;
    let a = ask(at, "UP.test.", RecordType::A).await;
    assert_eq!(a.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addresses(&a), ["127.0.0.1".parse::<IpAddr>().unwrap()]);
    assert_eq!(a.answers[0].ttl, 30);
    // The name exists; it has no IPv6 address, nor any other record: NODATA.
    for t in [RecordType::AAAA, RecordType::HTTPS, RecordType::MX] {
        let m = ask(at, "up.test.", t).await;
        assert_eq!(
            (m.metadata.response_code, m.answers.len()),
            (ResponseCode::NoError, 0)
        );
    }
    // Not allowed, and allowed by name but private: NXDOMAIN, reported once for A and AAAA.
    for name in ["evil.test.", "private.test."] {
        for t in [
            RecordType::A,
            RecordType::AAAA,
            RecordType::A,
            RecordType::TXT,
        ] {
            let t0 = std::time::Instant::now();
            let m = ask(at, name, t).await;
            assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name}");
            assert!(t0.elapsed() < Duration::from_secs(1));
            assert_eq!(m.queries.len(), 1);
        }
    }
    assert_eq!(
        *b.notes.lock().unwrap(),
        [
            "name refused evil.test not_allowed",
            "name refused private.test private_address"
        ]
    );
}

#[tokio::test]
async fn strangers_and_malformed_queries_get_no_names() {
    let at = serve(book(true), hosts("127.0.0.1".parse().unwrap())).await;
    let m = ask(at, "up.test.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    assert!(m.answers.is_empty());

    let b = book(false);
    let at = serve(b.clone(), hosts("127.0.0.1".parse().unwrap())).await;
    // Bytes that are no DNS message get no answer, and the server goes on.
    for junk in [&b""[..], b"\x00", &[0xff; 600]] {
        assert!(udp(at, junk).await.is_none());
    }
    let mut two = query("up.test.", RecordType::A);
    two.add_query(Query::query(
        Name::from_str("evil.test.").unwrap(),
        RecordType::A,
    ));
    let m = udp(at, &two.to_vec().unwrap()).await.unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    let mut notify = query("up.test.", RecordType::A);
    notify.metadata.op_code = hickory_proto::op::OpCode::Notify;
    let m = udp(at, &notify.to_vec().unwrap()).await.unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
    let m = ask(at, "up.test.", RecordType::A).await;
    assert_eq!(addresses(&m).len(), 1);
    assert!(b.notes.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_long_answer_is_truncated_over_udp_and_whole_over_tcp() {
    let many: Vec<IpAddr> = (1..=60).map(|i| IpAddr::from([93, 184, 0, i])).collect();
    let hosts = Hosts::from([("up.test".to_string(), many.clone())]);
    let at = serve(book(false), hosts).await;
    let m = ask(at, "up.test.", RecordType::A).await;
    assert!(m.metadata.truncation);
    assert!(m.to_vec().unwrap().len() <= 512);
    assert!(!m.answers.is_empty() && m.answers.len() < 60);

    let mut s = TcpStream::connect(at).await.unwrap();
    for _ in 0..2 {
        let q = query("up.test.", RecordType::A).to_vec().unwrap();
        s.write_all(&(q.len() as u16).to_be_bytes()).await.unwrap();
        s.write_all(&q).await.unwrap();
        let len = s.read_u16().await.unwrap();
        let mut buf = vec![0u8; usize::from(len)];
        s.read_exact(&mut buf).await.unwrap();
        let m = Message::from_vec(&buf).unwrap();
        assert!(!m.metadata.truncation);
        assert_eq!(addresses(&m), many);
    }
}
