//! Fragmented MP4 for one H.264 video track: an init segment (`ftyp` + `moov` with `mvex`)
//! and media fragments (`moof` + `mdat`). Each fragment carries its own decode time and exact
//! sample durations, so a file that stops after any fragment plays up to that fragment, and
//! a screen that stood still for a minute is one sample lasting a minute.
//!
//! Box layouts follow ISO/IEC 14496-12 (the base format) and 14496-15 (`avcC`).

/// Media timescale of the video track: 90 kHz, as for every H.264 track.
pub const TIMESCALE: u32 = 90_000;

/// Movie timescale (`mvhd`, `mehd`): milliseconds.
const MOVIE_TIMESCALE: u32 = 1_000;

/// One encoded picture in a fragment.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Length-prefixed NAL units (4-byte big-endian lengths), parameter sets excluded.
    pub data: Vec<u8>,
    /// In `TIMESCALE` units.
    pub duration: u32,
    /// An IDR picture: decoding can start here.
    pub sync: bool,
}

/// What the init segment needs from the encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackInfo {
    pub width: u32,
    pub height: u32,
    /// Sequence and picture parameter sets, without start codes.
    pub sps: Vec<u8>,
    pub pps: Vec<u8>,
}

/// Where, in the init segment, the `mehd` fragment duration sits (so a finished recording can
/// state its total length up front).
pub struct InitSegment {
    pub bytes: Vec<u8>,
    pub mehd_duration_offset: Option<usize>,
}

fn boxed(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&(body.len() as u32 + 8).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    out
}

/// A "full box" body prefix: version and 24-bit flags.
fn full(version: u8, flags: u32) -> Vec<u8> {
    let mut v = (flags & 0x00ff_ffff).to_be_bytes().to_vec();
    v[0] = version;
    v
}

fn concat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

/// The unity transformation matrix of `mvhd` and `tkhd`.
fn matrix() -> Vec<u8> {
    let m: [u32; 9] = [0x0001_0000, 0, 0, 0, 0x0001_0000, 0, 0, 0, 0x4000_0000];
    m.iter().flat_map(|v| v.to_be_bytes()).collect()
}

fn ftyp() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"isom");
    b.extend_from_slice(&0x200u32.to_be_bytes());
    for brand in [b"isom", b"iso6", b"avc1", b"mp41"] {
        b.extend_from_slice(brand);
    }
    boxed(b"ftyp", &b)
}

fn mvhd() -> Vec<u8> {
    let mut b = full(0, 0);
    b.extend_from_slice(&0u32.to_be_bytes()); // creation time
    b.extend_from_slice(&0u32.to_be_bytes()); // modification time
    b.extend_from_slice(&MOVIE_TIMESCALE.to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes()); // duration: in the fragments
    b.extend_from_slice(&0x0001_0000u32.to_be_bytes()); // rate 1.0
    b.extend_from_slice(&0x0100u16.to_be_bytes()); // volume 1.0
    b.extend_from_slice(&[0; 10]); // reserved
    b.extend_from_slice(&matrix());
    b.extend_from_slice(&[0; 24]); // pre-defined
    b.extend_from_slice(&2u32.to_be_bytes()); // next track id
    boxed(b"mvhd", &b)
}

fn tkhd(info: &TrackInfo) -> Vec<u8> {
    // Flags: enabled, in movie, in preview.
    let mut b = full(0, 0x7);
    b.extend_from_slice(&0u32.to_be_bytes()); // creation time
    b.extend_from_slice(&0u32.to_be_bytes()); // modification time
    b.extend_from_slice(&1u32.to_be_bytes()); // track id
    b.extend_from_slice(&0u32.to_be_bytes()); // reserved
    b.extend_from_slice(&0u32.to_be_bytes()); // duration
    b.extend_from_slice(&[0; 8]); // reserved
    b.extend_from_slice(&0u16.to_be_bytes()); // layer
    b.extend_from_slice(&0u16.to_be_bytes()); // alternate group
    b.extend_from_slice(&0u16.to_be_bytes()); // volume: not audio
    b.extend_from_slice(&0u16.to_be_bytes()); // reserved
    b.extend_from_slice(&matrix());
    b.extend_from_slice(&(info.width << 16).to_be_bytes());
    b.extend_from_slice(&(info.height << 16).to_be_bytes());
    boxed(b"tkhd", &b)
}

