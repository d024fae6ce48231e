//! Top-level windows through EWMH, in-process: the window manager's client list, titles,
//! classes and geometry, and activate/close requests — what OSWorld does by running `wmctrl`.

use x11rb::connection::Connection;
use x11rb::protocol::xproto::{
    AtomEnum, ClientMessageEvent, ConnectionExt as _, EventMask, Window,
};
use x11rb::wrapper::ConnectionExt as _;

use super::DisplayError;
use super::conn::XConn;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WindowInfo {
    pub id: u32,
    pub title: String,
    /// WM_CLASS instance and class names.
    pub instance: String,
    pub class: String,
    pub x: i32,
    pub y: i32,
    pub width: u32,
    pub height: u32,
    /// EWMH desktop number (-1 = all desktops).
    pub desktop: i64,
    pub machine: String,
}

impl WindowInfo {
    /// The line `wmctrl -l` prints for this window.
    pub fn wmctrl_line(&self) -> String {
        format!(
            "0x{:08x} {:>2} {} {}",
            self.id, self.desktop, self.machine, self.title
        )
    }
}

/// How wmctrl picks a window: `-F` makes the match exact and case-sensitive, `-x` matches
/// `instance.class` instead of the title.
#[derive(Debug, Clone, Copy, Default)]
pub struct Match {
    pub strict: bool,
    pub by_class: bool,
}

impl Match {
    pub fn matches(self, w: &WindowInfo, name: &str) -> bool {
        let subject = if self.by_class {
            format!("{}.{}", w.instance, w.class)
        } else {
            w.title.clone()
        };
        if self.strict {
            subject == name
        } else {
            subject.to_lowercase().contains(&name.to_lowercase())
        }
    }
}

/// The windows the window manager manages, in its stacking-independent client order.
pub fn list(x: &XConn) -> Result<Vec<WindowInfo>, DisplayError> {
    let reply = x
        .conn
        .get_property(
            false,
            x.root,
            x.atoms._NET_CLIENT_LIST,
            AtomEnum::WINDOW,
            0,
            u32::MAX / 4,
        )?
        .reply()?;
    let Some(ids) = reply.value32() else {
        return Err(DisplayError::NoWindowManager);
    };
    let ids: Vec<Window> = ids.collect();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        // A window may vanish between the list and our questions: skip it.
        if let Ok(w) = info(x, id) {
            out.push(w);
        }
    }
    Ok(out)
}

fn text_property(
    x: &XConn,
    w: Window,
    prop: u32,
    kind: u32,
) -> Result<Option<Vec<u8>>, DisplayError> {
    let r = x
        .conn
        .get_property(false, w, prop, kind, 0, 1 << 16)?
        .reply()?;
    Ok((r.value_len > 0).then_some(r.value))
}

