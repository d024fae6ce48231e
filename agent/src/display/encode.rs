//! Turning a captured frame into PNG, JPEG or WebP, with an optional scale. Picked by
//! measurement: the `png` crate's fdeflate mode, libjpeg-turbo for JPEG (it reads BGRX as
//! captured, no conversion), libwebp for lossy WebP, `fast_image_resize` for scaling.

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::DisplayError;
use super::capture::Frame;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Png,
    Jpeg,
    Webp,
}

impl Format {
    pub fn parse(s: &str) -> Option<Format> {
        match s.to_ascii_lowercase().as_str() {
            "png" => Some(Format::Png),
            "jpeg" | "jpg" => Some(Format::Jpeg),
            "webp" => Some(Format::Webp),
            _ => None,
        }
    }

    pub fn mime(self) -> &'static str {
        match self {
            Format::Png => "image/png",
            Format::Jpeg => "image/jpeg",
            Format::Webp => "image/webp",
        }
    }
}

/// PNG effort. `fastest` (the default) is fdeflate with the Up filter: on a busy 1080p
/// desktop here ~8 ms and 770 KB; `fast` adds adaptive filtering for ~12% less at ~22 ms;
/// `balanced` and `high` are zlib levels 6 and 9.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PngCompression {
    None,
    Fastest,
    Fast,
    Balanced,
    High,
}

impl PngCompression {
    pub fn parse(s: &str) -> Option<PngCompression> {
        Some(match s.to_ascii_lowercase().as_str() {
            "none" | "0" => PngCompression::None,
            "fastest" | "1" => PngCompression::Fastest,
            "fast" | "2" | "3" => PngCompression::Fast,
            "balanced" | "default" | "4" | "5" | "6" => PngCompression::Balanced,
            "high" | "best" | "7" | "8" | "9" => PngCompression::High,
            _ => return None,
        })
    }

    fn png(self) -> png::Compression {
        match self {
            PngCompression::None => png::Compression::NoCompression,
            PngCompression::Fastest => png::Compression::Fastest,
            PngCompression::Fast => png::Compression::Fast,
            PngCompression::Balanced => png::Compression::Balanced,
            PngCompression::High => png::Compression::High,
        }
    }
}

/// How to encode: the parts of a screenshot request that change the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Encoding {
    pub format: Format,
    /// JPEG and WebP quality, 1–100.
    pub quality: u8,
    pub compression: PngCompression,
}

impl Default for Encoding {
    fn default() -> Self {
        Encoding {
            format: Format::Png,
            quality: 80,
            compression: PngCompression::Fastest,
        }
    }
}

impl Encoding {
    /// The encoding a screenshot request asks for (`format`, `quality`, `compression`),
    /// checked: shared by `GET /v1/screenshot`, `POST /v1/input` and the MCP `screenshot` tool.
    pub fn parse(
        format: Option<&str>,
        quality: Option<u8>,
        compression: Option<&str>,
    ) -> Result<Encoding, String> {
        let mut e = Encoding::default();
        if let Some(f) = format {
            e.format =
                Format::parse(f).ok_or_else(|| format!("format {f:?}: png, jpeg or webp"))?;
        }
        if let Some(q) = quality {
            if !(1..=100).contains(&q) {
                return Err("quality must be 1-100".into());
            }
            e.quality = q;
        }
        if let Some(c) = compression {
            e.compression = PngCompression::parse(c).ok_or_else(|| {
                format!("compression {c:?}: none, fastest, fast, balanced, high or 0-9")
            })?;
        }
        Ok(e)
    }
}

/// Keeps what is worth keeping between encodes (the JPEG compressor, scratch buffers).
#[derive(Default)]
pub struct Encoder {
    jpeg: Option<turbojpeg::Compressor>,
    rgb: Vec<u8>,
}

impl Encoder {
    pub fn encode(&mut self, frame: &Frame, enc: Encoding) -> Result<Vec<u8>, DisplayError> {
        match enc.format {
            Format::Png => {
                bgrx_to_rgb(&frame.bgrx, &mut self.rgb);
                png_rgb(&self.rgb, frame.width, frame.height, enc.compression)
            }
            Format::Jpeg => self.jpeg(frame, enc.quality),
            Format::Webp => webp_bgrx(frame, enc.quality),
        }
    }

    fn jpeg(&mut self, frame: &Frame, quality: u8) -> Result<Vec<u8>, DisplayError> {
        if self.jpeg.is_none() {
            self.jpeg = Some(
                turbojpeg::Compressor::new()
                    .map_err(|e| DisplayError::Encode(format!("libjpeg-turbo: {e}")))?,
            );
        }
        let c = self.jpeg.as_mut().expect("compressor just made");
        c.set_quality(quality.clamp(1, 100) as i32);
        c.set_subsamp(turbojpeg::Subsamp::Sub2x2);
        let image = turbojpeg::Image {
            pixels: frame.bgrx.as_slice(),
            width: frame.width as usize,
            pitch: frame.width as usize * 4,
            height: frame.height as usize,
            format: turbojpeg::PixelFormat::BGRX,
        };
        c.compress_to_vec(image)
            .map_err(|e| DisplayError::Encode(format!("libjpeg-turbo: {e}")))
    }
}

/// BGRX (as X gives it) to packed RGB.
pub fn bgrx_to_rgb(src: &[u8], dst: &mut Vec<u8>) {
    let pixels = src.len() / 4;
    dst.clear();
    dst.resize(pixels * 3, 0);
    for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(3)) {
        d[0] = s[2];
        d[1] = s[1];
        d[2] = s[0];
    }
}

