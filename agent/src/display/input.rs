//! Synthetic input through XTEST, in-process: pointer moves and buttons, keys and chords, and
//! typing of any Unicode text regardless of the keyboard layout.
//!
//! Typing a character the layout lacks borrows a spare keycode (one with no keysyms) and maps
//! the character to it. All missing characters of a stretch of text are mapped at once, and a
//! round trip separates every remap from the key events around it. Mappings are put back only
//! after a grace period: clients re-read the keymap lazily, and a keycode remapped while its
//! key events still wait in a client's queue is how xdotool scrambles text.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use x11rb::connection::Connection;
use x11rb::protocol::xproto::{
    BUTTON_PRESS_EVENT, BUTTON_RELEASE_EVENT, ConnectionExt as _, KEY_PRESS_EVENT,
    KEY_RELEASE_EVENT, MOTION_NOTIFY_EVENT,
};
use x11rb::protocol::xtest::ConnectionExt as _;

use super::DisplayError;
use super::conn::XConn;
use super::keys;

/// How long a borrowed keycode keeps its character after the last key event that used it:
/// long enough for a busy client to read its queued key events. (250 ms was seen to scramble
/// text in a Tk field on a loaded 2-core machine; lending a keycode again only happens when a
/// text has more distinct missing characters than there are spare keycodes.)
pub const REMAP_GRACE: Duration = Duration::from_millis(1000);
/// How long the focused client may take to answer the ping that says it read its events.
const CATCH_UP_WAIT: Duration = Duration::from_secs(5);
/// How long a window that does not list `_NET_WM_PING` is given to answer one.
const UNLISTED_PING_WAIT: Duration = Duration::from_millis(250);

const SHIFT_L: u32 = 0xffe1;

pub struct Keyboard {
    min: u8,
    per: usize,
    syms: Vec<u32>,
    /// keysym → (keycode, needs shift), for what the layout already has.
    by_sym: HashMap<u32, (u8, bool)>,
    /// Keycodes with no keysyms, free to borrow.
    spare: Vec<u8>,
    /// Borrowed keycodes: keycode → (keysym, last used).
    borrowed: HashMap<u8, (u32, Instant)>,
}

impl Keyboard {
    pub fn load(x: &XConn) -> Result<Keyboard, DisplayError> {
        let setup = x.conn.setup();
        let (min, max) = (setup.min_keycode, setup.max_keycode);
        let count = max - min + 1;
        let map = x.conn.get_keyboard_mapping(min, count)?.reply()?;
        let per = map.keysyms_per_keycode as usize;
        let mut kb = Keyboard {
            min,
            per,
            syms: map.keysyms,
            by_sym: HashMap::new(),
            spare: Vec::new(),
            borrowed: HashMap::new(),
        };
        kb.index();
        Ok(kb)
    }

    fn index(&mut self) {
        self.by_sym.clear();
        self.spare.clear();
        for (i, chunk) in self.syms.chunks(self.per.max(1)).enumerate() {
            let kc = self.min + i as u8;
            if chunk.iter().all(|&s| s == 0) {
                self.spare.push(kc);
                continue;
            }
            // Level 0 is unshifted, level 1 shifted (group 1 only).
            for (level, &sym) in chunk.iter().take(2).enumerate() {
                if sym != 0 {
                    self.by_sym.entry(sym).or_insert((kc, level == 1));
                }
            }
            // A lone lower-case letter also types its capital with Shift.
            if chunk.get(1).copied().unwrap_or(0) == 0
                && let Some(&s) = chunk.first()
                && (0x61..=0x7a).contains(&s)
            {
                self.by_sym.entry(s - 0x20).or_insert((kc, true));
            }
        }
        // Borrowed keycodes are not spare while they are mapped.
        self.spare.retain(|kc| !self.borrowed.contains_key(kc));
        for (&kc, &(sym, _)) in &self.borrowed {
            self.by_sym.insert(sym, (kc, false));
        }
    }

