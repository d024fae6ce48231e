//! Changing the screen's size live through RandR 1.2+, as `xrandr --newmode/--addmode/--output
//! --mode --fb` does: the mode is found among the server's (or created and added to the
//! output), the screen grows before the CRTC takes a larger mode and shrinks after it took a
//! smaller one, so the CRTC always fits in the screen; then the root window's size is read back.
//! Xvnc (TigerVNC) reallocates its framebuffer on SetScreenSize and tells its viewers
//! (DesktopSize); window managers and panels hear RRScreenChangeNotify.

use std::time::{Duration, Instant};

use x11rb::connection::RequestConnection as _;
use x11rb::protocol::randr::{self, ConnectionExt as _, ModeFlag, ModeInfo, SetConfig};

use super::DisplayError;
use super::conn::XConn;

/// The smallest and largest sizes the agent asks of a server, whatever more the server allows
/// (7680x4320 is 8K; the controller's `screen` has the same bounds).
pub use berth_protocol::controller::{SCREEN_MAX as MAX_SIZE, SCREEN_MIN as MIN_SIZE};

/// How long the server may take to report the new size.
const SETTLE: Duration = Duration::from_secs(5);

/// Whether `want` may be asked of a server whose RandR range is `server_min..=server_max`:
/// the reason when not.
pub fn check_size(
    want: (u32, u32),
    server_min: (u32, u32),
    server_max: (u32, u32),
) -> Result<(), String> {
    let lo = (MIN_SIZE.0.max(server_min.0), MIN_SIZE.1.max(server_min.1));
    let hi = (MAX_SIZE.0.min(server_max.0), MAX_SIZE.1.min(server_max.1));
    let (w, h) = want;
    if w < lo.0 || h < lo.1 || w > hi.0 || h > hi.1 {
        return Err(format!(
            "{w}x{h} is outside the sizes this screen takes ({}x{} to {}x{})",
            lo.0, lo.1, hi.0, hi.1
        ));
    }
    // The recorder's I420 pictures and most encoders work in pairs of pixels.
    if w % 2 != 0 || h % 2 != 0 {
        return Err(format!("{w}x{h}: width and height must be even"));
    }
    Ok(())
}

/// One step of a resize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// SetScreenSize to this size.
    Screen(u32, u32),
    /// SetCrtcConfig to the mode of the new size.
    Crtc,
}

/// The order of a resize from a `current` screen to `want`: the CRTC's area must lie inside
/// the screen before and after each step, so the screen first grows to hold both sizes, the
/// CRTC takes its mode, and the screen then shrinks to the new size.
pub fn plan(current: (u32, u32), want: (u32, u32)) -> Vec<Step> {
    let both = (current.0.max(want.0), current.1.max(want.1));
    let mut steps = Vec::new();
    if both != current {
        steps.push(Step::Screen(both.0, both.1));
    }
    steps.push(Step::Crtc);
    if both != want {
        steps.push(Step::Screen(want.0, want.1));
    }
    steps
}

/// CVT reduced-blanking timings at 60 Hz for a mode of `w`x`h` (what `cvt -r` gives, to a
/// few pixels; a virtual framebuffer only needs them to be plausible).
pub fn mode_info(w: u16, h: u16) -> ModeInfo {
    let htotal = w.saturating_add(160);
    let vsync_start = h.saturating_add(3);
    let vsync_end = vsync_start.saturating_add(6);
    // Blanking of at least 460 µs at 60 Hz, at least 6 lines past the sync.
    let line_us = 1e6 / 60.0 / (h as f64 + 30.0);
    let vblank = ((460.0 / line_us).ceil() as u16).max(vsync_end - h + 6);
    let vtotal = h.saturating_add(vblank);
    let name = format!("{w}x{h}");
    ModeInfo {
        id: 0,
        width: w,
        height: h,
        dot_clock: (htotal as u32) * (vtotal as u32) * 60,
        hsync_start: w.saturating_add(48),
        hsync_end: w.saturating_add(80),
        htotal,
        hskew: 0,
        vsync_start,
        vsync_end,
        vtotal,
        name_len: name.len() as u16,
        mode_flags: ModeFlag::HSYNC_POSITIVE | ModeFlag::VSYNC_NEGATIVE,
    }
}

/// Millimetres for `px` pixels at 96 DPI (what Xvnc reports for its own screen).
fn millimetres(px: u32) -> u32 {
    ((px as f64) * 25.4 / 96.0).round().max(1.0) as u32
}