fn png_rgb(rgb: &[u8], w: u32, h: u32, c: PngCompression) -> Result<Vec<u8>, DisplayError> {
    let mut out = Vec::with_capacity(rgb.len() / 4);
    {
        let mut e = png::Encoder::new(&mut out, w, h);
        e.set_color(png::ColorType::Rgb);
        e.set_depth(png::BitDepth::Eight);
        e.set_compression(c.png());
        let mut writer = e
            .write_header()
            .map_err(|e| DisplayError::Encode(format!("png: {e}")))?;
        writer
            .write_image_data(rgb)
            .map_err(|e| DisplayError::Encode(format!("png: {e}")))?;
    }
    Ok(out)
}

/// Lossy WebP straight from BGRX, at libwebp's fastest method (measured here: method 4,
/// the default, takes ~130 ms for a 1080p desktop; method 0 a fraction of that).
fn webp_bgrx(frame: &Frame, quality: u8) -> Result<Vec<u8>, DisplayError> {
    use libwebp_sys::*;
    let err = |what: &str| DisplayError::Encode(format!("libwebp: {what}"));
    let mut config = WebPConfig::new_with_preset(
        WebPPreset::WEBP_PRESET_DEFAULT,
        quality.clamp(1, 100) as f32,
    )
    .map_err(|_| err("config"))?;
    config.method = 0;
    config.thread_level = 1;
    let mut pic = WebPPicture::new().map_err(|_| err("picture"))?;
    pic.width = frame.width as i32;
    pic.height = frame.height as i32;
    let mut writer = std::mem::MaybeUninit::<WebPMemoryWriter>::uninit();
    // SAFETY: libwebp's documented sequence: init the writer, import pixels (w*h*4 bytes with
    // a stride of w*4), encode into the writer, copy, then free picture and writer.
    unsafe {
        WebPMemoryWriterInit(writer.as_mut_ptr());
        let mut writer = writer.assume_init();
        if WebPPictureImportBGRX(&mut pic, frame.bgrx.as_ptr(), (frame.width * 4) as i32) == 0 {
            WebPPictureFree(&mut pic);
            return Err(err("import"));
        }
        pic.writer = Some(WebPMemoryWrite);
        pic.custom_ptr = (&mut writer as *mut WebPMemoryWriter).cast();
        let ok = WebPEncode(&config, &mut pic) != 0;
        let bytes = if ok && !writer.mem.is_null() {
            std::slice::from_raw_parts(writer.mem, writer.size).to_vec()
        } else {
            Vec::new()
        };
        WebPMemoryWriterClear(&mut writer);
        WebPPictureFree(&mut pic);
        if bytes.is_empty() {
            return Err(err("encode"));
        }
        Ok(bytes)
    }
}

/// Scales a frame to `w` x `h` with a Lanczos filter.
pub fn scale(frame: &Frame, w: u32, h: u32) -> Result<Frame, DisplayError> {
    if w == frame.width && h == frame.height {
        return Ok(Frame {
            width: w,
            height: h,
            bgrx: frame.bgrx.clone(),
        });
    }
    let src = ImageRef::new(frame.width, frame.height, &frame.bgrx, PixelType::U8x4)
        .map_err(|e| DisplayError::Encode(format!("scale: {e}")))?;
    let mut dst = Image::new(w, h, PixelType::U8x4);
    // The fourth byte is padding, not alpha: no premultiplication.
    let opts = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Lanczos3))
        .use_alpha(false);
    Resizer::new()
        .resize(&src, &mut dst, &opts)
        .map_err(|e| DisplayError::Encode(format!("scale: {e}")))?;
    Ok(Frame {
        width: w,
        height: h,
        bgrx: dst.into_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(w: u32, h: u32) -> Frame {
        let mut bgrx = Vec::new();
        for y in 0..h {
            for x in 0..w {
                bgrx.extend_from_slice(&[(x * 7) as u8, (y * 5) as u8, (x + y) as u8, 0]);
            }
        }
        Frame {
            width: w,
            height: h,
            bgrx,
        }
    }

    #[test]
    fn bgrx_becomes_rgb() {
        let mut rgb = Vec::new();
        bgrx_to_rgb(&[1, 2, 3, 0, 4, 5, 6, 0], &mut rgb);
        assert_eq!(rgb, vec![3, 2, 1, 6, 5, 4]);
    }

    #[test]
    fn every_format_encodes_with_its_magic() {
        let f = sample(64, 48);
        let mut e = Encoder::default();
        for (format, magic) in [
            (Format::Png, &b"\x89PNG"[..]),
            (Format::Jpeg, &b"\xff\xd8\xff"[..]),
            (Format::Webp, &b"RIFF"[..]),
        ] {
            let bytes = e
                .encode(
                    &f,
                    Encoding {
                        format,
                        ..Default::default()
                    },
                )
                .unwrap();
            assert!(bytes.starts_with(magic), "{format:?}");
        }
    }

    #[test]
    fn scaling_keeps_colours_and_ignores_the_padding_byte() {
        let f = Frame {
            width: 8,
            height: 8,
            bgrx: [10u8, 20, 30, 0].repeat(64),
        };
        let s = scale(&f, 4, 4).unwrap();
        assert_eq!((s.width, s.height), (4, 4));
        assert!(s.bgrx.chunks(4).all(|p| p[..3] == [10, 20, 30]));
    }
}
