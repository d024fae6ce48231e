//! Reading the screen: MIT-SHM with a server-allocated segment (the server hands us a file
//! descriptor to map; reused across captures, grown on resize, released on drop), plain
//! GetImage when SHM is unavailable, and the XFixes cursor composited where the pointer is.

use std::os::fd::{AsRawFd, OwnedFd};

use x11rb::connection::Connection;
use x11rb::protocol::shm::ConnectionExt as _;
use x11rb::protocol::xfixes::ConnectionExt as _;
use x11rb::protocol::xproto::{ConnectionExt as _, ImageFormat};

use super::DisplayError;
use super::conn::XConn;

/// A captured area in BGRX byte order (4 bytes a pixel, tightly packed rows).
pub struct Frame {
    pub width: u32,
    pub height: u32,
    pub bgrx: Vec<u8>,
}

/// The pointer's image and where it is drawn.
#[derive(Debug, Clone)]
pub struct Cursor {
    /// Pointer position on the screen.
    pub x: i32,
    pub y: i32,
    pub xhot: i32,
    pub yhot: i32,
    pub width: u32,
    pub height: u32,
    /// Premultiplied ARGB, one u32 a pixel.
    pub argb: Vec<u32>,
    pub serial: u32,
}

/// A shared-memory segment the server allocated and we mapped.
struct Segment {
    id: u32,
    ptr: *mut u8,
    len: usize,
    _fd: OwnedFd,
}

// SAFETY: the mapping is only touched while the owning `ShmCapture` is borrowed mutably.
unsafe impl Send for Segment {}

#[derive(Default)]
pub struct ShmCapture {
    segment: Option<Segment>,
    /// SHM failed once (no extension, no fd passing): plain GetImage from then on.
    disabled: bool,
}

impl ShmCapture {
    /// Captures the rectangle (x, y, w, h) of the root window.
    pub fn capture(
        &mut self,
        x: &XConn,
        rect: (i16, i16, u16, u16),
        buf: &mut Vec<u8>,
    ) -> Result<(), DisplayError> {
        if x.bits_per_pixel != 32 {
            return Err(DisplayError::Unsupported(format!(
                "the screen uses {} bits per pixel; only 32 is supported",
                x.bits_per_pixel
            )));
        }
        let need = rect.2 as usize * rect.3 as usize * 4;
        if !self.disabled {
            match self.capture_shm(x, rect, need, buf) {
                Ok(()) => return Ok(()),
                Err(e @ DisplayError::Connection(_)) => return Err(e),
                Err(e) => {
                    tracing::info!(error = %e, "MIT-SHM capture unavailable; using GetImage");
                    self.release(x);
                    self.disabled = true;
                }
            }
        }
        let reply = x
            .conn
            .get_image(
                ImageFormat::Z_PIXMAP,
                x.root,
                rect.0,
                rect.1,
                rect.2,
                rect.3,
                !0,
            )?
            .reply()?;
        if reply.data.len() < need {
            return Err(DisplayError::Capture("short image".into()));
        }
        buf.clear();
        buf.extend_from_slice(&reply.data[..need]);
        Ok(())
    }

    fn capture_shm(
        &mut self,
        x: &XConn,
        rect: (i16, i16, u16, u16),
        need: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), DisplayError> {
        if self.segment.as_ref().is_none_or(|s| s.len < need) {
            self.release(x);
            let (w, h) = x.screen_size()?;
            // Size for the whole screen so region captures and resizes rarely reallocate.
            let len = need.max(w as usize * h as usize * 4);
            self.segment = Some(create_segment(x, len)?);
        }
        let seg = self.segment.as_ref().expect("segment just made");
        x.conn
            .shm_get_image(
                x.root,
                rect.0,
                rect.1,
                rect.2,
                rect.3,
                !0,
                ImageFormat::Z_PIXMAP.into(),
                seg.id,
                0,
            )?
            .reply()?;
        // SAFETY: the mapping is `seg.len` bytes long and `need <= seg.len`; the server wrote
        // the image before answering.
        let pixels = unsafe { std::slice::from_raw_parts(seg.ptr, need) };
        buf.clear();
        buf.extend_from_slice(pixels);
        Ok(())
    }

    /// Detaches and unmaps the segment (on reconnect, resize and drop).
    pub fn release(&mut self, x: &XConn) {
        if let Some(seg) = self.segment.take() {
            let _ = x.conn.shm_detach(seg.id);
            let _ = x.conn.flush();
            unmap(&seg);
        }
    }

    /// Forgets the segment without talking to the server (the connection is gone).
    pub fn forget(&mut self) {
        if let Some(seg) = self.segment.take() {
            unmap(&seg);
        }
    }
}

impl Drop for ShmCapture {
    fn drop(&mut self) {
        self.forget();
    }
}

fn unmap(seg: &Segment) {
    // SAFETY: unmapping exactly the region we mapped.
    unsafe {
        libc::munmap(seg.ptr.cast(), seg.len);
    }
}