/// Whether the server speaks RandR 1.2 or later; the reason when not.
pub fn available(x: &XConn) -> Result<(), DisplayError> {
    if x.conn
        .extension_information(randr::X11_EXTENSION_NAME)?
        .is_none()
    {
        return Err(DisplayError::NoRandr(
            "the X server has no RANDR extension".into(),
        ));
    }
    let v = x.conn.randr_query_version(1, 3)?.reply()?;
    if (v.major_version, v.minor_version) < (1, 2) {
        return Err(DisplayError::NoRandr(format!(
            "the X server speaks RandR {}.{}; resizing needs 1.2",
            v.major_version, v.minor_version
        )));
    }
    Ok(())
}

/// Resizes the screen to `want` and waits until the root window has that size.
pub fn resize(x: &XConn, want: (u32, u32)) -> Result<(), DisplayError> {
    available(x)?;
    let range = x.conn.randr_get_screen_size_range(x.root)?.reply()?;
    check_size(
        want,
        (range.min_width as u32, range.min_height as u32),
        (range.max_width as u32, range.max_height as u32),
    )
    .map_err(DisplayError::Invalid)?;
    let (w, h) = (want.0 as u16, want.1 as u16);
    let res = x.conn.randr_get_screen_resources_current(x.root)?.reply()?;

    let (output, info) = choose_output(x, &res)?;
    let crtc = match info.crtc {
        0 => *info
            .crtcs
            .first()
            .ok_or_else(|| DisplayError::NoRandr("the screen's output can use no CRTC".into()))?,
        c => c,
    };
    let mode = mode_for(x, &res, output, &info, (w, h))?;

    let crtc_info = x
        .conn
        .randr_get_crtc_info(crtc, res.config_timestamp)?
        .reply()?;
    // Other CRTCs that would hang off the smaller screen are switched off first.
    switch_off_outside(x, &res, crtc, (w, h))?;
    apply_plan(x, &res, want, crtc, &crtc_info, mode, output)?;
    wait_for_size(x, want)
}

/// The output to drive: the first connected one showing a picture, else the first
/// connected one.
fn choose_output(
    x: &XConn,
    res: &randr::GetScreenResourcesCurrentReply,
) -> Result<(randr::Output, randr::GetOutputInfoReply), DisplayError> {
    let mut chosen = None;
    for &output in &res.outputs {
        let info = x
            .conn
            .randr_get_output_info(output, res.config_timestamp)?
            .reply()?;
        if info.connection != randr::Connection::CONNECTED {
            continue;
        }
        let showing = info.crtc != 0;
        if chosen.is_none() || showing {
            chosen = Some((output, info));
        }
        if showing {
            break;
        }
    }
    chosen
        .ok_or_else(|| DisplayError::NoRandr("RandR reports no connected output to resize".into()))
}

/// The mode of size `w`x`h` for `output`: one of the output's own of that size, else any the
/// server knows, else new; a mode not yet the output's is added to it.
fn mode_for(
    x: &XConn,
    res: &randr::GetScreenResourcesCurrentReply,
    output: randr::Output,
    info: &randr::GetOutputInfoReply,
    (w, h): (u16, u16),
) -> Result<randr::Mode, DisplayError> {
    let of_size = |m: &&ModeInfo| m.width == w && m.height == h;
    let on_output = res
        .modes
        .iter()
        .filter(of_size)
        .find(|m| info.modes.contains(&m.id));
    Ok(match on_output {
        Some(m) => m.id,
        None => {
            let id = match res.modes.iter().find(of_size) {
                Some(m) => m.id,
                None => {
                    let name = format!("{w}x{h}");
                    x.conn
                        .randr_create_mode(x.root, mode_info(w, h), name.as_bytes())?
                        .reply()?
                        .mode
                }
            };
            x.conn.randr_add_output_mode(output, id)?.check()?;
            id
        }
    })
}

/// Switches off the CRTCs other than `crtc` that would hang off a `w`x`h` screen.
fn switch_off_outside(
    x: &XConn,
    res: &randr::GetScreenResourcesCurrentReply,
    crtc: randr::Crtc,
    (w, h): (u16, u16),
) -> Result<(), DisplayError> {
    for &other in res.crtcs.iter().filter(|&&c| c != crtc) {
        let o = x
            .conn
            .randr_get_crtc_info(other, res.config_timestamp)?
            .reply()?;
        let fits =
            o.x as i32 + o.width as i32 <= w as i32 && o.y as i32 + o.height as i32 <= h as i32;
        if o.mode != 0 && !fits {
            set_crtc(x, other, res.config_timestamp, (0, 0), 0, o.rotation, &[])?;
        }
    }
    Ok(())
}