fn mdhd() -> Vec<u8> {
    let mut b = full(0, 0);
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&TIMESCALE.to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes());
    // Language "und", packed ISO-639-2/T.
    b.extend_from_slice(&0x55c4u16.to_be_bytes());
    b.extend_from_slice(&0u16.to_be_bytes());
    boxed(b"mdhd", &b)
}

fn hdlr() -> Vec<u8> {
    let mut b = full(0, 0);
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(b"vide");
    b.extend_from_slice(&[0; 12]);
    b.extend_from_slice(b"berth screen\0");
    boxed(b"hdlr", &b)
}

fn avcc(info: &TrackInfo) -> Vec<u8> {
    let sps = &info.sps;
    let mut b = vec![
        1,
        sps.get(1).copied().unwrap_or(66),
        sps.get(2).copied().unwrap_or(0),
        sps.get(3).copied().unwrap_or(31),
        0xff, // 4-byte NAL lengths
        0xe1, // one SPS
    ];
    b.extend_from_slice(&(sps.len() as u16).to_be_bytes());
    b.extend_from_slice(sps);
    b.push(1); // one PPS
    b.extend_from_slice(&(info.pps.len() as u16).to_be_bytes());
    b.extend_from_slice(&info.pps);
    boxed(b"avcC", &b)
}

fn stsd(info: &TrackInfo) -> Vec<u8> {
    let mut entry = vec![0; 6]; // reserved
    entry.extend_from_slice(&1u16.to_be_bytes()); // data reference index
    entry.extend_from_slice(&[0; 16]); // pre-defined, reserved
    entry.extend_from_slice(&(info.width as u16).to_be_bytes());
    entry.extend_from_slice(&(info.height as u16).to_be_bytes());
    entry.extend_from_slice(&0x0048_0000u32.to_be_bytes()); // 72 dpi
    entry.extend_from_slice(&0x0048_0000u32.to_be_bytes());
    entry.extend_from_slice(&0u32.to_be_bytes()); // reserved
    entry.extend_from_slice(&1u16.to_be_bytes()); // one frame per sample
    let mut name = [0u8; 32];
    let label = b"berth h264";
    name[0] = label.len() as u8;
    name[1..=label.len()].copy_from_slice(label);
    entry.extend_from_slice(&name);
    entry.extend_from_slice(&0x0018u16.to_be_bytes()); // depth 24
    entry.extend_from_slice(&0xffffu16.to_be_bytes()); // pre-defined -1
    entry.extend_from_slice(&avcc(info));
    let mut b = full(0, 0);
    b.extend_from_slice(&1u32.to_be_bytes());
    b.extend_from_slice(&boxed(b"avc1", &entry));
    boxed(b"stsd", &b)
}

/// An empty sample table: the samples live in the fragments.
fn stbl(info: &TrackInfo) -> Vec<u8> {
    let empty = |kind: &[u8; 4]| {
        let mut b = full(0, 0);
        b.extend_from_slice(&0u32.to_be_bytes());
        boxed(kind, &b)
    };
    let mut stsz = full(0, 0);
    stsz.extend_from_slice(&0u32.to_be_bytes()); // sample size
    stsz.extend_from_slice(&0u32.to_be_bytes()); // count
    boxed(
        b"stbl",
        &concat(&[
            stsd(info),
            empty(b"stts"),
            empty(b"stsc"),
            boxed(b"stsz", &stsz),
            empty(b"stco"),
        ]),
    )
}

