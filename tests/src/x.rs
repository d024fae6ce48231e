//! Real X servers for the display tests: Xvfb on a display it picks itself (`-displayfd`), an
//! optional window manager, and small x11rb helpers to draw known pixels and watch what input
//! a window receives.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use x11rb::connection::Connection;
use x11rb::protocol::Event;
use x11rb::protocol::xproto::{ConnectionExt as _, CreateWindowAux, EventMask, WindowClass};
use x11rb::rust_connection::RustConnection;

/// An Xvfb (and maybe xfwm4) that is killed on drop.
pub struct XServer {
    pub display: String,
    xvfb: Child,
    wm: Option<Child>,
    pub width: u16,
    pub height: u16,
}

impl XServer {
    pub fn start(width: u16, height: u16) -> XServer {
        XServer::start_with(width, height, &[])
    }

    /// An Xvfb given extra arguments (e.g. `-extension DAMAGE` to run without one).
    pub fn start_with(width: u16, height: u16, extra: &[&str]) -> XServer {
        let (read, write) = nix::unistd::pipe().expect("pipe");
        let fd = write.as_raw_fd();
        let xvfb = Command::new("Xvfb")
            .args([
                "-displayfd",
                &fd.to_string(),
                "-nolisten",
                "tcp",
                "-noreset",
                "-screen",
                "0",
            ])
            .arg(format!("{width}x{height}x24"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Xvfb (apt install xvfb)");
        drop(write);
        let mut number = String::new();
        let mut f = std::fs::File::from(read);
        let mut buf = [0u8; 16];
        let deadline = Instant::now() + Duration::from_secs(20);
        while !number.ends_with('\n') {
            assert!(Instant::now() < deadline, "Xvfb did not report its display");
            let n = f.read(&mut buf).expect("read -displayfd");
            assert!(n > 0, "Xvfb exited before reporting its display");
            number.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        XServer {
            display: format!(":{}", number.trim()),
            xvfb,
            wm: None,
            width,
            height,
        }
    }

    /// The X server's process id (to account its CPU time).
    pub fn pid(&self) -> u32 {
        self.xvfb.id()
    }

    /// Kills the server and starts a new one on the same display number (an X restart).
    /// `-noreset` keeps the server from regenerating when its last client leaves: without it
    /// the readiness probe's own disconnect resets the server and the next connect is refused.
    pub fn restart(&mut self) {
        let _ = self.xvfb.kill();
        let _ = self.xvfb.wait();
        let n = self.display.trim_start_matches(':').to_string();
        let lock = format!("/tmp/.X{n}-lock");
        let _ = std::fs::remove_file(&lock);
        self.xvfb = Command::new("Xvfb")
            .arg(&self.display)
            .args(["-nolisten", "tcp", "-noreset", "-screen", "0"])
            .arg(format!("{}x{}x24", self.width, self.height))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Xvfb");
        crate::wait_until("the new X server", Duration::from_secs(20), || {
            RustConnection::connect(Some(&self.display)).is_ok()
        });
    }

    /// Starts xfwm4 (compositor off) on a session bus of its own and waits until it owns the
    /// WM selection.
    pub fn with_wm(mut self) -> XServer {
        let wm = Command::new("dbus-run-session")
            .args([
                "--",
                "xfwm4",
                "--compositor=off",
                "--display",
                &self.display,
            ])
            .env("DISPLAY", &self.display)
            // No accessibility bridge: it would have D-Bus start an AT-SPI launcher (and its
            // bus) on the session bus, outliving the test.
            .env("NO_AT_BRIDGE", "1")
            // Its own group, so the bus daemon and whatever it starts end with it.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("xfwm4 (apt install xfwm4 dbus-x11)");
        self.wm = Some(wm);
        let c = self.connect();
        let sel = c
            .intern_atom(false, b"WM_S0")
            .unwrap()
            .reply()
            .unwrap()
            .atom;
        crate::wait_until(
            "xfwm4 to own the WM selection",
            Duration::from_secs(20),
            || c.get_selection_owner(sel).unwrap().reply().unwrap().owner != 0,
        );
        self
    }

    pub fn connect(&self) -> RustConnection {
        RustConnection::connect(Some(&self.display))
            .expect("connect to the test display")
            .0
    }
}

impl Drop for XServer {
    fn drop(&mut self) {
        if let Some(wm) = &mut self.wm {
            // dbus-run-session killed alone would leave its bus daemon behind.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(wm.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = wm.wait();
        }
        let _ = self.xvfb.kill();
        let _ = self.xvfb.wait();
    }
}

/// A window of one solid colour at an exact position (override-redirect: no window manager
/// moves it). Returns the connection that keeps it alive and the window id.
pub fn solid_window(
    x: &XServer,
    rect: (i16, i16, u16, u16),
    rgb: u32,
    events: EventMask,
) -> (RustConnection, u32) {
    let c = x.connect();
    let root = c.setup().roots[0].root;
    let w = c.generate_id().unwrap();
    c.create_window(
        0,
        w,
        root,
        rect.0,
        rect.1,
        rect.2,
        rect.3,
        0,
        WindowClass::INPUT_OUTPUT,
        0,
        &CreateWindowAux::new()
            .background_pixel(rgb)
            .override_redirect(1)
            .event_mask(events | EventMask::EXPOSURE),
    )
    .unwrap();
    c.map_window(w).unwrap();
    c.flush().unwrap();
    // Mapped and drawn once the server has processed everything above.
    c.get_input_focus().unwrap().reply().unwrap();
    (c, w)
}

/// Events a window receives, collected until `done` says enough (or the deadline).
pub fn collect_events(
    c: &RustConnection,
    timeout: Duration,
    mut done: impl FnMut(&[Event]) -> bool,
) -> Vec<Event> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    while !done(&out) {
        assert!(
            Instant::now() < deadline,
            "timed out collecting X events: {out:?}"
        );
        match c.poll_for_event().unwrap() {
            Some(Event::Expose(_)) => {}
            Some(e) => out.push(e),
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    out
}

/// Decodes a PNG into (width, height, RGB bytes).
pub fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    let mut d = png::Decoder::new(std::io::Cursor::new(bytes));
    d.set_transformations(png::Transformations::EXPAND);
    let mut r = d.read_info().expect("a PNG");
    let mut buf = vec![0; r.output_buffer_size().expect("PNG size")];
    let info = r.next_frame(&mut buf).expect("PNG frame");
    assert_eq!(info.color_type, png::ColorType::Rgb, "an RGB PNG");
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// The RGB pixel at (x, y) of a decoded image.
pub fn pixel(img: &(u32, u32, Vec<u8>), x: u32, y: u32) -> [u8; 3] {
    let i = ((y * img.0 + x) * 3) as usize;
    [img.2[i], img.2[i + 1], img.2[i + 2]]
}

/// Repaints a window in another solid colour; returns once the server has drawn it.
pub fn recolour(c: &RustConnection, w: u32, rgb: u32) {
    use x11rb::protocol::xproto::ChangeWindowAttributesAux;
    c.change_window_attributes(w, &ChangeWindowAttributesAux::new().background_pixel(rgb))
        .unwrap();
    c.clear_area(false, w, 0, 0, 0, 0).unwrap();
    c.get_input_focus().unwrap().reply().unwrap();
}

/// Fills a window with noise (different for every `seed`): the hardest picture to compress.
/// Returns once the server has drawn it.
pub fn paint_noise(c: &RustConnection, w: u32, width: u16, height: u16, seed: u64) {
    use x11rb::protocol::xproto::{CreateGCAux, ImageFormat};
    let gc = c.generate_id().unwrap();
    c.create_gc(gc, w, &CreateGCAux::new()).unwrap();
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let strip = 16u16;
    let mut y = 0u16;
    while y < height {
        let rows = strip.min(height - y);
        let mut data = vec![0u8; width as usize * rows as usize * 4];
        for chunk in data.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bytes = state.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        c.put_image(
            ImageFormat::Z_PIXMAP,
            w,
            gc,
            width,
            rows,
            0,
            y as i16,
            0,
            24,
            &data,
        )
        .unwrap();
        y += rows;
    }
    c.free_gc(gc).unwrap();
    c.get_input_focus().unwrap().reply().unwrap();
}
