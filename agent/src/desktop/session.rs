//! What a desktop session is, as data: its components in start order, who each runs as, what
//! each needs and how each is known to be ready, and the environment its programs see. The
//! supervisor in `mod.rs` runs any session the same way; a new session is a new list here.

/// The desktop session the agent runs (`--session`): XFCE (the `desktop-ubuntu` image's) or
/// GNOME Shell on X11 as Ubuntu 22.04 shows it (the `osworld` bundle's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SessionKind {
    #[default]
    Xfce,
    Gnome,
}

/// One supervised program of a desktop session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// Xvnc: the X server with VNC on a private Unix socket.
    X,
    /// The system D-Bus (what GNOME's shell and settings reach timedated, polkit and the
    /// accounts service through).
    SystemBus,
    SessionBus,
    /// The AT-SPI bus launcher (`/accessibility` reads its registry).
    A11yBus,
    /// PulseAudio with its one (null) sink: the volume GNOME's sound panel moves.
    Audio,
    XfSettings,
    Xfwm4,
    XfcePanel,
    XfDesktop,
    /// GNOME's XSETTINGS daemon (themes, fonts and text scaling to GTK programs).
    GsdXsettings,
    /// GNOME Shell: window manager, compositor, top bar and dock.
    GnomeShell,
    /// One of GNOME's settings daemons that owns a bus name once it runs.
    Gsd(Gsd),
    Browser,
}

/// GNOME settings daemons besides XSETTINGS, each known by the bus name it owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Gsd {
    /// Media and shortcut keys (Ctrl+Alt+T opens the terminal, the volume keys).
    MediaKeys,
    /// Accessibility settings (large text, screen reader) applied to the session.
    A11ySettings,
    Keyboard,
    /// The theme's event sounds.
    Sound,
}

/// Whom a component runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunAs {
    /// The agent's own identity (the X server: its VNC socket must be the agent's alone).
    Agent,
    /// Root (the system bus), which needs an agent running as root.
    Root,
    /// The sandbox user, in their home.
    User,
}

/// How a component is known to be ready (each polled until it passes or its start times out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyWhen {
    /// The X server accepts the agent's connection and the VNC socket greets.
    XAndVnc,
    /// A Unix socket of the component's accepts connections.
    Socket(Socket),
    /// Some client owns this X selection (`WM_S0`, `_XSETTINGS_S0`).
    Selection(&'static str, &'static str),
    /// A viewable window of this WM_CLASS exists.
    WindowMapped(&'static str),
    /// This name is owned on the session bus.
    BusName(&'static str),
    /// GNOME Shell owns `WM_S0` and has loaded its extensions (the dock draws).
    ShellStarted,
    /// The browser opens a page over DevTools.
    DevTools,
    /// Up while it runs (no cheap outside sign of life).
    Running,
}

/// The sockets components are probed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Socket {
    SystemBus,
    SessionBus,
    Audio,
}

/// When the session's browser starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrowserStart {
    /// With the desktop, and again whenever it ends.
    Always,
    /// When a client first needs it (a CDP connection, `/v1/browser`), or adopted when the user
    /// starts one on the profile; after it ends the desktop shows no browser until then again.
    /// OSWorld's desktop starts with no browser window open.
    OnDemand,
}

/// The system bus socket (the standard path: programs look for it there).
pub const SYSTEM_BUS_SOCKET: &str = "/run/dbus/system_bus_socket";

/// GNOME Shell's dock extension, loaded once the shell's UI is up.
pub const DOCK_EXTENSION: &str = "dash-to-dock@micxgx.gmail.com";

const XFCE: &[Component] = &[
    Component::X,
    Component::SessionBus,
    Component::A11yBus,
    Component::XfSettings,
    Component::Xfwm4,
    Component::XfcePanel,
    Component::XfDesktop,
    Component::Browser,
];