fn minf(info: &TrackInfo) -> Vec<u8> {
    let mut vmhd = full(0, 1);
    vmhd.extend_from_slice(&[0; 8]); // graphics mode, opcolor
    let mut dref = full(0, 0);
    dref.extend_from_slice(&1u32.to_be_bytes());
    dref.extend_from_slice(&boxed(b"url ", &full(0, 1))); // self-contained
    boxed(
        b"minf",
        &concat(&[
            boxed(b"vmhd", &vmhd),
            boxed(b"dinf", &boxed(b"dref", &dref)),
            stbl(info),
        ]),
    )
}

/// `ftyp` + `moov`. With `with_mehd`, the `mvex` carries a fragment duration of 0 that the
/// writer fills in when the recording ends.
pub fn init_segment(info: &TrackInfo, with_mehd: bool) -> InitSegment {
    let trak = boxed(
        b"trak",
        &concat(&[
            tkhd(info),
            boxed(b"mdia", &concat(&[mdhd(), hdlr(), minf(info)])),
        ]),
    );
    let mut trex = full(0, 0);
    trex.extend_from_slice(&1u32.to_be_bytes()); // track id
    trex.extend_from_slice(&1u32.to_be_bytes()); // sample description index
    trex.extend_from_slice(&0u32.to_be_bytes()); // default duration
    trex.extend_from_slice(&0u32.to_be_bytes()); // default size
    trex.extend_from_slice(&0u32.to_be_bytes()); // default flags
    let mut mvex_parts = Vec::new();
    if with_mehd {
        let mut mehd = full(1, 0);
        mehd.extend_from_slice(&0u64.to_be_bytes());
        mvex_parts.push(boxed(b"mehd", &mehd));
    }
    mvex_parts.push(boxed(b"trex", &trex));
    let mvex = boxed(b"mvex", &concat(&mvex_parts));
    let moov = boxed(b"moov", &concat(&[mvhd(), trak, mvex.clone()]));
    let ftyp = ftyp();
    let mehd_duration_offset = with_mehd.then(|| {
        // moov header (8) + mvhd + trak, then mvex header (8), mehd header (8) + version/flags (4).
        ftyp.len() + moov.len() - mvex.len() + 8 + 12
    });
    InitSegment {
        bytes: concat(&[ftyp, moov]),
        mehd_duration_offset,
    }
}

/// Encodes a `mehd` fragment duration (milliseconds, the movie timescale) for patching.
pub fn mehd_duration(duration_90k: u64) -> [u8; 8] {
    (duration_90k * MOVIE_TIMESCALE as u64 / TIMESCALE as u64).to_be_bytes()
}

/// Sample flags (14496-12 §8.8.3.1): a sync sample depends on nothing; any other depends on
/// earlier ones and is marked non-sync.
fn sample_flags(sync: bool) -> u32 {
    if sync { 0x0200_0000 } else { 0x0101_0000 }
}

/// Where, in a `fragment`, its first sample's duration sits (a u32), for patching: `moof`
/// header 8, `mfhd` 16, `traf` header 8, `tfhd` 16, `tfdt` 20, then `trun`'s header 8,
/// version and flags 4, sample count 4 and data offset 4.
pub const FIRST_SAMPLE_DURATION_AT: usize = 8 + 16 + 8 + 16 + 20 + 8 + 4 + 4 + 4;