    /// Re-reads the layout after another client changed it, keeping track of our borrowed
    /// keycodes that still carry what we put there.
    pub fn reload(&mut self, x: &XConn) -> Result<(), DisplayError> {
        let count = x.conn.setup().max_keycode - self.min + 1;
        let map = x.conn.get_keyboard_mapping(self.min, count)?.reply()?;
        self.per = map.keysyms_per_keycode as usize;
        self.syms = map.keysyms;
        let per = self.per.max(1);
        let syms = &self.syms;
        let min = self.min;
        self.borrowed.retain(|&kc, (sym, _)| {
            let at = (kc - min) as usize * per;
            syms.get(at) == Some(sym)
        });
        self.index();
        Ok(())
    }

    /// Where to find `sym` in the layout as it stands.
    pub fn find(&self, sym: u32) -> Option<(u8, bool)> {
        self.by_sym.get(&sym).copied()
    }
}

pub struct Input {
    pub x: XConn,
    kb: Keyboard,
    /// Another client may have changed the layout (a MappingNotify arrived).
    stale: bool,
    /// Buttons and keys this connection pressed and has not released (released on drop of a
    /// failed batch, so nothing stays stuck).
    held_keys: Vec<u8>,
    /// The last `_NET_WM_PING` sent (`client_caught_up`).
    ping_serial: u32,
    /// Windows that do not list `_NET_WM_PING` and did not answer one: never pinged again.
    silent: HashSet<u32>,
}

impl Input {
    pub fn new(x: XConn) -> Result<Input, DisplayError> {
        x.conn.xtest_get_version(2, 2)?.reply()?;
        let kb = Keyboard::load(&x)?;
        Ok(Input {
            x,
            kb,
            stale: false,
            held_keys: Vec::new(),
            ping_serial: 0,
            silent: HashSet::new(),
        })
    }

    fn fake(&self, kind: u8, detail: u8, x: i16, y: i16) -> Result<(), DisplayError> {
        self.x
            .conn
            .xtest_fake_input(kind, detail, 0, self.x.root, x, y, 0)?;
        Ok(())
    }

    pub fn move_to(&self, x: i32, y: i32) -> Result<(), DisplayError> {
        self.fake(MOTION_NOTIFY_EVENT, 0, clamp16(x), clamp16(y))
    }

    pub fn button(&self, button: u8, down: bool) -> Result<(), DisplayError> {
        let kind = if down {
            BUTTON_PRESS_EVENT
        } else {
            BUTTON_RELEASE_EVENT
        };
        self.fake(kind, button, 0, 0)
    }

    fn key_code(&self, kc: u8, down: bool) -> Result<(), DisplayError> {
        let kind = if down {
            KEY_PRESS_EVENT
        } else {
            KEY_RELEASE_EVENT
        };
        self.fake(kind, kc, 0, 0)
    }

    /// Presses (or releases) the key for `sym`, borrowing a keycode when the layout lacks it.
    pub fn key(&mut self, sym: u32, down: bool) -> Result<(), DisplayError> {
        let (kc, _) = self.keycode_for(&[sym])?[0];
        self.key_code(kc, down)?;
        if down {
            self.held_keys.push(kc);
        } else {
            self.held_keys.retain(|&k| k != kc);
        }
        Ok(())
    }

    /// Presses the keys in order and releases them in reverse (a chord).
    pub fn chord(&mut self, syms: &[u32]) -> Result<(), DisplayError> {
        let codes = self.keycode_for(syms)?;
        for &(kc, _) in &codes {
            self.key_code(kc, true)?;
        }
        for &(kc, _) in codes.iter().rev() {
            self.key_code(kc, false)?;
        }
        Ok(())
    }

    /// Releases anything this connection still holds down.
    pub fn release_all(&mut self) {
        for kc in std::mem::take(&mut self.held_keys) {
            let _ = self.key_code(kc, false);
        }
    }