const GNOME: &[Component] = &[
    Component::X,
    Component::SystemBus,
    Component::SessionBus,
    Component::A11yBus,
    Component::Audio,
    Component::GsdXsettings,
    Component::GnomeShell,
    Component::Gsd(Gsd::MediaKeys),
    Component::Gsd(Gsd::A11ySettings),
    Component::Gsd(Gsd::Keyboard),
    Component::Gsd(Gsd::Sound),
    Component::Browser,
];

/// Every component of every session, once (for name lookups).
const ALL: &[Component] = &[
    Component::X,
    Component::SystemBus,
    Component::SessionBus,
    Component::A11yBus,
    Component::Audio,
    Component::XfSettings,
    Component::Xfwm4,
    Component::XfcePanel,
    Component::XfDesktop,
    Component::GsdXsettings,
    Component::GnomeShell,
    Component::Gsd(Gsd::MediaKeys),
    Component::Gsd(Gsd::A11ySettings),
    Component::Gsd(Gsd::Keyboard),
    Component::Gsd(Gsd::Sound),
    Component::Browser,
];

impl SessionKind {
    pub fn name(self) -> &'static str {
        match self {
            SessionKind::Xfce => "xfce",
            SessionKind::Gnome => "gnome",
        }
    }

    /// The components, in start order: each starts once the one it waits for is ready
    /// ([`Self::waits_for`]).
    pub fn components(self) -> &'static [Component] {
        match self {
            SessionKind::Xfce => XFCE,
            SessionKind::Gnome => GNOME,
        }
    }

    /// The components `c` waits for before it starts (on the first start and after an X
    /// restart): the one before it in start order, except on XFCE, where the panel and the
    /// desktop both need only the window manager and start side by side, and the browser
    /// waits for the panel only (started before it is up, Chrome draws its window with the
    /// window manager's title bar, below the panel's strut, unfocused; the desktop's window
    /// stays below whatever maps first). Empty for the first.
    pub fn waits_for(self, c: Component) -> &'static [Component] {
        if self == SessionKind::Xfce {
            match c {
                Component::XfcePanel | Component::XfDesktop => return &[Component::Xfwm4],
                Component::Browser => return &[Component::XfcePanel],
                _ => {}
            }
        }
        let all = self.components();
        match all.iter().position(|x| *x == c) {
            Some(i) if i > 0 => std::slice::from_ref(&all[i - 1]),
            _ => &[],
        }
    }

    /// The component whose readiness is the window manager's (strict readiness checks it).
    pub fn window_manager(self) -> Component {
        match self {
            SessionKind::Xfce => Component::Xfwm4,
            SessionKind::Gnome => Component::GnomeShell,
        }
    }

    /// The panel the window-manager check also wants drawn (XFCE's is a window of its own;
    /// GNOME's top bar and dock are part of the shell's stage).
    pub fn panel_class(self) -> Option<&'static str> {
        match self {
            SessionKind::Xfce => Some("xfce4-panel"),
            SessionKind::Gnome => None,
        }
    }

    pub fn browser_start(self) -> BrowserStart {
        match self {
            SessionKind::Xfce => BrowserStart::Always,
            SessionKind::Gnome => BrowserStart::OnDemand,
        }
    }

    /// The locale its programs run in: GNOME as Ubuntu's English install has it (dates,
    /// number formats and the 12-hour clock follow it); XFCE in the neutral C.UTF-8.
    pub fn lang(self) -> &'static str {
        match self {
            SessionKind::Xfce => "C.UTF-8",
            SessionKind::Gnome => "en_US.UTF-8",
        }
    }

    /// What the session's own programs see (as a login to it sets), and so the programs the
    /// shell starts from its dock. Commands run through the agent do not: OSWorld's guest
    /// server runs them without these, and `xdg-mime` answers differently with them.
    pub fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            SessionKind::Xfce => &[],
            SessionKind::Gnome => &[
                ("XDG_CURRENT_DESKTOP", "ubuntu:GNOME"),
                ("XDG_SESSION_DESKTOP", "ubuntu"),
                ("XDG_SESSION_TYPE", "x11"),
                ("DESKTOP_SESSION", "ubuntu"),
                ("GNOME_SHELL_SESSION_MODE", "ubuntu"),
            ],
        }
    }
}

