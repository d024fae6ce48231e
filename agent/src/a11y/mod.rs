//! The accessibility tree, read from AT-SPI in process over D-Bus (zbus): every application
//! on the registry, every node's role, name, states, attributes, geometry, text, value and
//! actions, with applications and siblings queried concurrently. `/accessibility` serialises
//! it in OSWorld's XML format (`xml.rs`); `/v1/a11y` gives it as JSON; `/terminal` finds the
//! focused terminal's text in it.

pub mod xml;

use std::path::PathBuf;
use std::time::Duration;

use futures_util::future::join_all;
use zbus::zvariant::{OwnedObjectPath, OwnedValue};

use crate::display::conn::Target;

/// OSWorld's limits: depth 50 (the application is depth 1), 1024 children per node.
const MAX_DEPTH: usize = 50;
const MAX_CHILDREN: usize = 1024;
/// One D-Bus call; an application that does not answer loses that part of its subtree.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

const REGISTRY: &str = "org.a11y.atspi.Registry";
const ROOT: &str = "/org/a11y/atspi/accessible/root";
const ACCESSIBLE: &str = "org.a11y.atspi.Accessible";

/// AT-SPI's state enum, in order (pyatspi's `STATE_*` names, lowercased).
pub const STATES: [&str; 44] = [
    "invalid",
    "active",
    "armed",
    "busy",
    "checked",
    "collapsed",
    "defunct",
    "editable",
    "enabled",
    "expandable",
    "expanded",
    "focusable",
    "focused",
    "has_tooltip",
    "horizontal",
    "iconified",
    "modal",
    "multi_line",
    "multiselectable",
    "opaque",
    "pressed",
    "resizable",
    "selectable",
    "selected",
    "sensitive",
    "showing",
    "single_line",
    "stale",
    "transient",
    "vertical",
    "visible",
    "manages_descendants",
    "indeterminate",
    "required",
    "truncated",
    "animated",
    "invalid_entry",
    "supports_autocompletion",
    "selectable_text",
    "is_default",
    "visited",
    "checkable",
    "has_popup",
    "read_only",
];

/// The tree's types are the wire contract's (`GET /v1/a11y`).
pub use berth_protocol::desktop::{A11yAction as Action, A11yNode as Node, A11yValue as Value};

type Ref = (String, OwnedObjectPath);

pub struct A11y {
    session_bus: Option<PathBuf>,
    /// The X server, whose root window names the AT-SPI bus (`AT_SPI_BUS`).
    x: Option<Target>,
    conn: tokio::sync::Mutex<Option<zbus::Connection>>,
}

#[derive(Debug, thiserror::Error)]
pub enum A11yError {
    #[error("no accessibility bus: this agent runs without --desktop")]
    NoBus,
    #[error("the accessibility bus is unreachable: {0}")]
    Bus(String),
}

async fn timed<T>(f: impl std::future::Future<Output = zbus::Result<T>>) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 2 s".into()),
    }
}

/// The AT-SPI bus address the launcher publishes on the root window. The property is readable
/// by every X client, whoever runs the session bus (which admits only its own user).
fn address_from_root_window(x: &Target) -> Result<Option<String>, String> {
    use x11rb::connection::Connection as _;
    use x11rb::protocol::xproto::{AtomEnum, ConnectionExt as _};
    let (c, screen) = x.connect()?;
    let root = c.setup().roots[screen].root;
    let atom = c
        .intern_atom(true, b"AT_SPI_BUS")
        .map_err(|e| e.to_string())?
        .reply()
        .map_err(|e| e.to_string())?
        .atom;
    if atom == 0 {
        return Ok(None);
    }
    let prop = c
        .get_property(false, root, atom, AtomEnum::STRING, 0, 1024)
        .map_err(|e| e.to_string())?
        .reply()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&prop.value)
        .trim_end_matches('\0')
        .to_string();
    Ok((!text.is_empty()).then_some(text))
}

impl A11y {
    pub fn new(session_bus: Option<PathBuf>, x: Option<Target>) -> A11y {
        A11y {
            session_bus,
            x,
            conn: tokio::sync::Mutex::new(None),
        }
    }