    /// Types `text` exactly, whatever the layout.
    pub fn type_text(&mut self, text: &str) -> Result<(), DisplayError> {
        let syms: Vec<u32> = text
            .replace("\r\n", "\n")
            .chars()
            .map(keys::char_keysym)
            .collect();
        let shift = self.kb.find(SHIFT_L).map(|(kc, _)| kc);
        let mut i = 0;
        while i < syms.len() {
            // The longest stretch whose characters all have a keycode at once: the missing
            // ones (to borrow) plus the borrowed ones it reuses (kept, not lent again) fit the
            // keycodes there are to lend.
            let capacity = self.kb.spare.len() + self.kb.borrowed.len();
            let mut missing: Vec<u32> = Vec::new();
            let mut keep: HashSet<u8> = HashSet::new();
            let mut end = i;
            while end < syms.len() {
                let s = syms[end];
                match self.kb.find(s) {
                    Some((kc, _)) if self.kb.borrowed.contains_key(&kc) => {
                        if !keep.contains(&kc) {
                            if missing.len() + keep.len() == capacity {
                                break;
                            }
                            keep.insert(kc);
                        }
                    }
                    Some(_) => {}
                    None if missing.contains(&s) => {}
                    None => {
                        if missing.len() + keep.len() == capacity.max(1) {
                            break;
                        }
                        missing.push(s);
                    }
                }
                end += 1;
            }
            if end == i {
                return Err(DisplayError::Input(
                    "the keyboard has no spare keycodes to type with".into(),
                ));
            }
            self.borrow(&missing, keep)?;
            for &s in &syms[i..end] {
                let (kc, needs_shift) = self
                    .kb
                    .find(s)
                    .ok_or_else(|| DisplayError::Input(format!("cannot type keysym {s:#x}")))?;
                let shift = if needs_shift { shift } else { None };
                if let Some(sh) = shift {
                    self.key_code(sh, true)?;
                }
                self.key_code(kc, true)?;
                self.key_code(kc, false)?;
                if let Some(sh) = shift {
                    self.key_code(sh, false)?;
                }
                if let Some(b) = self.kb.borrowed.get_mut(&kc) {
                    b.1 = Instant::now();
                }
            }
            i = end;
        }
        self.x.conn.flush()?;
        Ok(())
    }

    /// Keycodes for `syms`, borrowing spare ones for what the layout lacks.
    fn keycode_for(&mut self, syms: &[u32]) -> Result<Vec<(u8, bool)>, DisplayError> {
        let mut missing: Vec<u32> = Vec::new();
        let mut keep: HashSet<u8> = HashSet::new();
        for &s in syms {
            match self.kb.find(s) {
                Some((kc, _)) => {
                    keep.insert(kc);
                }
                None if !missing.contains(&s) => missing.push(s),
                None => {}
            }
        }
        self.borrow(&missing, keep)?;
        syms.iter()
            .map(|&s| {
                self.kb
                    .find(s)
                    .ok_or_else(|| DisplayError::Input(format!("cannot press keysym {s:#x}")))
            })
            .collect()
    }

    /// Maps each of `syms` to a spare keycode, then waits a round trip so the mapping is in
    /// force before any key event that uses it. With no spare keycode left, the least
    /// recently used borrowed one is lent again once its grace has passed — never one in
    /// `keep` (still needed by the caller), one held down, or one lent by this same call.
    fn borrow(&mut self, syms: &[u32], mut keep: HashSet<u8>) -> Result<(), DisplayError> {
        if syms.is_empty() {
            return Ok(());
        }
        keep.extend(self.held_keys.iter().copied());
        self.x.conn.flush()?;
        for &sym in syms {
            let kc = match self.kb.spare.pop() {
                Some(kc) => kc,
                None => {
                    let Some((&kc, &(_, used))) = self
                        .kb
                        .borrowed
                        .iter()
                        .filter(|(kc, _)| !keep.contains(kc))
                        .min_by_key(|(_, (_, used))| *used)
                    else {
                        self.kb.index();
                        return Err(DisplayError::Input(
                            "the keyboard has no spare keycodes left to type with".into(),
                        ));
                    };
                    // Its last events must be read by their client before the keycode
                    // changes: the focused client says so by answering a ping from its event
                    // loop (after the key events queued before it); one that does not speak
                    // the protocol gets the grace period.
                    self.x.sync()?;
                    if !self.client_caught_up(CATCH_UP_WAIT)? {
                        let wait = (used + REMAP_GRACE).saturating_duration_since(Instant::now());
                        std::thread::sleep(wait);
                    }
                    kc
                }
            };
            self.map(kc, sym)?;
            self.kb.borrowed.insert(kc, (sym, Instant::now()));
            keep.insert(kc);
        }
        self.kb.index();
        self.x.sync()?;
        // The focused client must also have handled the mapping change before the key events
        // that use it. Tk translates a key event when it reads it off the connection but
        // handles MappingNotify later, and libX11 loses a keymap change noted while it is
        // fetching another: a key event read before the client handled its keycode's
        // MappingNotify can be translated by that keycode's previous mapping. Its answer to a
        // ping says it has handled the change.
        self.client_caught_up(CATCH_UP_WAIT)?;
        Ok(())
    }

