//! noVNC's WebSocket relayed to the VNC server's private Unix socket, binary frames both ways
//! with back-pressure (each direction waits for its writes). Who may send input is decided
//! here, not by the page: the relay reads the RFB client's message stream and drops key,
//! pointer, clipboard, resize and power messages before they reach the server, for a
//! view-only viewer always, and for every other viewer while a person who is not them holds
//! the controls (asked per message, so taking the controls silences open connections).

use std::path::Path;

use axum::extract::ws::{Message, WebSocket};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest client message the filter buffers (a cut text past this ends the session).
const MAX_CLIENT_MESSAGE: usize = 16 << 20;

pub async fn relay(
    ws: WebSocket,
    socket: &Path,
    view_only: bool,
    may_send_input: impl Fn() -> bool + Send,
) {
    let vnc = match tokio::net::UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "VNC relay: cannot reach the VNC server");
            let mut ws = ws;
            let _ = ws.send(Message::Close(None)).await;
            return;
        }
    };
    let (mut vnc_read, mut vnc_write) = vnc.into_split();
    let (mut ws_tx, mut ws_rx) = ws.split();
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match vnc_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if ws_tx
                        .send(Message::Binary(bytes::Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        let _ = ws_tx.send(Message::Close(None)).await;
    };
    let up = async move {
        let mut filter = ClientFilter::default();
        while let Some(Ok(msg)) = ws_rx.next().await {
            let data = match msg {
                Message::Binary(b) => b,
                // noVNC speaks binary; text frames carry nothing for RFB.
                Message::Text(t) => bytes::Bytes::copy_from_slice(t.as_str().as_bytes()),
                Message::Close(_) => break,
                _ => continue,
            };
            let input = !view_only && may_send_input();
            let out = match filter.feed(&data, input) {
                Ok(out) => out,
                Err(e) => {
                    tracing::info!(reason = %e, "VNC relay: closing a viewer");
                    break;
                }
            };
            if !out.is_empty() && vnc_write.write_all(&out).await.is_err() {
                break;
            }
        }
        let _ = vnc_write.shutdown().await;
    };
    tokio::select! {
        _ = down => {}
        _ = up => {}
    }
}

#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    #[default]
    Version,
    Security,
    Init,
    Messages,
}

/// The client-to-server half of RFB, parsed only as far as needed to pass the handshake and
/// view requests and to drop input when the viewer may not send it.
#[derive(Default)]
pub struct ClientFilter {
    phase: Phase,
    buf: Vec<u8>,
}