/// One `moof` + `mdat` holding `samples`, the first decoded at `decode_time` (90 kHz).
pub fn fragment(sequence: u32, decode_time: u64, samples: &[Sample]) -> Vec<u8> {
    let mut mfhd = full(0, 0);
    mfhd.extend_from_slice(&sequence.to_be_bytes());
    // default-base-is-moof: data offsets count from the start of this moof.
    let mut tfhd = full(0, 0x02_0000);
    tfhd.extend_from_slice(&1u32.to_be_bytes());
    let mut tfdt = full(1, 0);
    tfdt.extend_from_slice(&decode_time.to_be_bytes());
    // data offset, sample duration, sample size and sample flags present.
    let trun_len = 8 + 4 + 4 + 4 + samples.len() * 12;
    let traf_len = 8 + (8 + tfhd.len()) + (8 + tfdt.len()) + trun_len;
    let moof_len = 8 + (8 + mfhd.len()) + traf_len;
    let data_offset = (moof_len + 8) as u32;
    let mut trun = full(0, 0x000701);
    trun.extend_from_slice(&(samples.len() as u32).to_be_bytes());
    trun.extend_from_slice(&data_offset.to_be_bytes());
    for s in samples {
        trun.extend_from_slice(&s.duration.to_be_bytes());
        trun.extend_from_slice(&(s.data.len() as u32).to_be_bytes());
        trun.extend_from_slice(&sample_flags(s.sync).to_be_bytes());
    }
    let traf = boxed(
        b"traf",
        &concat(&[
            boxed(b"tfhd", &tfhd),
            boxed(b"tfdt", &tfdt),
            boxed(b"trun", &trun),
        ]),
    );
    let moof = boxed(b"moof", &concat(&[boxed(b"mfhd", &mfhd), traf]));
    debug_assert_eq!(moof.len(), moof_len);
    let payload: usize = samples.iter().map(|s| s.data.len()).sum();
    let mut out = Vec::with_capacity(moof.len() + 8 + payload);
    out.extend_from_slice(&moof);
    out.extend_from_slice(&(payload as u32 + 8).to_be_bytes());
    out.extend_from_slice(b"mdat");
    for s in samples {
        out.extend_from_slice(&s.data);
    }
    out
}

/// What a file made of [`init_segment`] and [`fragment`]s holds, read back from its boxes: the
/// playable prefix and its figures. A torn or inconsistent tail (a fragment cut short by a
/// kill, a `moof` without all of its `mdat`) is not part of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contents {
    /// Bytes of the init segment and every complete fragment after it; 0 when not even the
    /// init segment is whole (nothing plays).
    pub len: u64,
    pub fragments: u32,
    pub samples: u64,
    pub sync_samples: u64,
    /// The samples' durations added up (90 kHz): the file's length in time.
    pub duration: u64,
    /// Where the `mehd` fragment duration sits, when the init segment has one.
    pub mehd_duration_offset: Option<u64>,
}

/// The largest `moov` or `moof` read whole (both are small: a `moof` holds 12 bytes a sample).
const MAX_META_BOX: u64 = 16 << 20;

/// Sibling boxes in `buf`: (kind, body). Stops at the first box that does not fit.
fn walk(buf: &[u8]) -> Vec<([u8; 4], &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 8 <= buf.len() {
        let size = u32::from_be_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
        if size < 8 || size > buf.len() - at {
            break;
        }
        let kind: [u8; 4] = buf[at + 4..at + 8].try_into().expect("4 bytes");
        out.push((kind, &buf[at + 8..at + size]));
        at += size;
    }
    out
}

fn child<'a>(boxes: &[([u8; 4], &'a [u8])], kind: &[u8; 4]) -> Option<&'a [u8]> {
    boxes.iter().find(|b| &b.0 == kind).map(|b| b.1)
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A box header at `at`: (size, kind), when a whole header is there.
fn header_at(file: &std::fs::File, at: u64, len: u64) -> std::io::Result<Option<(u64, [u8; 4])>> {
    use std::os::unix::fs::FileExt;
    if at + 8 > len {
        return Ok(None);
    }
    let mut h = [0u8; 8];
    file.read_exact_at(&mut h, at)?;
    let size = u32::from_be_bytes(h[..4].try_into().expect("4 bytes")) as u64;
    Ok(Some((size, h[4..].try_into().expect("4 bytes"))))
}

/// A whole box at `at` of `kind`, at most `max` bytes: its body.
fn read_box(
    file: &std::fs::File,
    at: u64,
    len: u64,
    kind: &[u8; 4],
    max: u64,
) -> std::io::Result<Option<(u64, Vec<u8>)>> {
    use std::os::unix::fs::FileExt;
    let Some((size, k)) = header_at(file, at, len)? else {
        return Ok(None);
    };
    if &k != kind || size < 8 || size > max || at + size > len {
        return Ok(None);
    }
    let mut body = vec![0u8; size as usize - 8];
    file.read_exact_at(&mut body, at + 8)?;
    Ok(Some((size, body)))
}