fn info(x: &XConn, id: Window) -> Result<WindowInfo, DisplayError> {
    let title = match text_property(x, id, x.atoms._NET_WM_NAME, x.atoms.UTF8_STRING)? {
        Some(v) => String::from_utf8_lossy(&v).into_owned(),
        None => text_property(x, id, x.atoms.WM_NAME, AtomEnum::ANY.into())?
            .map(|v| v.iter().map(|&b| b as char).collect())
            .unwrap_or_default(),
    };
    let class =
        text_property(x, id, x.atoms.WM_CLASS, AtomEnum::STRING.into())?.unwrap_or_default();
    let mut parts = class
        .split(|&b| b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let instance = parts.next().unwrap_or_default();
    let class = parts.next().unwrap_or_default();
    let machine = text_property(x, id, x.atoms.WM_CLIENT_MACHINE, AtomEnum::STRING.into())?
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .unwrap_or_else(|| "N/A".into());
    let desktop = x
        .conn
        .get_property(false, id, x.atoms._NET_WM_DESKTOP, AtomEnum::CARDINAL, 0, 1)?
        .reply()?
        .value32()
        .and_then(|mut v| v.next())
        .map(|d| if d == u32::MAX { -1 } else { d as i64 })
        .unwrap_or(0);
    let g = x.conn.get_geometry(id)?.reply()?;
    let t = x.conn.translate_coordinates(id, x.root, 0, 0)?.reply()?;
    Ok(WindowInfo {
        id,
        title,
        instance,
        class,
        x: t.dst_x as i32,
        y: t.dst_y as i32,
        width: g.width as u32,
        height: g.height as u32,
        desktop,
        machine,
    })
}

/// Asks the window manager to activate (raise and focus) `id`, and checks that it did: a
/// window manager may pass over a request that arrives while it is still focusing a window
/// that just appeared, so it is asked again (three times at most).
pub fn activate(x: &XConn, id: Window) -> Result<(), DisplayError> {
    for _ in 0..3 {
        // Source indication 2 (a pager) with a real timestamp: window managers that prevent
        // focus stealing refuse CurrentTime when the focused window's user time is newer.
        let now = server_time(x)?;
        send_root_message(x, id, x.atoms._NET_ACTIVE_WINDOW, [2, now, 0, 0, 0])?;
        let until = std::time::Instant::now() + std::time::Duration::from_millis(200);
        while std::time::Instant::now() < until {
            if active(x)? == Some(id) {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    Ok(())
}

/// How the window manager shows a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowState {
    /// Maximised both ways (`_NET_WM_STATE_MAXIMIZED_VERT` and `_HORZ`).
    pub maximized: bool,
    /// A dialog: its type says so, or it is transient for another window.
    pub dialog: bool,
}

fn atoms_of(x: &XConn, w: Window, prop: u32) -> Result<Vec<u32>, DisplayError> {
    Ok(x.conn
        .get_property(false, w, prop, AtomEnum::ATOM, 0, 64)?
        .reply()?
        .value32()
        .map(|v| v.collect())
        .unwrap_or_default())
}

pub fn state(x: &XConn, id: Window) -> Result<WindowState, DisplayError> {
    let states = atoms_of(x, id, x.atoms._NET_WM_STATE)?;
    let types = atoms_of(x, id, x.atoms._NET_WM_WINDOW_TYPE)?;
    let transient = x
        .conn
        .get_property(
            false,
            id,
            AtomEnum::WM_TRANSIENT_FOR,
            AtomEnum::WINDOW,
            0,
            1,
        )?
        .reply()?
        .value32()
        .and_then(|mut v| v.next())
        .is_some_and(|w| w != 0);
    Ok(WindowState {
        maximized: states.contains(&x.atoms._NET_WM_STATE_MAXIMIZED_VERT)
            && states.contains(&x.atoms._NET_WM_STATE_MAXIMIZED_HORZ),
        dialog: transient || types.contains(&x.atoms._NET_WM_WINDOW_TYPE_DIALOG),
    })
}

/// The window the window manager says is active.
pub fn active(x: &XConn) -> Result<Option<Window>, DisplayError> {
    Ok(x.conn
        .get_property(
            false,
            x.root,
            x.atoms._NET_ACTIVE_WINDOW,
            AtomEnum::WINDOW,
            0,
            1,
        )?
        .reply()?
        .value32()
        .and_then(|mut v| v.next())
        .filter(|&w| w != 0))
}

/// The X server's current time: append nothing to a property of a window of ours and read
/// the time stamp of the resulting PropertyNotify.
pub fn server_time(x: &XConn) -> Result<u32, DisplayError> {
    use x11rb::protocol::Event;
    use x11rb::protocol::xproto::PropMode;
    let w = x.helper_window()?;
    x.conn.change_property8(
        PropMode::APPEND,
        w,
        x.atoms.BERTH_SELECTION,
        AtomEnum::STRING,
        &[],
    )?;
    x.sync()?;
    let mut time = 0;
    while let Some(ev) = x.conn.poll_for_event()? {
        if let Event::PropertyNotify(p) = ev
            && p.window == w
        {
            time = p.time;
        }
    }
    x.conn.destroy_window(w)?;
    Ok(time)
}

/// Asks the window manager to close `id` (politely: the client may ask to save first).
pub fn close(x: &XConn, id: Window) -> Result<(), DisplayError> {
    send_root_message(x, id, x.atoms._NET_CLOSE_WINDOW, [0, 2, 0, 0, 0])
}

fn send_root_message(
    x: &XConn,
    window: Window,
    kind: u32,
    data: [u32; 5],
) -> Result<(), DisplayError> {
    let ev = ClientMessageEvent::new(32, window, kind, data);
    x.conn.send_event(
        false,
        x.root,
        EventMask::SUBSTRUCTURE_REDIRECT | EventMask::SUBSTRUCTURE_NOTIFY,
        ev,
    )?;
    x.conn.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(title: &str, instance: &str, class: &str) -> WindowInfo {
        WindowInfo {
            id: 0x1200003,
            title: title.into(),
            instance: instance.into(),
            class: class.into(),
            x: 0,
            y: 0,
            width: 1,
            height: 1,
            desktop: 0,
            machine: "host".into(),
        }
    }

    #[test]
    fn matching_follows_wmctrl() {
        let win = w(
            "Report.docx - LibreOffice Writer",
            "libreoffice",
            "libreoffice-writer",
        );
        let loose = Match::default();
        assert!(loose.matches(&win, "report.DOCX"));
        assert!(!loose.matches(&win, "calc"));
        let strict = Match {
            strict: true,
            by_class: false,
        };
        assert!(!strict.matches(&win, "Report.docx"));
        assert!(strict.matches(&win, "Report.docx - LibreOffice Writer"));
        let class = Match {
            strict: false,
            by_class: true,
        };
        assert!(class.matches(&win, "Writer"));
        let exact_class = Match {
            strict: true,
            by_class: true,
        };
        assert!(exact_class.matches(&win, "libreoffice.libreoffice-writer"));
        assert_eq!(
            win.wmctrl_line(),
            "0x01200003  0 host Report.docx - LibreOffice Writer"
        );
    }
}