impl ClientFilter {
    /// Takes the client's next bytes; returns what may go on to the server (input only when
    /// `input` allows it).
    pub fn feed(&mut self, data: &[u8], input: bool) -> Result<Vec<u8>, String> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            let need = match self.phase {
                Phase::Version => 12,
                Phase::Security | Phase::Init => 1,
                Phase::Messages => match message_len(&self.buf)? {
                    Some(n) => n,
                    None => break,
                },
            };
            if need > MAX_CLIENT_MESSAGE {
                return Err(format!("a client message of {need} bytes"));
            }
            if self.buf.len() < need {
                break;
            }
            let msg: Vec<u8> = self.buf.drain(..need).collect();
            match self.phase {
                Phase::Version => {
                    if !msg.starts_with(b"RFB 003.") {
                        return Err("not an RFB client".into());
                    }
                    // 3.3 has the server choose the security type: no byte from the client.
                    self.phase = if &msg == b"RFB 003.003\n" {
                        Phase::Init
                    } else {
                        Phase::Security
                    };
                    out.extend_from_slice(&msg);
                }
                Phase::Security => {
                    // The server offers only None; anything else would add bytes this
                    // parser does not expect.
                    if msg[0] != 1 {
                        return Err(format!("security type {} chosen", msg[0]));
                    }
                    self.phase = Phase::Init;
                    out.extend_from_slice(&msg);
                }
                Phase::Init => {
                    self.phase = Phase::Messages;
                    out.extend_from_slice(&msg);
                }
                Phase::Messages => {
                    // A cut text past the clipboard's bound is dropped, not pasted.
                    let too_big =
                        msg[0] == 6 && msg.len() > 8 + berth_protocol::control::MAX_CLIPBOARD_BYTES;
                    if (input && !too_big) || passes(msg[0]) {
                        out.extend_from_slice(&msg);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Messages a viewer that only watches may send: pixel format, encodings, update requests,
/// continuous updates, fences.
fn passes(kind: u8) -> bool {
    matches!(kind, 0 | 2 | 3 | 150 | 248)
}

/// The length of the message at the start of `b`, `None` while too little has arrived to tell.
fn message_len(b: &[u8]) -> Result<Option<usize>, String> {
    let Some(&kind) = b.first() else {
        return Ok(None);
    };
    let at = |n: usize| b.len() >= n;
    Ok(match kind {
        0 => Some(20), // SetPixelFormat
        2 => at(4).then(|| 4 + 4 * u16::from_be_bytes([b[2], b[3]]) as usize), // SetEncodings
        3 => Some(10), // FramebufferUpdateRequest
        4 => Some(8),  // KeyEvent
        5 => Some(6),  // PointerEvent
        6 => at(8).then(|| {
            // ClientCutText; a negative length is the extended clipboard's.
            let len = i32::from_be_bytes([b[4], b[5], b[6], b[7]]).unsigned_abs() as usize;
            8 + len
        }),
        150 => Some(10),                              // EnableContinuousUpdates
        248 => at(9).then(|| 9 + b[8] as usize),      // ClientFence
        250 => Some(4),                               // xvp (power actions)
        251 => at(8).then(|| 8 + 16 * b[6] as usize), // SetDesktopSize
        253 => at(4).then(|| 4 + u16::from_be_bytes([b[2], b[3]]) as usize), // gii
        255 => match b.get(1) {
            None => None,
            Some(0) => Some(12), // QEMU extended key event
            Some(other) => return Err(format!("QEMU client message {other}")),
        },
        other => return Err(format!("unknown client message type {other}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handshake(f: &mut ClientFilter) {
        let out = f.feed(b"RFB 003.008\n", false).unwrap();
        assert_eq!(out, b"RFB 003.008\n");
        assert_eq!(f.feed(&[1], false).unwrap(), [1]);
        assert_eq!(f.feed(&[1], false).unwrap(), [1]);
    }

    #[test]
    fn view_requests_pass_and_input_is_dropped() {
        let mut f = ClientFilter::default();
        handshake(&mut f);
        let update = [3u8, 0, 0, 0, 0, 0, 7, 128, 4, 56];
        let pointer = [5u8, 1, 0, 10, 0, 20];
        let key = [4u8, 1, 0, 0, 0, 0, 0, 0x61];
        let mut encodings = vec![2u8, 0, 0, 2];
        encodings.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1]);
        let mut cut = vec![6u8, 0, 0, 0, 0, 0, 0, 3];
        cut.extend_from_slice(b"abc");
        let mut all = Vec::new();
        for m in [&update[..], &pointer, &key, &encodings, &cut, &update] {
            all.extend_from_slice(m);
        }
        // Fed one byte at a time: the split points must not matter.
        let mut out = Vec::new();
        for b in &all {
            out.extend(f.feed(std::slice::from_ref(b), false).unwrap());
        }
        let mut want = update.to_vec();
        want.extend_from_slice(&encodings);
        want.extend_from_slice(&update);
        assert_eq!(out, want);
    }

    #[test]
    fn resize_power_and_qemu_keys_are_dropped_unknown_messages_end_it() {
        let mut f = ClientFilter::default();
        handshake(&mut f);
        let mut resize = vec![251u8, 0, 0x07, 0x80, 0x04, 0x38, 1, 0];
        resize.extend_from_slice(&[0u8; 16]);
        assert!(f.feed(&resize, false).unwrap().is_empty());
        assert!(f.feed(&[250, 0, 1, 2], false).unwrap().is_empty());
        assert!(
            f.feed(&[255, 0, 0, 1, 0, 0, 0, 0x61, 0, 0, 0, 30], false)
                .unwrap()
                .is_empty()
        );
        assert!(f.feed(&[99], false).is_err());
    }

    #[test]
    fn a_viewer_allowed_input_passes_it_and_loses_it_when_control_is_taken() {
        let mut f = ClientFilter::default();
        let out = f.feed(b"RFB 003.008\n", true).unwrap();
        assert_eq!(out, b"RFB 003.008\n");
        f.feed(&[1], true).unwrap();
        f.feed(&[1], true).unwrap();
        let key = [4u8, 1, 0, 0, 0, 0, 0, 0x61];
        assert_eq!(f.feed(&key, true).unwrap(), key);
        assert!(f.feed(&key, false).unwrap().is_empty());
        assert_eq!(f.feed(&key, true).unwrap(), key);
    }

    #[test]
    fn rfb_3_3_has_no_security_byte() {
        let mut f = ClientFilter::default();
        f.feed(b"RFB 003.003\n", false).unwrap();
        assert_eq!(f.feed(&[1], false).unwrap(), [1]); // ClientInit
        assert!(f.feed(&[5, 0, 0, 1, 0, 1], false).unwrap().is_empty());
    }
}