/// The init segment's `moov`: where its `mehd` duration sits (relative to the body), after
/// checking it describes the one 90 kHz video track this module writes.
fn read_moov(moov: &[u8]) -> Option<Option<usize>> {
    let kids = walk(moov);
    child(&kids, b"mvhd")?;
    let trak = walk(child(&kids, b"trak")?);
    let mdia = walk(child(&trak, b"mdia")?);
    let mdhd = child(&mdia, b"mdhd")?;
    // Version 0: version/flags, creation, modification, then the timescale.
    if mdhd.first() != Some(&0) || be32(mdhd, 12)? != TIMESCALE {
        return None;
    }
    let mut at = 0;
    for (kind, body) in &kids {
        if kind == b"mvex" {
            let mvex_body = at + 8;
            let mut inner = 0;
            for (k, b) in walk(body) {
                if &k == b"mehd" {
                    return (b.len() >= 12 && b[0] == 1).then_some(Some(mvex_body + inner + 12));
                }
                inner += b.len() + 8;
            }
            return Some(None);
        }
        at += body.len() + 8;
    }
    None
}

/// One fragment's `moof` body, checked against what follows it: (sample count, sync samples,
/// duration, payload bytes), or `None` when it is not one this module wrote as the
/// `sequence`th fragment starting at `decode`.
fn read_moof(
    moof: &[u8],
    moof_size: u64,
    sequence: u32,
    decode: u64,
) -> Option<(u64, u64, u64, u64)> {
    let kids = walk(moof);
    if be32(child(&kids, b"mfhd")?, 4)? != sequence {
        return None;
    }
    let traf = walk(child(&kids, b"traf")?);
    let tfhd = child(&traf, b"tfhd")?;
    if be32(tfhd, 4)? != 1 {
        return None;
    }
    let tfdt = child(&traf, b"tfdt")?;
    if tfdt.first() != Some(&1) || be64(tfdt, 4)? != decode {
        return None;
    }
    let trun = child(&traf, b"trun")?;
    if be32(trun, 0)? & 0x00ff_ffff != 0x000701 {
        return None;
    }
    let count = be32(trun, 4)? as usize;
    if count == 0 || be32(trun, 8)? as u64 != moof_size + 8 || trun.len() != 12 + count * 12 {
        return None;
    }
    let (mut sync, mut duration, mut payload) = (0u64, 0u64, 0u64);
    for i in 0..count {
        let e = 12 + i * 12;
        duration += be32(trun, e)? as u64;
        payload += be32(trun, e + 4)? as u64;
        if be32(trun, e + 8)? == sample_flags(true) {
            sync += 1;
        }
    }
    Some((count as u64, sync, duration, payload))
}

