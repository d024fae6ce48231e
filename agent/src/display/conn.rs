//! Connections to the X server: who to connect to, with what credentials, and the atoms and
//! screen facts every part of the display domain needs.

use std::sync::Arc;

use x11rb::connection::{Connection, RequestConnection as _};
use x11rb::protocol::xproto::{Atom, ConnectionExt as _, Window};
use x11rb::rust_connection::RustConnection;

use berth_protocol::sync::Locked;
use x11rb::reexports::x11rb_protocol::parse_display;
use x11rb::rust_connection::DefaultStream;

use super::DisplayError;
use super::xauth::{Cookie, MIT_MAGIC_COOKIE_1};

/// Where the X server is: `:N` (or `host:N`), and the cookie it wants when the agent runs
/// the desktop (otherwise credentials come from XAUTHORITY, as for any X client).
#[derive(Debug, Clone)]
pub struct Target {
    pub display: String,
    pub cookie: Option<Cookie>,
}

impl Target {
    pub fn new(display: impl Into<String>, cookie: Option<Cookie>) -> Target {
        Target {
            display: display.into(),
            cookie,
        }
    }

    /// A connection and its screen number.
    pub fn connect(&self) -> Result<(RustConnection, usize), String> {
        let Some(cookie) = &self.cookie else {
            return RustConnection::connect(Some(&self.display)).map_err(|e| e.to_string());
        };
        let parsed =
            parse_display::parse_display(Some(&self.display)).map_err(|e| e.to_string())?;
        let screen = usize::from(parsed.screen);
        let mut last = String::from("no address to connect to");
        for addr in parsed.connect_instruction() {
            match DefaultStream::connect(&addr) {
                Ok((stream, _)) => {
                    return RustConnection::connect_to_stream_with_auth_info(
                        stream,
                        screen,
                        MIT_MAGIC_COOKIE_1.to_vec(),
                        cookie.0.to_vec(),
                    )
                    .map(|c| (c, screen))
                    .map_err(|e| e.to_string());
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
    }
}

/// A connection made when first needed and made again when it breaks: a call that fails on a
/// broken connection is tried once more on a new one (the X server may have restarted).
pub struct Reconnecting<S> {
    slot: std::sync::Mutex<Option<S>>,
}

impl<S> Default for Reconnecting<S> {
    fn default() -> Self {
        Reconnecting {
            slot: std::sync::Mutex::new(None),
        }
    }
}

impl<S> Reconnecting<S> {
    /// Runs `f` on the session if one is open (never connects).
    pub fn if_open<T>(&self, f: impl FnOnce(&mut S) -> T) -> Option<T> {
        let mut slot = self.slot.locked();
        slot.as_mut().map(f)
    }

    /// Runs `f` on the session (`open` makes one when there is none); `after` runs on the
    /// session after each call, and `forget` on a session given up as broken.
    pub fn with<T>(
        &self,
        open: impl Fn() -> Result<S, DisplayError>,
        mut f: impl FnMut(&mut S) -> Result<T, DisplayError>,
        after: impl Fn(&mut S),
        forget: impl Fn(S),
    ) -> Result<T, DisplayError> {
        let mut slot = self.slot.locked();
        let mut attempt = 0;
        loop {
            let session = match slot.as_mut() {
                Some(s) => s,
                None => slot.insert(open()?),
            };
            let result = f(session);
            after(session);
            match result {
                Err(e) if e.is_connection() && attempt == 0 => {
                    attempt += 1;
                    if let Some(s) = slot.take() {
                        forget(s);
                    }
                }
                other => return other,
            }
        }
    }
}

/// One open connection and what it found at connect time.
pub struct XConn {
    pub conn: Arc<RustConnection>,
    pub root: Window,
    pub root_depth: u8,
    /// Bits per pixel of ZPixmap images at the root depth.
    pub bits_per_pixel: u8,
    pub atoms: Atoms,
}

x11rb::atom_manager! {
    /// Atoms the display domain uses.
    pub Atoms: AtomsCookie {
        _NET_CLIENT_LIST,
        _NET_ACTIVE_WINDOW,
        _NET_CLOSE_WINDOW,
        _NET_WM_NAME,
        _NET_WM_DESKTOP,
        _NET_SUPPORTING_WM_CHECK,
        _NET_WM_STATE,
        _NET_WM_STATE_MAXIMIZED_VERT,
        _NET_WM_STATE_MAXIMIZED_HORZ,
        _NET_WM_WINDOW_TYPE,
        _NET_WM_WINDOW_TYPE_DIALOG,
        WM_CLASS,
        WM_NAME,
        WM_CLIENT_MACHINE,
        UTF8_STRING,
        CLIPBOARD,
        TARGETS,
        TEXT,
        INCR,
        BERTH_SELECTION,
    }
}

impl XConn {
    pub fn open(target: &Target) -> Result<XConn, DisplayError> {
        let (conn, screen_num) = target.connect().map_err(DisplayError::Connect)?;
        let setup = conn.setup();
        let screen = setup
            .roots
            .get(screen_num)
            .ok_or_else(|| DisplayError::Connect("the display has no such screen".into()))?;
        let root = screen.root;
        let root_depth = screen.root_depth;
        let bits_per_pixel = setup
            .pixmap_formats
            .iter()
            .find(|f| f.depth == root_depth)
            .map(|f| f.bits_per_pixel)
            .unwrap_or(32);
        // XFIXES answers nothing before its version handshake.
        if conn
            .extension_information(x11rb::protocol::xfixes::X11_EXTENSION_NAME)
            .ok()
            .flatten()
            .is_some()
        {
            use x11rb::protocol::xfixes::ConnectionExt as _;
            conn.xfixes_query_version(5, 0)
                .map_err(DisplayError::from)?
                .reply()
                .map_err(DisplayError::from)?;
        }
        let atoms = Atoms::new(&conn)
            .map_err(DisplayError::from)?
            .reply()
            .map_err(DisplayError::from)?;
        Ok(XConn {
            conn: Arc::new(conn),
            root,
            root_depth,
            bits_per_pixel,
            atoms,
        })
    }

    /// The root window's current size (it changes with RandR).
    pub fn screen_size(&self) -> Result<(u16, u16), DisplayError> {
        let g = self.conn.get_geometry(self.root)?.reply()?;
        Ok((g.width, g.height))
    }

    /// A window of the agent's own: 1x1, input-only, never mapped, reporting property changes
    /// (for selections and for reading the server's time).
    pub fn helper_window(&self) -> Result<Window, DisplayError> {
        use x11rb::protocol::xproto::{CreateWindowAux, EventMask, WindowClass};
        let w = self.conn.generate_id()?;
        self.conn.create_window(
            0,
            w,
            self.root,
            0,
            0,
            1,
            1,
            0,
            WindowClass::INPUT_ONLY,
            0,
            &CreateWindowAux::new().event_mask(EventMask::PROPERTY_CHANGE),
        )?;
        Ok(w)
    }

    /// A round trip: everything sent before has been processed by the server.
    pub fn sync(&self) -> Result<(), DisplayError> {
        self.conn.get_input_focus()?.reply()?;
        Ok(())
    }

    pub fn atom_name(&self, atom: Atom) -> String {
        self.conn
            .get_atom_name(atom)
            .ok()
            .and_then(|c| c.reply().ok())
            .map(|r| String::from_utf8_lossy(&r.name).into_owned())
            .unwrap_or_default()
    }
}
