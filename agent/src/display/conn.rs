//! Connections to the X server: who to connect to, with what credentials, and the atoms and
//! screen facts every part of the display domain needs.

use std::sync::Arc;

use x11rb::connection::{Connection, RequestConnection as _};
use x11rb::protocol::xproto::{Atom, ConnectionExt as _, Window};
use x11rb::rust_connection::RustConnection;

use super::DisplayError;

/// Where the X server is: `:N` (or `host:N`).
#[derive(Debug, Clone)]
pub struct Target {
    pub display: String,
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
        // Credentials come from XAUTHORITY (or ~/.Xauthority), as for any X client.
        let (conn, screen_num) = RustConnection::connect(Some(&target.display))
            .map_err(|e| DisplayError::Connect(e.to_string()))?;
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