impl Component {
    /// Its name in `/v1/ready`, events and `components/<name>.log`.
    pub fn name(self) -> &'static str {
        match self {
            Component::X => "x",
            Component::SystemBus => "system-bus",
            Component::SessionBus => "session-bus",
            Component::A11yBus => "a11y-bus",
            Component::Audio => "pulseaudio",
            Component::XfSettings => "xfsettingsd",
            Component::Xfwm4 => "xfwm4",
            Component::XfcePanel => "xfce4-panel",
            Component::XfDesktop => "xfdesktop",
            Component::GsdXsettings => "gsd-xsettings",
            Component::GnomeShell => "gnome-shell",
            Component::Gsd(Gsd::MediaKeys) => "gsd-media-keys",
            Component::Gsd(Gsd::A11ySettings) => "gsd-a11y-settings",
            Component::Gsd(Gsd::Keyboard) => "gsd-keyboard",
            Component::Gsd(Gsd::Sound) => "gsd-sound",
            Component::Browser => "chromium",
        }
    }

    /// The component named `name` (of any session).
    pub fn named(name: &str) -> Option<Component> {
        ALL.iter().copied().find(|c| c.name() == name)
    }

    pub fn runs_as(self) -> RunAs {
        match self {
            Component::X => RunAs::Agent,
            Component::SystemBus => RunAs::Root,
            _ => RunAs::User,
        }
    }

    /// Whether it draws on (or talks to) the X server, and so waits for it and restarts with it.
    pub fn needs_x(self) -> bool {
        !matches!(
            self,
            Component::X | Component::SystemBus | Component::SessionBus | Component::Audio
        )
    }

    /// The program it runs (before the desktop adds its own arguments).
    pub fn argv(self) -> &'static [&'static str] {
        match self {
            // Built by the desktop (display, sockets, the browser's flags).
            Component::X | Component::SessionBus | Component::Browser => &[],
            Component::SystemBus => &["dbus-daemon", "--system", "--nofork", "--nopidfile"],
            Component::A11yBus => &["/usr/libexec/at-spi-bus-launcher", "--launch-immediately"],
            Component::Audio => &[
                "pulseaudio",
                "--daemonize=no",
                "--exit-idle-time=-1",
                "--log-target=stderr",
            ],
            Component::XfSettings => &["xfsettingsd", "--no-daemon", "--replace"],
            Component::Xfwm4 => &["xfwm4", "--compositor=off", "--replace"],
            Component::XfcePanel => &["xfce4-panel"],
            Component::XfDesktop => &["xfdesktop"],
            Component::GsdXsettings => &["/usr/libexec/gsd-xsettings"],
            Component::GnomeShell => &["gnome-shell", "--x11", "--replace", "--mode=ubuntu"],
            Component::Gsd(Gsd::MediaKeys) => &["/usr/libexec/gsd-media-keys"],
            Component::Gsd(Gsd::A11ySettings) => &["/usr/libexec/gsd-a11y-settings"],
            Component::Gsd(Gsd::Keyboard) => &["/usr/libexec/gsd-keyboard"],
            Component::Gsd(Gsd::Sound) => &["/usr/libexec/gsd-sound"],
        }
    }

    pub fn ready_when(self) -> ReadyWhen {
        match self {
            Component::X => ReadyWhen::XAndVnc,
            Component::SystemBus => ReadyWhen::Socket(Socket::SystemBus),
            Component::SessionBus => ReadyWhen::Socket(Socket::SessionBus),
            Component::Audio => ReadyWhen::Socket(Socket::Audio),
            Component::A11yBus => ReadyWhen::Running,
            Component::XfSettings | Component::GsdXsettings => {
                ReadyWhen::Selection("_XSETTINGS_S0", "settings daemon")
            }
            Component::Xfwm4 => ReadyWhen::Selection("WM_S0", "window manager"),
            Component::XfcePanel => ReadyWhen::WindowMapped("xfce4-panel"),
            Component::XfDesktop => ReadyWhen::WindowMapped("xfdesktop"),
            Component::GnomeShell => ReadyWhen::ShellStarted,
            Component::Gsd(g) => ReadyWhen::BusName(g.bus_name()),
            Component::Browser => ReadyWhen::DevTools,
        }
    }
}

