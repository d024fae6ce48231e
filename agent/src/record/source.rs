//! One capture shared by every recording and stream: a frame is taken from the screen only
//! when DAMAGE says something changed (or the pointer moved or changed shape) since the last
//! one; otherwise every pipeline gets the frame it already has.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use berth_protocol::sync::Locked;
use x11rb::protocol::xfixes::ConnectionExt as _;
use x11rb::protocol::xproto::ConnectionExt as _;

use crate::display::DisplayError;
use crate::display::capture::{self, Cursor, Frame, ShmCapture};
use crate::display::conn::{Target, XConn};
use crate::display::watch::ScreenWatch;

/// A captured screen.
#[derive(Clone)]
pub struct Captured {
    /// Changes whenever the picture may differ from the previous one.
    pub id: u64,
    pub at: Instant,
    pub frame: Arc<Frame>,
}

#[derive(PartialEq, Eq, Clone, Copy)]
struct Key {
    generation: u64,
    screen: (u16, u16),
    cursor: Option<(i32, i32, u32)>,
}

#[derive(Default)]
struct Inner {
    conn: Option<(XConn, ShmCapture)>,
    next_id: u64,
    /// The latest capture without and with the pointer drawn.
    latest: [Option<(Key, Captured)>; 2],
}

pub struct FrameSource {
    target: Target,
    watch: Option<Arc<ScreenWatch>>,
    inner: Mutex<Inner>,
}

impl FrameSource {
    pub fn new(target: Target, watch: Option<Arc<ScreenWatch>>) -> FrameSource {
        FrameSource {
            target,
            watch,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The screen as it is now: a fresh capture if anything changed since the last one, the
    /// same frame (same `id`) otherwise. Reconnects once when the X server went away.
    pub fn latest(&self, with_cursor: bool) -> Result<Captured, DisplayError> {
        let mut inner = self.inner.locked();
        for attempt in 0..2 {
            match self.try_latest(&mut inner, with_cursor) {
                Err(e) if attempt == 0 && is_connection(&e) => {
                    if let Some((_, mut shm)) = inner.conn.take() {
                        shm.forget();
                    }
                }
                other => return other,
            }
        }
        unreachable!("the loop returns on its second attempt")
    }

    fn try_latest(&self, inner: &mut Inner, with_cursor: bool) -> Result<Captured, DisplayError> {
        // The change counter first: a change landing during the capture moves it again, so the
        // next call captures once more.
        let generation = match &self.watch {
            Some(w) if w.connected() => w.generation_now(),
            // Without DAMAGE every call is a change.
            _ => inner.next_id + 1,
        };
        if inner.conn.is_none() {
            inner.conn = Some((XConn::open(&self.target)?, ShmCapture::default()));
        }
        let (g, cursor) = {
            let (x, _) = inner.conn.as_ref().expect("connected above");
            // Both questions in one round trip.
            let geometry = x.conn.get_geometry(x.root)?;
            let cursor_cookie = if with_cursor {
                Some(x.conn.xfixes_get_cursor_image()?)
            } else {
                None
            };
            let g = geometry.reply()?;
            let cursor = match cursor_cookie {
                Some(c) => {
                    let r = c.reply()?;
                    Some(Cursor {
                        x: r.x as i32,
                        y: r.y as i32,
                        xhot: r.xhot as i32,
                        yhot: r.yhot as i32,
                        width: r.width as u32,
                        height: r.height as u32,
                        argb: r.cursor_image,
                        serial: r.cursor_serial,
                    })
                }
                None => None,
            };
            (g, cursor)
        };
        let key = Key {
            generation,
            screen: (g.width, g.height),
            cursor: cursor.as_ref().map(|c| (c.x, c.y, c.serial)),
        };
        let slot = with_cursor as usize;
        if let Some((k, c)) = &inner.latest[slot]
            && *k == key
        {
            return Ok(c.clone());
        }
        // Reuse the previous frame's buffer when no pipeline holds it any more.
        let mut buf = inner.latest[slot]
            .take()
            .and_then(|(_, c)| Arc::try_unwrap(c.frame).ok())
            .map(|f| f.bgrx)
            .unwrap_or_default();
        let at = Instant::now();
        let (x, shm) = inner.conn.as_mut().expect("connected above");
        shm.capture(x, (0, 0, g.width, g.height), &mut buf)?;
        let mut frame = Frame {
            width: g.width as u32,
            height: g.height as u32,
            bgrx: buf,
        };
        if let Some(c) = &cursor {
            capture::composite_cursor(&mut frame, (0, 0), c);
        }
        inner.next_id += 1;
        let captured = Captured {
            id: inner.next_id,
            at,
            frame: Arc::new(frame),
        };
        inner.latest[slot] = Some((key, captured.clone()));
        Ok(captured)
    }

    /// The screen size, asked on the recorder's own connection.
    pub fn screen_size(&self) -> Result<(u32, u32), DisplayError> {
        let mut inner = self.inner.locked();
        for attempt in 0..2 {
            if inner.conn.is_none() {
                inner.conn = Some((XConn::open(&self.target)?, ShmCapture::default()));
            }
            let (x, _) = inner.conn.as_ref().expect("connected above");
            match x.screen_size() {
                Ok((w, h)) => return Ok((w as u32, h as u32)),
                Err(e) if attempt == 0 && is_connection(&e) => {
                    if let Some((_, mut shm)) = inner.conn.take() {
                        shm.forget();
                    }
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns on its second attempt")
    }

    /// Drops the connection and cached frames (no recording or stream is left).
    pub fn idle(&self) {
        let mut inner = self.inner.locked();
        if let Some((x, mut shm)) = inner.conn.take() {
            shm.release(&x);
        }
        inner.latest = [None, None];
    }
}

fn is_connection(e: &DisplayError) -> bool {
    matches!(e, DisplayError::Connection(_) | DisplayError::Connect(_))
}