/// Takes the screen from its size now to `want` in the order [`plan`] gives, the CRTC
/// `crtc` taking `mode` on `output` on the way.
fn apply_plan(
    x: &XConn,
    res: &randr::GetScreenResourcesCurrentReply,
    want: (u32, u32),
    crtc: randr::Crtc,
    crtc_info: &randr::GetCrtcInfoReply,
    mode: randr::Mode,
    output: randr::Output,
) -> Result<(), DisplayError> {
    let (cur_w, cur_h) = x.screen_size()?;
    for step in plan((cur_w as u32, cur_h as u32), want) {
        match step {
            Step::Screen(sw, sh) => {
                x.conn
                    .randr_set_screen_size(
                        x.root,
                        sw as u16,
                        sh as u16,
                        millimetres(sw),
                        millimetres(sh),
                    )?
                    .check()?;
            }
            Step::Crtc => {
                let rotation = if crtc_info.mode == 0 {
                    randr::Rotation::ROTATE0
                } else {
                    crtc_info.rotation
                };
                set_crtc(
                    x,
                    crtc,
                    res.config_timestamp,
                    (0, 0),
                    mode,
                    rotation,
                    &[output],
                )?;
            }
        }
    }
    Ok(())
}

/// Polls the root window until it is `want` in size, at most [`SETTLE`].
fn wait_for_size(x: &XConn, want: (u32, u32)) -> Result<(), DisplayError> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let now = x.screen_size()?;
        if (now.0 as u32, now.1 as u32) == want {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(DisplayError::Request(format!(
                "the screen is {}x{} {} s after asking for {}x{}",
                now.0,
                now.1,
                SETTLE.as_secs(),
                want.0,
                want.1
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn set_crtc(
    x: &XConn,
    crtc: randr::Crtc,
    config_timestamp: u32,
    at: (i16, i16),
    mode: randr::Mode,
    rotation: randr::Rotation,
    outputs: &[randr::Output],
) -> Result<(), DisplayError> {
    let r = x
        .conn
        .randr_set_crtc_config(
            crtc,
            x11rb::CURRENT_TIME,
            config_timestamp,
            at.0,
            at.1,
            mode,
            rotation,
            outputs,
        )?
        .reply()?;
    if r.status != SetConfig::SUCCESS {
        return Err(DisplayError::Request(format!(
            "RandR refused the CRTC configuration ({:?})",
            r.status
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked_against_ours_and_the_servers() {
        let server = ((32, 32), (32768, 32768));
        assert!(check_size((1280, 800), server.0, server.1).is_ok());
        assert!(check_size((320, 200), server.0, server.1).is_ok());
        assert!(check_size((7680, 4320), server.0, server.1).is_ok());
        assert!(check_size((318, 800), server.0, server.1).is_err());
        assert!(check_size((1280, 198), server.0, server.1).is_err());
        assert!(check_size((7682, 800), server.0, server.1).is_err());
        assert!(check_size((0, 0), server.0, server.1).is_err());
        let odd = check_size((1281, 800), server.0, server.1).unwrap_err();
        assert!(odd.contains("even"), "{odd}");
        // A server with a smaller maximum bounds it.
        let small = check_size((4096, 2160), (320, 200), (4096, 2048)).unwrap_err();
        assert!(small.contains("4096x2048"), "{small}");
    }

    #[test]
    fn the_crtc_always_fits_in_the_screen() {
        use Step::*;
        assert_eq!(
            plan((1920, 1080), (1280, 800)),
            vec![Crtc, Screen(1280, 800)]
        );
        assert_eq!(
            plan((1280, 800), (1920, 1080)),
            vec![Screen(1920, 1080), Crtc]
        );
        assert_eq!(plan((1280, 800), (1280, 800)), vec![Crtc]);
        // Wider but shorter: the screen holds both on the way.
        assert_eq!(
            plan((1024, 768), (1280, 720)),
            vec![Screen(1280, 768), Crtc, Screen(1280, 720)]
        );
        for (cur, want) in [
            ((1024, 768), (1280, 720)),
            ((1920, 1080), (800, 1200)),
            ((640, 480), (7680, 4320)),
        ] {
            let mut screen = cur;
            let mut crtc = cur;
            for s in plan(cur, want) {
                match s {
                    Screen(w, h) => screen = (w, h),
                    Crtc => crtc = want,
                }
                assert!(
                    crtc.0 <= screen.0 && crtc.1 <= screen.1,
                    "{cur:?} -> {want:?}"
                );
            }
            assert_eq!((screen, crtc), (want, want));
        }
    }

    #[test]
    fn modes_have_plausible_timings() {
        let m = mode_info(1280, 800);
        assert_eq!((m.width, m.height), (1280, 800));
        assert!(m.hsync_start > m.width && m.hsync_end > m.hsync_start && m.htotal > m.hsync_end);
        assert!(m.vsync_start > m.height && m.vsync_end > m.vsync_start && m.vtotal > m.vsync_end);
        let hz = m.dot_clock as f64 / (m.htotal as f64 * m.vtotal as f64);
        assert!((hz - 60.0).abs() < 0.01, "{hz}");
        assert_eq!(m.name_len, 8);
        assert_eq!(millimetres(1920), 508);
    }
}