impl Gsd {
    pub fn bus_name(self) -> &'static str {
        match self {
            Gsd::MediaKeys => "org.gnome.SettingsDaemon.MediaKeys",
            Gsd::A11ySettings => "org.gnome.SettingsDaemon.A11ySettings",
            Gsd::Keyboard => "org.gnome.SettingsDaemon.Keyboard",
            Gsd::Sound => "org.gnome.SettingsDaemon.Sound",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sessions_components_are_named_once_and_start_with_the_x_server() {
        for s in [SessionKind::Xfce, SessionKind::Gnome] {
            let c = s.components();
            assert_eq!(c[0], Component::X, "{s:?}");
            assert_eq!(c.last(), Some(&Component::Browser), "{s:?}");
            let names: std::collections::BTreeSet<_> = c.iter().map(|c| c.name()).collect();
            assert_eq!(names.len(), c.len(), "{s:?}: a name twice");
            assert!(c.contains(&s.window_manager()), "{s:?}");
            for comp in c {
                assert_eq!(Component::named(comp.name()), Some(*comp));
                assert!(ALL.contains(comp), "{comp:?} missing from ALL");
            }
        }
    }

    #[test]
    fn xfces_panel_and_desktop_start_side_by_side_and_the_browser_after_the_panel() {
        let x = SessionKind::Xfce;
        assert_eq!(x.waits_for(Component::X), &[] as &[Component]);
        assert_eq!(x.waits_for(Component::Xfwm4), &[Component::XfSettings]);
        assert_eq!(x.waits_for(Component::XfcePanel), &[Component::Xfwm4]);
        assert_eq!(x.waits_for(Component::XfDesktop), &[Component::Xfwm4]);
        assert_eq!(x.waits_for(Component::Browser), &[Component::XfcePanel]);
        // GNOME keeps its chain: the browser waits for the last settings daemon.
        let g = SessionKind::Gnome;
        assert_eq!(
            g.waits_for(Component::Browser),
            &[Component::Gsd(Gsd::Sound)]
        );
        assert_eq!(
            g.waits_for(Component::GnomeShell),
            &[Component::GsdXsettings]
        );
        assert_eq!(
            g.waits_for(Component::XfcePanel),
            &[] as &[Component],
            "not GNOME's"
        );
        // Whatever a component waits for starts before it.
        for s in [x, g] {
            let c = s.components();
            let at = |x: Component| c.iter().position(|y| *y == x);
            for comp in c {
                for w in s.waits_for(*comp) {
                    assert!(at(*w) < at(*comp), "{s:?}: {comp:?} waits for {w:?}");
                }
            }
        }
    }

    #[test]
    fn what_a_component_needs_comes_before_it() {
        for s in [SessionKind::Xfce, SessionKind::Gnome] {
            let c = s.components();
            let at = |x: Component| c.iter().position(|y| *y == x);
            for (i, comp) in c.iter().enumerate() {
                if comp.needs_x() {
                    assert!(at(Component::X) < Some(i), "{comp:?} before X");
                    assert!(
                        at(Component::SessionBus) < Some(i),
                        "{comp:?} before the bus"
                    );
                }
                if let ReadyWhen::BusName(_) = comp.ready_when() {
                    assert!(at(Component::SessionBus) < Some(i));
                }
            }
            if let Some(shell) = at(Component::GnomeShell) {
                // The shell reaches UPower and logind's absence over the system bus at start.
                assert!(at(Component::SystemBus) < Some(shell));
            }
        }
    }
}