fn create_segment(x: &XConn, len: usize) -> Result<Segment, DisplayError> {
    let version = x.conn.shm_query_version()?.reply()?;
    if (version.major_version, version.minor_version) < (1, 2) {
        return Err(DisplayError::Unsupported(format!(
            "MIT-SHM {}.{} has no server-allocated segments",
            version.major_version, version.minor_version
        )));
    }
    let id = x.conn.generate_id()?;
    let reply = x.conn.shm_create_segment(id, len as u32, false)?.reply()?;
    let fd = reply.shm_fd;
    // SAFETY: mapping a descriptor the server created for us, `len` bytes, shared.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        let _ = x.conn.shm_detach(id);
        return Err(DisplayError::Capture(format!(
            "mmap of the SHM segment: {e}"
        )));
    }
    Ok(Segment {
        id,
        ptr: ptr.cast(),
        len,
        _fd: fd,
    })
}

/// The current cursor image and pointer position.
pub fn cursor(x: &XConn) -> Result<Cursor, DisplayError> {
    let r = x.conn.xfixes_get_cursor_image()?.reply()?;
    Ok(Cursor {
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

/// Draws `cursor` onto `frame`, whose top-left corner is at screen position `origin`: the
/// cursor's hotspot lands on the pointer, and its premultiplied alpha is honoured.
pub fn composite_cursor(frame: &mut Frame, origin: (i32, i32), cursor: &Cursor) {
    let left = cursor.x - cursor.xhot - origin.0;
    let top = cursor.y - cursor.yhot - origin.1;
    for cy in 0..cursor.height as i32 {
        let fy = top + cy;
        if fy < 0 || fy >= frame.height as i32 {
            continue;
        }
        for cx in 0..cursor.width as i32 {
            let fx = left + cx;
            if fx < 0 || fx >= frame.width as i32 {
                continue;
            }
            let p = cursor.argb[(cy as u32 * cursor.width + cx as u32) as usize];
            let a = p >> 24;
            if a == 0 {
                continue;
            }
            let i = (fy as usize * frame.width as usize + fx as usize) * 4;
            let px = &mut frame.bgrx[i..i + 4];
            let inv = 255 - a;
            // Premultiplied "over": out = src + dst * (1 - alpha).
            let blend =
                |src: u32, dst: u8| -> u8 { (src + (dst as u32 * inv + 127) / 255).min(255) as u8 };
            px[0] = blend(p & 0xff, px[0]);
            px[1] = blend((p >> 8) & 0xff, px[1]);
            px[2] = blend((p >> 16) & 0xff, px[2]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(w: u32, h: u32, fill: [u8; 4]) -> Frame {
        Frame {
            width: w,
            height: h,
            bgrx: fill.repeat((w * h) as usize),
        }
    }

    #[test]
    fn the_cursor_lands_hotspot_first_with_alpha() {
        let mut f = frame(10, 10, [100, 100, 100, 0]);
        // A 2x2 cursor: opaque red, half-transparent white, transparent, opaque black.
        let cursor = Cursor {
            x: 5,
            y: 5,
            xhot: 1,
            yhot: 1,
            width: 2,
            height: 2,
            argb: vec![0xffff0000, 0x80808080, 0x00000000, 0xff000000],
            serial: 1,
        };
        composite_cursor(&mut f, (0, 0), &cursor);
        let at = |x: usize, y: usize| &f.bgrx[(y * 10 + x) * 4..(y * 10 + x) * 4 + 3];
        assert_eq!(at(4, 4), [0, 0, 255], "red at pointer - hotspot");
        assert_eq!(at(5, 4), [178, 178, 178], "half white over grey");
        assert_eq!(at(4, 5), [100, 100, 100], "transparent leaves the screen");
        assert_eq!(at(5, 5), [0, 0, 0]);
        assert_eq!(at(6, 6), [100, 100, 100]);
    }

    #[test]
    fn a_cursor_off_the_frame_is_clipped() {
        let mut f = frame(4, 4, [1, 2, 3, 0]);
        let cursor = Cursor {
            x: 0,
            y: 0,
            xhot: 3,
            yhot: 3,
            width: 4,
            height: 4,
            argb: vec![0xffffffff; 16],
            serial: 1,
        };
        composite_cursor(&mut f, (0, 0), &cursor);
        assert_eq!(&f.bgrx[0..3], &[255, 255, 255]);
        assert_eq!(&f.bgrx[4..7], &[1, 2, 3]);
        // Region captures offset the cursor by their origin.
        let mut g = frame(4, 4, [1, 2, 3, 0]);
        let c2 = Cursor {
            x: 10,
            y: 10,
            xhot: 0,
            yhot: 0,
            ..cursor
        };
        composite_cursor(&mut g, (9, 9), &c2);
        assert_eq!(&g.bgrx[(4 + 1) * 4..(4 + 1) * 4 + 3], &[255, 255, 255]);
    }
}