    /// Where the AT-SPI bus is: the root window's `AT_SPI_BUS`, else the session bus's
    /// `org.a11y.Bus.GetAddress` (which answers only the session's own user).
    async fn bus_address(&self, bus: &std::path::Path) -> Result<String, String> {
        let from_x = match self.x.clone() {
            Some(x) => tokio::task::spawn_blocking(move || address_from_root_window(&x))
                .await
                .map_err(|e| e.to_string())?,
            None => Ok(None),
        };
        let session = match zbus::connection::Builder::address(
            format!("unix:path={}", bus.display()).as_str(),
        ) {
            Ok(b) => timed(b.build()).await,
            Err(e) => Err(e.to_string()),
        };
        // Never through a name nobody owns: the bus would start a launcher of its own (its
        // service file), which the desktop's launcher then finds in its way.
        let session = match session {
            Ok(session) => {
                let owned: Result<bool, String> = match timed(session.call_method(
                    Some("org.freedesktop.DBus"),
                    "/org/freedesktop/DBus",
                    Some("org.freedesktop.DBus"),
                    "NameHasOwner",
                    &("org.a11y.Bus",),
                ))
                .await
                {
                    Ok(reply) => reply.body().deserialize().map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                };
                match owned {
                    Ok(true) => Ok(session),
                    Ok(false) => Err("the AT-SPI bus launcher is not running".to_string()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        if let Ok(session) = &session {
            // Toolkits that ask (Qt, Gecko) expose their trees only when this says so.
            let _ = timed(session.call_method(
                Some("org.a11y.Bus"),
                "/org/a11y/bus",
                Some("org.freedesktop.DBus.Properties"),
                "Set",
                &(
                    "org.a11y.Status",
                    "IsEnabled",
                    zbus::zvariant::Value::from(true),
                ),
            ))
            .await;
        }
        if let Ok(Some(address)) = from_x {
            return Ok(address);
        }
        let session = session.map_err(|e| match &from_x {
            Err(x) => format!("{e} (and the root window: {x})"),
            Ok(_) => e,
        })?;
        let reply = timed(session.call_method(
            Some("org.a11y.Bus"),
            "/org/a11y/bus",
            Some("org.a11y.Bus"),
            "GetAddress",
            &(),
        ))
        .await?;
        reply.body().deserialize().map_err(|e| e.to_string())
    }

    /// The AT-SPI bus, connected once and reconnected when it went away.
    async fn connection(&self) -> Result<zbus::Connection, A11yError> {
        let Some(bus) = &self.session_bus else {
            return Err(A11yError::NoBus);
        };
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref()
            && timed(c.call_method(
                Some("org.freedesktop.DBus"),
                "/org/freedesktop/DBus",
                Some("org.freedesktop.DBus"),
                "GetId",
                &(),
            ))
            .await
            .is_ok()
        {
            return Ok(c.clone());
        }
        let address = self.bus_address(bus).await.map_err(A11yError::Bus)?;
        let builder = zbus::connection::Builder::address(address.as_str())
            .map_err(|e| A11yError::Bus(format!("{address:?}: {e}")))?;
        let conn = timed(builder.build()).await.map_err(A11yError::Bus)?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// The registered applications' names: a round trip to the registry and to each of them.
    pub async fn applications(&self) -> Result<Vec<String>, A11yError> {
        let conn = Bus::new(self.connection().await?);
        Ok(named_applications(&conn)
            .await?
            .into_iter()
            .filter_map(|(_, name)| name.map(present_application))
            .collect())
    }

    /// The whole desktop: one node per application, in the registry's order.
    pub async fn tree(&self) -> Result<Vec<Node>, A11yError> {
        let conn = Bus::new(self.connection().await?);
        let apps = children(&conn, &(REGISTRY.to_string(), root_path()))
            .await
            .map_err(A11yError::Bus)?;
        let nodes = join_all(apps.iter().map(|app| node(&conn, app, 1))).await;
        Ok(nodes
            .into_iter()
            .flatten()
            .map(|mut app| {
                app.name = present_application(std::mem::take(&mut app.name));
                app
            })
            .collect())
    }
}

/// The applications `/terminal` reads a focused terminal from: GNOME's terminal (the only one
/// OSWorld's server looks in) and XFCE's.
pub const TERMINAL_APPLICATIONS: [&str; 2] = ["gnome-terminal-server", "xfce4-terminal"];

impl A11y {
    /// What `/terminal` reads: the active frames of the terminal applications, each with its
    /// subtree. Every other application is asked its name and nothing else, and without an
    /// active terminal frame no tree is walked at all — as OSWorld's server, which builds the
    /// tree only when `gnome-terminal-server` has an active frame.
    pub async fn terminal_frames(&self) -> Result<Vec<Node>, A11yError> {
        let conn = Bus::new(self.connection().await?);
        let terminals: Vec<Ref> = named_applications(&conn)
            .await?
            .into_iter()
            .filter(|(_, name)| {
                name.as_deref()
                    .is_some_and(|n| TERMINAL_APPLICATIONS.contains(&n))
            })
            .map(|(app, _)| app)
            .collect();
        let mut frames = Vec::new();
        for app in &terminals {
            let kids = children(&conn, app).await.unwrap_or_default();
            let active = join_all(kids.iter().map(|k| active_frame(&conn, k))).await;
            for (kid, active) in kids.iter().zip(active) {
                if active && let Some(frame) = node(&conn, kid, 2).await {
                    frames.push(frame);
                }
            }
        }
        Ok(frames)
    }
}

/// The registered applications, each with its name when it tells it: a round trip to the
/// registry and one to each application, at once.
async fn named_applications(conn: &Bus) -> Result<Vec<(Ref, Option<String>)>, A11yError> {
    let apps = children(conn, &(REGISTRY.to_string(), root_path()))
        .await
        .map_err(A11yError::Bus)?;
    let names = join_all(
        apps.iter()
            .map(|app| property(conn, app, ACCESSIBLE, "Name")),
    )
    .await;
    Ok(apps
        .into_iter()
        .zip(names)
        .map(|(app, name)| (app, name.ok().and_then(|v| String::try_from(v).ok())))
        .collect())
}

/// Whether a top-level object is a frame with the `active` state (its role and states only).
async fn active_frame(conn: &Bus, r: &Ref) -> bool {
    let (role, state) = tokio::join!(
        call::<_, String>(conn, r, ACCESSIBLE, "GetRoleName", &()),
        call::<_, Vec<u32>>(conn, r, ACCESSIBLE, "GetState", &()),
    );
    role.is_ok_and(|r| r == "frame")
        && state.is_ok_and(|bits| state_names(&bits).iter().any(|s| s == "active"))
}

/// The name the desktop's browser has in the tree. Debian's Chromium registers as
/// "Chromium" (its product name is compiled in); OSWorld's harness looks for Google Chrome
/// (`application[name=Google Chrome]`), which the desktop presents it as everywhere.
pub const BROWSER_APPLICATION: &str = "Google Chrome";

fn present_application(name: String) -> String {
    if name == "Chromium" {
        BROWSER_APPLICATION.to_string()
    } else {
        name
    }
}

/// Whether an application of the tree is the desktop's browser.
pub fn is_browser(name: &str) -> bool {
    name == BROWSER_APPLICATION || name == "Chromium"
}

fn root_path() -> OwnedObjectPath {
    OwnedObjectPath::try_from(ROOT).expect("a valid object path")
}

/// Calls one reading keeps in flight at most. An application answers its calls one at a time
/// on its main thread; thousands queued at once only make each wait, and a toolkit is asked no
/// more at once than it can take.
const MAX_IN_FLIGHT: usize = 32;

/// The AT-SPI bus as one reading uses it: its calls bounded by [`MAX_IN_FLIGHT`].
struct Bus {
    conn: zbus::Connection,
    slots: tokio::sync::Semaphore,
}

impl Bus {
    fn new(conn: zbus::Connection) -> Bus {
        Bus {
            conn,
            slots: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
        }
    }
}

async fn call<B, R>(conn: &Bus, r: &Ref, iface: &str, method: &str, body: &B) -> Result<R, String>
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
    R: for<'d> serde::Deserialize<'d> + zbus::zvariant::Type,
{
    let _slot = conn.slots.acquire().await.map_err(|e| e.to_string())?;
    let reply =
        timed(
            conn.conn
                .call_method(Some(r.0.as_str()), r.1.as_str(), Some(iface), method, body),
        )
        .await?;
    reply.body().deserialize().map_err(|e| e.to_string())
}

async fn property(conn: &Bus, r: &Ref, iface: &str, name: &str) -> Result<OwnedValue, String> {
    call(
        conn,
        r,
        "org.freedesktop.DBus.Properties",
        "Get",
        &(iface, name),
    )
    .await
}

/// The first `MAX_CHILDREN` children. A node with more is asked for them one by one
/// (`GetChildAtIndex`, as pyatspi iterates): `GetChildren` makes the application build every
/// child first, and a spreadsheet's table has a billion cells (LibreOffice Calc grew by 60 MB a
/// second, long after the call had timed out).
async fn children(conn: &Bus, r: &Ref) -> Result<Vec<Ref>, String> {
    let count = property(conn, r, ACCESSIBLE, "ChildCount")
        .await
        .ok()
        .and_then(|v| i32::try_from(v).ok());
    match count {
        Some(n) if n as usize > MAX_CHILDREN => {
            let at = |i: i32| async move {
                call::<_, Ref>(conn, r, ACCESSIBLE, "GetChildAtIndex", &(i,)).await
            };
            Ok(join_all((0..MAX_CHILDREN as i32).map(at))
                .await
                .into_iter()
                .filter_map(Result::ok)
                .collect())
        }
        Some(n) if n <= 0 => Ok(Vec::new()),
        _ => call(conn, r, ACCESSIBLE, "GetChildren", &()).await,
    }
}

fn f64_of(v: Result<OwnedValue, String>) -> f64 {
    v.ok().and_then(|v| f64::try_from(v).ok()).unwrap_or(0.0)
}

/// One node and its subtree; `None` when the object does not answer (it went away).
fn node<'a>(
    conn: &'a Bus,
    r: &'a Ref,
    depth: usize,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Node>> + Send + 'a>> {
    Box::pin(async move {
        let (mut n, ifaces) = bare_node(conn, r).await?;
        let shown = n.has_state("visible") && n.has_state("showing");
        let (geometry, text, value, actions, kids) = tokio::join!(
            extents(conn, r, &ifaces, shown),
            text_of(conn, r, &ifaces),
            value_of(conn, r, &ifaces),
            actions_of(conn, r, &ifaces),
            child_nodes(conn, r, depth),
        );
        if let Some((x, y, w, h)) = geometry {
            n.screencoord = Some((x, y));
            n.size = Some((w, h));
        }
        n.text = text;
        n.value = value;
        n.actions = actions;
        n.children = kids;
        Some(n)
    })
}

/// A node's role, name, states and attributes (asked at once), and the interfaces it offers;
/// `None` when it does not tell its role.
async fn bare_node(conn: &Bus, r: &Ref) -> Option<(Node, Vec<String>)> {
    let (role, name, state, attrs, ifaces) = tokio::join!(
        call::<_, String>(conn, r, ACCESSIBLE, "GetRoleName", &()),
        property(conn, r, ACCESSIBLE, "Name"),
        call::<_, Vec<u32>>(conn, r, ACCESSIBLE, "GetState", &()),
        call::<_, std::collections::HashMap<String, String>>(
            conn,
            r,
            ACCESSIBLE,
            "GetAttributes",
            &()
        ),
        call::<_, Vec<String>>(conn, r, ACCESSIBLE, "GetInterfaces", &()),
    );
    let role = role.ok()?;
    let role = match role.trim() {
        "" => "unknown".to_string(),
        r => r.replace(' ', "-"),
    };
    let name = name
        .ok()
        .and_then(|v| String::try_from(v).ok())
        .unwrap_or_default();
    let bits = state.unwrap_or_default();
    let states = state_names(&bits);
    let ifaces = ifaces.unwrap_or_default();
    let mut n = Node {
        role,
        name,
        attributes: attrs.unwrap_or_default().into_iter().collect(),
        image: offers(&ifaces, "org.a11y.atspi.Image"),
        selection: offers(&ifaces, "org.a11y.atspi.Selection"),
        ..Default::default()
    };
    n.states = states;
    Some((n, ifaces))
}

/// The names of the states set in an AT-SPI state bit set.
fn state_names(bits: &[u32]) -> Vec<String> {
    STATES
        .iter()
        .enumerate()
        .filter(|(i, _)| bits.get(i / 32).is_some_and(|w| w & (1 << (i % 32)) != 0))
        .map(|(_, n)| n.to_string())
        .collect()
}

/// Whether `ifaces` holds the interface `iface`.
fn offers(ifaces: &[String], iface: &str) -> bool {
    ifaces.iter().any(|x| x == iface)
}

/// Where a shown component is on screen (x, y, width, height); `None` for anything else.
async fn extents(
    conn: &Bus,
    r: &Ref,
    ifaces: &[String],
    shown: bool,
) -> Option<(i32, i32, i32, i32)> {
    if offers(ifaces, "org.a11y.atspi.Component") && shown {
        call::<_, (i32, i32, i32, i32)>(conn, r, "org.a11y.atspi.Component", "GetExtents", &(0u32,))
            .await
            .ok()
    } else {
        None
    }
}

/// A text object's text, without the object-replacement and replacement characters.
async fn text_of(conn: &Bus, r: &Ref, ifaces: &[String]) -> Option<String> {
    if offers(ifaces, "org.a11y.atspi.Text") {
        // As pyatspi asks: from 0 to the character count, never "to the end" (-1).
        let count = property(conn, r, "org.a11y.atspi.Text", "CharacterCount")
            .await
            .ok()
            .and_then(|v| i32::try_from(v).ok())
            .unwrap_or(0)
            .max(0);
        call::<_, String>(conn, r, "org.a11y.atspi.Text", "GetText", &(0i32, count))
            .await
            .ok()
            .map(|t| t.replace(['\u{fffc}', '\u{fffd}'], ""))
    } else {
        None
    }
}

/// A value object's current value and range (its four properties asked at once).
async fn value_of(conn: &Bus, r: &Ref, ifaces: &[String]) -> Option<Value> {
    if offers(ifaces, "org.a11y.atspi.Value") {
        let iface = "org.a11y.atspi.Value";
        let (c, lo, hi, step) = tokio::join!(
            property(conn, r, iface, "CurrentValue"),
            property(conn, r, iface, "MinimumValue"),
            property(conn, r, iface, "MaximumValue"),
            property(conn, r, iface, "MinimumIncrement"),
        );
        Some(Value {
            current: f64_of(c),
            min: f64_of(lo),
            max: f64_of(hi),
            step: f64_of(step),
        })
    } else {
        None
    }
}

/// An action object's actions; none for anything else or when it does not answer.
async fn actions_of(conn: &Bus, r: &Ref, ifaces: &[String]) -> Vec<Action> {
    if offers(ifaces, "org.a11y.atspi.Action") {
        call::<_, Vec<(String, String, String)>>(
            conn,
            r,
            "org.a11y.atspi.Action",
            "GetActions",
            &(),
        )
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|(name, description, keybinding)| Action {
            name,
            description,
            keybinding,
        })
        .collect()
    } else {
        Vec::new()
    }
}

/// The subtrees of the first [`MAX_CHILDREN`] children (asked at once), the children that
/// went away left out; none at [`MAX_DEPTH`].
async fn child_nodes(conn: &Bus, r: &Ref, depth: usize) -> Vec<Node> {
    if depth >= MAX_DEPTH {
        return Vec::new();
    }
    let mut refs = children(conn, r).await.unwrap_or_default();
    refs.truncate(MAX_CHILDREN);
    join_all(refs.iter().map(|c| node(conn, c, depth + 1)))
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// `/terminal`: the text of the focused terminal in the active terminal frames
/// ([`A11y::terminal_frames`]), right-trimmed; `None` unless exactly one matches.
pub fn focused_terminal(frames: &[Node]) -> Option<String> {
    fn focused<'a>(n: &'a Node, out: &mut Vec<&'a Node>) {
        if n.role == "terminal" && n.has_state("focused") {
            out.push(n);
        }
        for c in &n.children {
            focused(c, out);
        }
    }
    let mut found = Vec::new();
    for frame in frames {
        for c in &frame.children {
            focused(c, &mut found);
        }
    }
    match found.as_slice() {
        [one] => Some(one.text.clone().unwrap_or_default().trim_end().to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(role: &str, states: &[&str], text: Option<&str>, children: Vec<Node>) -> Node {
        Node {
            role: role.into(),
            states: states.iter().map(|s| s.to_string()).collect(),
            text: text.map(Into::into),
            children,
            ..Default::default()
        }
    }

    #[test]
    fn the_one_focused_terminal_of_the_active_frames_is_read_right_trimmed() {
        let term = |focused: bool, text: &str| {
            let states: &[&str] = if focused { &["focused"] } else { &[] };
            n("terminal", states, Some(text), vec![])
        };
        let frame = |kids| n("frame", &["active"], None, kids);
        let one = frame(vec![n(
            "filler",
            &[],
            None,
            vec![term(true, "$ ls\nx  \n\n")],
        )]);
        assert_eq!(focused_terminal(&[one]).as_deref(), Some("$ ls\nx"));
        // None focused, or two: no answer, as OSWorld's server gives none.
        assert_eq!(focused_terminal(&[frame(vec![term(false, "a")])]), None);
        let two = frame(vec![term(true, "a"), term(true, "b")]);
        assert_eq!(focused_terminal(&[two]), None);
        assert_eq!(focused_terminal(&[]), None);
    }
}
