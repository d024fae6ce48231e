//! Readiness probes: each answers whether one part of the desktop does its job, with a reason
//! when it does not. Every probe has its own deadline; none can hang readiness.

use std::path::Path;
use std::time::Duration;

use x11rb::connection::Connection;
use x11rb::protocol::xproto::{Atom, AtomEnum, ConnectionExt as _, MapState, Window};
use x11rb::rust_connection::RustConnection;

use crate::display::conn::Target;

pub type Probe = Result<(), String>;

fn connect(target: &Target) -> Result<(RustConnection, Window), String> {
    let (c, screen) = target
        .connect()
        .map_err(|e| format!("cannot connect to the X server {}: {e}", target.display))?;
    let root = c.setup().roots[screen].root;
    Ok((c, root))
}

fn atom(c: &RustConnection, name: &str) -> Result<Atom, String> {
    c.intern_atom(false, name.as_bytes())
        .map_err(|e| e.to_string())?
        .reply()
        .map(|r| r.atom)
        .map_err(|e| e.to_string())
}

/// The X server accepts a connection.
pub fn x_server(target: &Target) -> Probe {
    connect(target).map(|_| ())
}

/// Some client owns the selection (`WM_S0`: a window manager; `_XSETTINGS_S0`: a settings
/// daemon).
pub fn selection_owned(target: &Target, selection: &str, what: &str) -> Probe {
    let (c, _) = connect(target)?;
    let sel = atom(&c, selection)?;
    let owner = c
        .get_selection_owner(sel)
        .map_err(|e| e.to_string())?
        .reply()
        .map_err(|e| e.to_string())?
        .owner;
    if owner == 0 {
        Err(format!("no {what} owns {selection}"))
    } else {
        Ok(())
    }
}

/// A viewable window whose WM_CLASS names `class` exists (looked for among the root's
/// children and their children, which sees through window-manager frames).
pub fn window_mapped(target: &Target, class: &str) -> Probe {
    let (c, root) = connect(target)?;
    let mut level = vec![root];
    for _ in 0..2 {
        let mut next = Vec::new();
        for w in level {
            let Ok(tree) = c.query_tree(w).map_err(|e| e.to_string())?.reply() else {
                continue;
            };
            next.extend(tree.children);
        }
        for &w in &next {
            let Ok(Ok(attrs)) = c.get_window_attributes(w).map(|r| r.reply()) else {
                continue;
            };
            if attrs.map_state != MapState::VIEWABLE {
                continue;
            }
            let Ok(Ok(prop)) = c
                .get_property(false, w, AtomEnum::WM_CLASS, AtomEnum::STRING, 0, 64)
                .map(|r| r.reply())
            else {
                continue;
            };
            if prop
                .value
                .split(|b| *b == 0)
                .any(|part| part == class.as_bytes())
            {
                return Ok(());
            }
        }
        level = next;
    }
    Err(format!("no {class} window is mapped"))
}

/// The VNC server's Unix socket answers with an RFB protocol version.
pub async fn rfb_socket(path: &Path) -> Probe {
    use tokio::io::AsyncReadExt;
    let fut = async {
        let mut s = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|e| format!("cannot connect to the VNC socket: {e}"))?;
        let mut version = [0u8; 12];
        s.read_exact(&mut version)
            .await
            .map_err(|e| format!("the VNC server closed before its greeting: {e}"))?;
        check_rfb_greeting(&version)
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .unwrap_or_else(|_| Err("the VNC server did not greet within 2 s".into()))
}

pub fn check_rfb_greeting(version: &[u8]) -> Probe {
    if version.len() == 12 && version.starts_with(b"RFB 003.00") && version[11] == b'\n' {
        Ok(())
    } else {
        Err(format!(
            "not an RFB greeting: {:?}",
            String::from_utf8_lossy(version)
        ))
    }
}

/// A Unix socket accepts connections (the session bus).
pub async fn socket_accepts(path: &Path) -> Probe {
    match tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::UnixStream::connect(path),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("{}: {e}", path.display())),
        Err(_) => Err(format!("{}: no answer within 2 s", path.display())),
    }
}

/// A client of the session bus (the agent is admitted by the desktop's bus configuration).
async fn session_client(bus: &Path) -> Result<zbus::Connection, String> {
    let builder =
        zbus::connection::Builder::address(format!("unix:path={}", bus.display()).as_str())
            .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(2), builder.build()).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!("the session bus: {e}")),
        Err(_) => Err("the session bus did not answer within 2 s".into()),
    }
}

async fn call<R>(
    conn: &zbus::Connection,
    dest: &str,
    path: &str,
    iface: &str,
    method: &str,
    body: &(impl serde::Serialize + zbus::zvariant::DynamicType),
) -> Result<R, String>
where
    R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
{
    let reply = tokio::time::timeout(
        Duration::from_secs(2),
        conn.call_method(Some(dest), path, Some(iface), method, body),
    )
    .await
    .map_err(|_| format!("{dest} did not answer {method} within 2 s"))?
    .map_err(|e| e.to_string())?;
    reply.body().deserialize().map_err(|e| e.to_string())
}

/// `name` is owned on the session bus.
pub async fn bus_name_owned(bus: &Path, name: &str) -> Probe {
    let conn = session_client(bus).await?;
    let owned: bool = call(
        &conn,
        "org.freedesktop.DBus",
        "/org/freedesktop/DBus",
        "org.freedesktop.DBus",
        "NameHasOwner",
        &(name,),
    )
    .await?;
    owned
        .then_some(())
        .ok_or_else(|| format!("nothing owns {name} on the session bus yet"))
}

/// GNOME Shell is up and drawing its UI: it owns `WM_S0` (checked by the caller) and has
/// loaded `extension` (extensions load once the top bar and overview exist; the dock is one).
pub async fn shell_started(bus: &Path, extension: &str) -> Probe {
    let conn = session_client(bus).await?;
    let info: std::collections::HashMap<String, zbus::zvariant::OwnedValue> = call(
        &conn,
        "org.gnome.Shell",
        "/org/gnome/Shell",
        "org.gnome.Shell.Extensions",
        "GetExtensionInfo",
        &(extension,),
    )
    .await?;
    // ExtensionState: 1 is ENABLED.
    let state = info
        .get("state")
        .and_then(|v| f64::try_from(v).ok())
        .ok_or_else(|| format!("the shell does not know the extension {extension}"))?;
    if state == 1.0 {
        Ok(())
    } else {
        Err(format!(
            "the shell's {extension} is in state {state}, not enabled"
        ))
    }
}