    fn map(&mut self, kc: u8, sym: u32) -> Result<(), DisplayError> {
        let per = self.kb.per.max(1);
        // The same keysym at both levels: Shift state does not matter.
        let mut row = vec![0u32; per];
        row[0] = sym;
        if per > 1 {
            row[1] = sym;
        }
        self.x
            .conn
            .change_keyboard_mapping(1, kc, per as u8, &row)?;
        let at = (kc - self.kb.min) as usize * per;
        self.kb.syms[at..at + per].copy_from_slice(&row);
        Ok(())
    }

    /// Gives back borrowed keycodes whose grace has passed. Returns whether some remain.
    pub fn restore_idle(&mut self) -> Result<bool, DisplayError> {
        let now = Instant::now();
        let idle: Vec<u8> = self
            .kb
            .borrowed
            .iter()
            .filter(|(kc, (_, used))| {
                now.duration_since(*used) >= REMAP_GRACE && !self.held_keys.contains(kc)
            })
            .map(|(&kc, _)| kc)
            .collect();
        if !idle.is_empty() {
            let per = self.kb.per.max(1);
            for kc in idle {
                self.x
                    .conn
                    .change_keyboard_mapping(1, kc, per as u8, &vec![0u32; per])?;
                let at = (kc - self.kb.min) as usize * per;
                self.kb.syms[at..at + per].fill(0);
                self.kb.borrowed.remove(&kc);
            }
            self.kb.index();
            self.x.sync()?;
        }
        Ok(!self.kb.borrowed.is_empty())
    }