/// Reads back a file this module wrote (see [`Contents`]).
pub fn read_contents(file: &std::fs::File) -> std::io::Result<Contents> {
    let len = file.metadata()?.len();
    let mut out = Contents::default();
    let Some((ftyp_size, _)) = read_box(file, 0, len, b"ftyp", 4096)? else {
        return Ok(out);
    };
    let Some((moov_size, moov)) = read_box(file, ftyp_size, len, b"moov", MAX_META_BOX)? else {
        return Ok(out);
    };
    let Some(mehd) = read_moov(&moov) else {
        return Ok(out);
    };
    out.len = ftyp_size + moov_size;
    out.mehd_duration_offset = mehd.map(|at| ftyp_size + 8 + at as u64);
    let mut sequence = 1u32;
    loop {
        let at = out.len;
        let Some((moof_size, moof)) = read_box(file, at, len, b"moof", MAX_META_BOX)? else {
            break;
        };
        let Some((samples, sync, duration, payload)) =
            read_moof(&moof, moof_size, sequence, out.duration)
        else {
            break;
        };
        match header_at(file, at + moof_size, len)? {
            Some((size, kind))
                if &kind == b"mdat" && size == payload + 8 && at + moof_size + size <= len => {}
            _ => break,
        }
        out.len = at + moof_size + payload + 8;
        out.fragments += 1;
        out.samples += samples;
        out.sync_samples += sync;
        out.duration += duration;
        sequence = sequence.wrapping_add(1);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks sibling boxes: (kind, body range).
    fn children(buf: &[u8]) -> Vec<([u8; 4], std::ops::Range<usize>)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at + 8 <= buf.len() {
            let len = u32::from_be_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
            let kind: [u8; 4] = buf[at + 4..at + 8].try_into().unwrap();
            assert!(len >= 8 && at + len <= buf.len(), "box {kind:?} overruns");
            out.push((kind, at + 8..at + len));
            at += len;
        }
        assert_eq!(at, buf.len(), "trailing bytes");
        out
    }

    fn info() -> TrackInfo {
        TrackInfo {
            width: 1920,
            height: 1080,
            sps: vec![0x67, 0x42, 0xc0, 0x28, 0xaa],
            pps: vec![0x68, 0xce, 0x3c, 0x80],
        }
    }

    #[test]
    fn the_init_segment_nests_and_the_mehd_offset_points_at_its_duration() {
        let init = init_segment(&info(), true);
        let top = children(&init.bytes);
        assert_eq!(&top[0].0, b"ftyp");
        assert_eq!(&top[1].0, b"moov");
        let moov = children(&init.bytes[top[1].1.clone()]);
        let kinds: Vec<_> = moov.iter().map(|c| c.0).collect();
        assert_eq!(kinds, vec![*b"mvhd", *b"trak", *b"mvex"]);
        let off = init.mehd_duration_offset.unwrap();
        assert_eq!(&init.bytes[off - 8..off - 4], b"mehd");
        assert_eq!(&init.bytes[off..off + 8], &[0; 8]);
        assert_eq!(mehd_duration(90_000 * 3), 3000u64.to_be_bytes());
    }

    #[test]
    fn a_fragment_points_its_data_offset_at_the_first_sample() {
        let samples = vec![
            Sample {
                data: vec![0, 0, 0, 2, 0x65, 0x88],
                duration: 6000,
                sync: true,
            },
            Sample {
                data: vec![0, 0, 0, 1, 0x41],
                duration: 90_000,
                sync: false,
            },
        ];
        let frag = fragment(7, 123_456, &samples);
        let top = children(&frag);
        assert_eq!(&top[0].0, b"moof");
        assert_eq!(&top[1].0, b"mdat");
        assert_eq!(
            &frag[top[1].1.clone()],
            &[0, 0, 0, 2, 0x65, 0x88, 0, 0, 0, 1, 0x41]
        );
        let moof = children(&frag[top[0].1.clone()]);
        let traf_range = moof[1].1.clone();
        let base = top[0].1.start;
        let traf = children(&frag[base + traf_range.start..base + traf_range.end]);
        let trun_at = base + traf_range.start + traf[2].1.start;
        let data_offset = u32::from_be_bytes(frag[trun_at + 8..trun_at + 12].try_into().unwrap());
        assert_eq!(data_offset as usize, top[1].1.start);
        let first_duration = &frag[FIRST_SAMPLE_DURATION_AT..FIRST_SAMPLE_DURATION_AT + 4];
        assert_eq!(trun_at + 12, FIRST_SAMPLE_DURATION_AT);
        assert_eq!(first_duration, 6000u32.to_be_bytes());
        let tfdt_at = base + traf_range.start + traf[1].1.start;
        assert_eq!(
            u64::from_be_bytes(frag[tfdt_at + 4..tfdt_at + 12].try_into().unwrap()),
            123_456
        );
    }

    /// A file as the writer lays it out: the init segment, then fragments of varying sample
    /// counts, sizes, durations and sync flags. Returns it with the end offset and expected
    /// contents after each fragment.
    fn written() -> (Vec<u8>, Vec<Contents>) {
        let init = init_segment(&info(), true);
        let mut file = init.bytes.clone();
        let mut expect = Contents {
            len: file.len() as u64,
            mehd_duration_offset: init.mehd_duration_offset.map(|o| o as u64),
            ..Contents::default()
        };
        let mut after = vec![expect.clone()];
        for (seq, n) in [1usize, 3, 1, 5, 2].into_iter().enumerate() {
            let samples: Vec<Sample> = (0..n)
                .map(|k| Sample {
                    data: [0, 0, 0, 3, 0x41, seq as u8, k as u8].repeat(k + 1),
                    duration: 3000 + 1000 * (seq * 7 + k) as u32,
                    sync: k == 0 && seq % 2 == 0,
                })
                .collect();
            file.extend_from_slice(&fragment(seq as u32 + 1, expect.duration, &samples));
            expect.len = file.len() as u64;
            expect.fragments += 1;
            expect.samples += n as u64;
            expect.sync_samples += samples.iter().filter(|s| s.sync).count() as u64;
            expect.duration += samples.iter().map(|s| s.duration as u64).sum::<u64>();
            after.push(expect.clone());
        }
        (file, after)
    }

    fn read(bytes: &[u8]) -> Contents {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        read_contents(&f).unwrap()
    }

    #[test]
    fn the_reader_finds_every_fragment_the_writer_wrote() {
        let (file, after) = written();
        let got = read(&file);
        assert_eq!(&got, after.last().unwrap());
        assert_eq!(got.len, file.len() as u64);
        assert_eq!(got.fragments, 5);
        assert_eq!(got.samples, 12);
        assert_eq!(got.sync_samples, 3);
        let off = got.mehd_duration_offset.unwrap() as usize;
        assert_eq!(&file[off - 8..off - 4], b"mehd");
    }

    #[test]
    fn a_file_cut_anywhere_reads_as_its_complete_fragments() {
        let (file, after) = written();
        for cut in 0..=file.len() {
            // The last state whose end the cut does not fall before.
            let want = after
                .iter()
                .rev()
                .find(|c| c.len as usize <= cut)
                .cloned()
                .unwrap_or_default();
            assert_eq!(read(&file[..cut]), want, "cut at {cut} of {}", file.len());
        }
    }

    #[test]
    fn a_tail_that_is_not_the_next_fragment_is_left_out() {
        let (file, after) = written();
        let third = after[3].clone();
        let end = third.len as usize;
        // The next fragment's moof whole, its mdat cut short.
        let next_end = after[4].len as usize;
        assert_eq!(read(&file[..next_end - 1]), third);
        // A fragment out of sequence, or one whose decode time does not follow on.
        let mut bad = file[..end].to_vec();
        bad.extend_from_slice(&fragment(
            9,
            third.duration,
            &[Sample {
                data: vec![1; 5],
                duration: 1,
                sync: true,
            }],
        ));
        assert_eq!(read(&bad), third);
        let mut bad = file[..end].to_vec();
        bad.extend_from_slice(&fragment(
            4,
            third.duration + 1,
            &[Sample {
                data: vec![1; 5],
                duration: 1,
                sync: true,
            }],
        ));
        assert_eq!(read(&bad), third);
        // Zeros where the next fragment should be (blocks allocated, never written).
        let mut bad = file[..end].to_vec();
        bad.extend_from_slice(&[0; 4096]);
        assert_eq!(read(&bad), third);
        // A mdat that claims more than its moof's samples (the fourth fragment: five samples
        // of 7, 14, 21, 28 and 35 bytes).
        let mut bad = file[..next_end].to_vec();
        let mdat_at = next_end - 8 - 105;
        assert_eq!(
            &bad[mdat_at + 4..mdat_at + 8],
            b"mdat",
            "layout as expected"
        );
        bad[mdat_at + 3] += 1;
        bad.push(0);
        assert_eq!(read(&bad), third);
        // Not this module's file at all.
        assert_eq!(read(b"not an mp4 file at all"), Contents::default());
    }
}
