//! The CLIPBOARD selection as text. Reading asks its owner to convert it to UTF-8 on a short
//! connection of its own (INCR transfers included); writing makes the agent the owner, with a
//! thread that answers requests until another client takes the clipboard.

use std::time::{Duration, Instant};

use x11rb::connection::{Connection, RequestConnection as _};
use x11rb::protocol::Event;
use x11rb::protocol::xproto::{
    AtomEnum, ConnectionExt as _, EventMask, PropMode, SelectionNotifyEvent,
};
use x11rb::wrapper::ConnectionExt as _;

use super::DisplayError;
use super::conn::{Target, XConn};

const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest clipboard text handled.
pub const MAX_TEXT: usize = 16 << 20;

/// Waits (bounded) for the next event `pick` accepts.
fn wait_for<T>(
    x: &XConn,
    deadline: Instant,
    mut pick: impl FnMut(Event) -> Option<T>,
) -> Result<T, DisplayError> {
    use std::os::fd::AsRawFd;
    loop {
        while let Some(ev) = x.conn.poll_for_event()? {
            if let Some(v) = pick(ev) {
                return Ok(v);
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(DisplayError::Request(
                "the clipboard owner did not answer in time".into(),
            ));
        }
        let mut pfd = libc::pollfd {
            fd: x.conn.stream().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(100) as i32) };
    }
}

/// The clipboard's text, or `None` when nobody owns the clipboard.
pub fn get(target: &Target) -> Result<Option<String>, DisplayError> {
    let x = XConn::open(target)?;
    let owner = x
        .conn
        .get_selection_owner(x.atoms.CLIPBOARD)?
        .reply()?
        .owner;
    if owner == 0 {
        return Ok(None);
    }
    let w = x.helper_window()?;
    let prop = x.atoms.BERTH_SELECTION;
    x.conn
        .convert_selection(w, x.atoms.CLIPBOARD, x.atoms.UTF8_STRING, prop, 0u32)?;
    x.conn.flush()?;
    let deadline = Instant::now() + TIMEOUT;
    let notify = wait_for(&x, deadline, |ev| match ev {
        Event::SelectionNotify(n) if n.requestor == w => Some(n),
        _ => None,
    })?;
    if notify.property == 0 {
        // The owner cannot give text.
        return Ok(Some(String::new()));
    }
    let first = x
        .conn
        .get_property(true, w, prop, AtomEnum::ANY, 0, (MAX_TEXT / 4) as u32)?
        .reply()?;
    let bytes = if first.type_ == x.atoms.INCR {
        // Incremental: each new property value is the next chunk; an empty one ends it.
        let mut out = Vec::new();
        loop {
            wait_for(&x, deadline + TIMEOUT, |ev| match ev {
                Event::PropertyNotify(p)
                    if p.window == w
                        && p.atom == prop
                        && p.state == x11rb::protocol::xproto::Property::NEW_VALUE =>
                {
                    Some(())
                }
                _ => None,
            })?;
            let chunk = x
                .conn
                .get_property(true, w, prop, AtomEnum::ANY, 0, (MAX_TEXT / 4) as u32)?
                .reply()?;
            if chunk.value.is_empty() {
                break;
            }
            out.extend_from_slice(&chunk.value);
            if out.len() > MAX_TEXT {
                return Err(DisplayError::Invalid(
                    "the clipboard holds more than 16 MiB".into(),
                ));
            }
        }
        out
    } else {
        first.value
    };
    let _ = x.conn.destroy_window(w);
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// The agent owning the clipboard with some text; dropping it lets the serving thread end.
pub struct Owner {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Owner {
    pub fn start(target: &Target, text: String) -> Result<Owner, DisplayError> {
        if text.len() > MAX_TEXT {
            return Err(DisplayError::Invalid(
                "clipboard text is at most 16 MiB".into(),
            ));
        }
        let x = XConn::open(target)?;
        let max_request = x.conn.maximum_request_bytes();
        if text.len() + 1024 > max_request {
            return Err(DisplayError::Invalid(format!(
                "clipboard text is at most {} bytes on this display",
                max_request - 1024
            )));
        }
        let w = x.helper_window()?;
        x.conn.set_selection_owner(w, x.atoms.CLIPBOARD, 0u32)?;
        let owner = x
            .conn
            .get_selection_owner(x.atoms.CLIPBOARD)?
            .reply()?
            .owner;
        if owner != w {
            return Err(DisplayError::Request("could not take the clipboard".into()));
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("berth-clipboard".into())
            .spawn(move || serve(x, w, text.into_bytes(), flag))
            .map_err(|e| DisplayError::Request(format!("clipboard thread: {e}")))?;
        Ok(Owner { stop })
    }
}

/// Answers SelectionRequests until another client takes the clipboard or the owner is dropped.
fn serve(x: XConn, w: u32, data: Vec<u8>, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let a = &x.atoms;
    let targets = [
        a.TARGETS,
        a.UTF8_STRING,
        u32::from(AtomEnum::STRING),
        a.TEXT,
    ];
    loop {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = x.conn.set_selection_owner(0u32, a.CLIPBOARD, 0u32);
            let _ = x.conn.flush();
            return;
        }
        let ev = match wait_for(&x, Instant::now() + Duration::from_millis(500), Some) {
            Ok(ev) => ev,
            Err(DisplayError::Request(_)) => continue, // quiet: check the stop flag again
            Err(_) => return,
        };
        match ev {
            Event::SelectionClear(c) if c.owner == w => return,
            Event::SelectionRequest(r) if r.owner == w => {
                let property = if r.property == 0 {
                    r.target
                } else {
                    r.property
                };
                let answered = if r.target == a.TARGETS {
                    x.conn
                        .change_property32(
                            PropMode::REPLACE,
                            r.requestor,
                            property,
                            AtomEnum::ATOM,
                            &targets,
                        )
                        .is_ok()
                } else if targets[1..].contains(&r.target) {
                    x.conn
                        .change_property8(PropMode::REPLACE, r.requestor, property, r.target, &data)
                        .is_ok()
                } else {
                    false
                };
                let reply = SelectionNotifyEvent {
                    response_type: x11rb::protocol::xproto::SELECTION_NOTIFY_EVENT,
                    sequence: 0,
                    time: r.time,
                    requestor: r.requestor,
                    selection: r.selection,
                    target: r.target,
                    property: if answered { property } else { 0 },
                };
                let _ = x
                    .conn
                    .send_event(false, r.requestor, EventMask::NO_EVENT, reply);
                let _ = x.conn.flush();
            }
            _ => {}
        }
    }
}