    /// Whether the client holding the input focus has handled every event sent to it so far:
    /// it answered a `_NET_WM_PING` (EWMH), which its event loop handles after the events
    /// queued before it. The ping goes to the nearest window up from the focus with
    /// `WM_PROTOCOLS`: one that lists `_NET_WM_PING` is waited on for `wait`; one that does not
    /// (Tk answers pings without listing them) for `UNLISTED_PING_WAIT`, once — a window that
    /// then stays silent is not pinged again. False when there is no such window or no answer.
    fn client_caught_up(&mut self, wait: Duration) -> Result<bool, DisplayError> {
        use x11rb::protocol::xproto::{AtomEnum, ClientMessageEvent, EventMask};
        let conn = self.x.conn.clone();
        let root = self.x.root;
        let protocols = conn.intern_atom(false, b"WM_PROTOCOLS")?.reply()?.atom;
        let ping = conn.intern_atom(false, b"_NET_WM_PING")?.reply()?.atom;
        let mut w = conn.get_input_focus()?.reply()?.focus;
        let mut target = None;
        for _ in 0..16 {
            // None and PointerRoot.
            if w <= 1 || w == root {
                break;
            }
            let p = conn
                .get_property(false, w, protocols, AtomEnum::ATOM, 0, 64)?
                .reply()?;
            if let Some(mut listed) = p.value32() {
                match listed.any(|a| a == ping) {
                    true => target = Some((w, wait)),
                    false if !self.silent.contains(&w) => {
                        target = Some((w, wait.min(UNLISTED_PING_WAIT)))
                    }
                    false => {}
                }
                break;
            }
            w = conn.query_tree(w)?.reply()?.parent;
        }
        let Some((target, wait)) = target else {
            return Ok(false);
        };
        self.drain_events();
        // The answer goes to the root window: listen there while waiting.
        conn.change_window_attributes(
            root,
            &x11rb::protocol::xproto::ChangeWindowAttributesAux::new()
                .event_mask(EventMask::SUBSTRUCTURE_NOTIFY),
        )?;
        self.ping_serial = self.ping_serial.wrapping_add(1).max(1);
        let stamp = self.ping_serial;
        let msg = ClientMessageEvent::new(32, target, protocols, [ping, stamp, target, 0, 0]);
        conn.send_event(false, target, EventMask::NO_EVENT, msg)?;
        conn.flush()?;
        let deadline = Instant::now() + wait;
        let mut answered = false;
        while !answered && Instant::now() < deadline {
            match conn.poll_for_event()? {
                Some(x11rb::protocol::Event::ClientMessage(m))
                    if m.type_ == protocols && m.data.as_data32()[..2] == [ping, stamp] =>
                {
                    answered = true;
                }
                Some(x11rb::protocol::Event::MappingNotify(_)) => self.stale = true,
                Some(_) => {}
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        conn.change_window_attributes(
            root,
            &x11rb::protocol::xproto::ChangeWindowAttributesAux::new()
                .event_mask(EventMask::NO_EVENT),
        )?;
        self.x.sync()?;
        self.drain_events();
        if !answered {
            // Bounded: window ids are recycled, and a long-lived agent sees many windows.
            if self.silent.len() >= 1024 {
                self.silent.clear();
            }
            self.silent.insert(target);
        }
        Ok(answered)
    }

    /// Reads (and drops) the events this connection receives, so they never pile up; a
    /// keymap change marks the layout for re-reading.
    pub fn drain_events(&mut self) {
        while let Ok(Some(ev)) = self.x.conn.poll_for_event() {
            if matches!(ev, x11rb::protocol::Event::MappingNotify(_)) {
                self.stale = true;
            }
        }
    }

    /// Re-reads the layout if it may have changed.
    pub fn refresh_layout(&mut self) -> Result<(), DisplayError> {
        if std::mem::take(&mut self.stale) {
            self.kb.reload(&self.x)?;
        }
        Ok(())
    }

    /// Pointer position on the screen.
    pub fn pointer(&self) -> Result<(i32, i32), DisplayError> {
        self.pointer_state().map(|(at, _)| at)
    }

    /// The pointer's position and the buttons and modifiers held, as the server has them.
    fn pointer_state(&self) -> Result<((i32, i32), u16), DisplayError> {
        let p = self.x.conn.query_pointer(self.x.root)?.reply()?;
        Ok(((p.root_x as i32, p.root_y as i32), u16::from(p.mask)))
    }

    /// Waits (at most `wait`) until the server has processed every button event sent: no
    /// button is down. A window manager's click-to-focus grab freezes the pointer until it
    /// replays the click, and key events are not frozen with it: a modifier released at once
    /// would reach the window before the clicks it was held for. While the pointer is frozen
    /// its queued events have not changed the button state, so the state says when they have.
    pub fn buttons_processed(&self, wait: Duration) -> Result<bool, DisplayError> {
        use x11rb::protocol::xproto::KeyButMask;
        let buttons = u16::from(KeyButMask::BUTTON1)
            | u16::from(KeyButMask::BUTTON2)
            | u16::from(KeyButMask::BUTTON3)
            | u16::from(KeyButMask::BUTTON4)
            | u16::from(KeyButMask::BUTTON5);
        let deadline = Instant::now() + wait;
        loop {
            let (_, held) = self.pointer_state()?;
            if held & buttons == 0 {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn clamp16(v: i32) -> i16 {
    v.clamp(i16::MIN as i32, i16::MAX as i32) as i16
}
