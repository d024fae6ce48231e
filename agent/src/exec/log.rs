//! A command's output log: one combined byte stream whose sequence numbers are byte offsets.
//!
//! `output.log` holds the bytes at their own offsets. `streams` records each switch between
//! stdout and stderr as a 9-byte record (u64 LE seq, u8 stream). Past the per-command cap the
//! oldest whole blocks are punched out of `output.log` (offsets stay valid) and `trunc` holds
//! the first sequence number still stored. The writer is the shim (background commands) or the
//! agent (foreground); the reader is whichever agent is running — so output produced while no
//! client (or no agent) was attached is never lost.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use berth_protocol::Stream;

use super::record::{EXIT, ExitRecord, read_json};

pub const OUTPUT: &str = "output.log";
pub const STREAMS: &str = "streams";
pub const TRUNC: &str = "trunc";
const RECORD: usize = 9;
const BLOCK: u64 = 4096;

fn stream_byte(s: Stream) -> u8 {
    match s {
        Stream::Stdout => 1,
        Stream::Stderr => 2,
    }
}

fn byte_stream(b: u8) -> Stream {
    if b == 2 {
        Stream::Stderr
    } else {
        Stream::Stdout
    }
}

/// Appends output to a command's log, enforcing the cap.
pub struct LogWriter {
    dir: PathBuf,
    /// Opened on the first byte, so a command without output costs no file.
    out: Option<File>,
    /// Opened on the first switch: a log that is all stdout needs no index.
    streams: Option<File>,
    end: u64,
    last: Option<Stream>,
    cap: u64,
    dropped: u64,
    punch_supported: bool,
    /// The first write error; later output is discarded (the command keeps running).
    pub error: Option<String>,
}

impl LogWriter {
    pub fn create(dir: &Path, cap: u64) -> std::io::Result<LogWriter> {
        Ok(LogWriter {
            dir: dir.to_path_buf(),
            out: None,
            streams: None,
            end: 0,
            last: None,
            cap: cap.max(BLOCK),
            dropped: 0,
            punch_supported: true,
            error: None,
        })
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    /// A writer that records nothing (its directory could not be made) but remembers why.
    pub fn failed(dir: &Path, e: std::io::Error) -> LogWriter {
        LogWriter {
            dir: dir.to_path_buf(),
            out: None,
            streams: None,
            end: 0,
            last: None,
            cap: BLOCK,
            dropped: 0,
            punch_supported: false,
            error: Some(format!("cannot record output in {}: {e}", dir.display())),
        }
    }

    /// Closes the files once the command has ended; later appends are discarded.
    pub fn close(&mut self) {
        self.out = None;
        self.streams = None;
        self.error.get_or_insert_with(|| "closed".into());
    }

    /// Appends `data` from `stream`. Returns the stream switch recorded, if any.
    pub fn append(&mut self, stream: Stream, data: &[u8]) -> Option<(u64, Stream)> {
        if data.is_empty() || self.error.is_some() {
            return None;
        }
        let mut switch = None;
        // Readers take a log without switches to be stdout from the start.
        let implied = self.last.is_none() && stream == Stream::Stdout;
        if self.last != Some(stream) && !implied {
            let mut rec = [0u8; RECORD];
            rec[..8].copy_from_slice(&self.end.to_le_bytes());
            rec[8] = stream_byte(stream);
            if let Err(e) =
                open_append(&self.dir, STREAMS, &mut self.streams).and_then(|f| f.write_all(&rec))
            {
                self.fail(e);
                return None;
            }
            switch = Some((self.end, stream));
        }
        self.last = Some(stream);
        if let Err(e) =
            open_append(&self.dir, OUTPUT, &mut self.out).and_then(|f| f.write_all(data))
        {
            self.fail(e);
            return switch;
        }
        self.end += data.len() as u64;
        self.enforce_cap();
        switch
    }

    fn fail(&mut self, e: std::io::Error) {
        self.error = Some(format!(
            "cannot record output in {}: {e}",
            self.dir.display()
        ));
    }

    /// Punches whole blocks older than the cap out of the file, in steps of a slack so this
    /// costs one syscall per `slack` bytes.
    fn enforce_cap(&mut self) {
        if !self.punch_supported {
            return;
        }
        let slack = (self.cap / 4).clamp(BLOCK, 16 << 20);
        if self.end - self.dropped <= self.cap + slack {
            return;
        }
        let upto = (self.end - self.cap) / BLOCK * BLOCK;
        if upto <= self.dropped {
            return;
        }
        let Some(out) = &self.out else { return };
        if punch_hole(out, self.dropped, upto - self.dropped).is_err() {
            // Without hole punching the cap cannot hold; keep everything rather than lose the
            // newest output.
            self.punch_supported = false;
            return;
        }
        self.dropped = upto;
        let tmp = self.dir.join(".trunc.tmp");
        if std::fs::write(&tmp, upto.to_string()).is_ok() {
            let _ = std::fs::rename(&tmp, self.dir.join(TRUNC));
        }
    }
}

fn open_append<'a>(
    dir: &Path,
    name: &str,
    slot: &'a mut Option<File>,
) -> std::io::Result<&'a mut File> {
    if slot.is_none() {
        *slot = Some(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(name))?,
        );
    }
    Ok(slot.as_mut().expect("just opened"))
}

fn punch_hole(f: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on an owned, open descriptor.
    let rc = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The reader's view of a log: what is known so far, refreshed from disk (or fed directly by
/// an in-process writer).
pub struct LogView {
    dir: PathBuf,
    bytes: Backing,
    streams: Option<File>,
    pub end: u64,
    pub truncated_before: u64,
    index: Vec<(u64, Stream)>,
    index_bytes_read: u64,
    pub exit: Option<ExitRecord>,
}

/// Where a log's bytes are.
enum Backing {
    /// `output.log` in the command's directory (kept open while the command runs).
    Dir(Option<File>),
    /// A running foreground command's output, while it is small.
    Memory(Vec<u8>),
    /// A finished foreground command's output inside the foreground store.
    Store { path: PathBuf, offset: u64 },
}

/// A run of bytes from one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub seq: u64,
    pub stream: Stream,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOut {
    pub segments: Vec<Segment>,
    pub next_seq: u64,
    pub done: bool,
    /// Set when `from` was older than the oldest byte still stored.
    pub truncated_before: Option<u64>,
}

impl LogView {
    fn empty(dir: &Path, bytes: Backing) -> LogView {
        LogView {
            dir: dir.to_path_buf(),
            bytes,
            streams: None,
            end: 0,
            truncated_before: 0,
            index: Vec::new(),
            index_bytes_read: 0,
            exit: None,
        }
    }

    /// The view of a log in a command directory, as far as it is written.
    pub fn open(dir: &Path) -> LogView {
        let mut v = Self::empty(dir, Backing::Dir(None));
        v.refresh();
        v
    }

    /// Re-reads what a writer in another process added. The exit record is read before the
    /// sizes: the shim writes all output before `exit`, so once `exit` is seen the sizes read
    /// after it are final. Returns whether anything changed.
    pub fn refresh(&mut self) -> bool {
        if !matches!(self.bytes, Backing::Dir(_)) {
            return false;
        }
        let before = (self.end, self.truncated_before, self.exit.is_some());
        if self.exit.is_none() {
            self.exit = read_json(&self.dir, EXIT);
        }
        if let Backing::Dir(out) = &mut self.bytes {
            if out.is_none() {
                *out = File::open(self.dir.join(OUTPUT)).ok();
            }
            if let Some(f) = out
                && let Ok(m) = f.metadata()
            {
                self.end = self.end.max(m.len());
            }
        }
        self.read_index();
        if let Ok(s) = std::fs::read_to_string(self.dir.join(TRUNC))
            && let Ok(t) = s.trim().parse::<u64>()
        {
            self.set_truncated(t);
        }
        if self.exit.is_some() {
            self.release();
        }
        before != (self.end, self.truncated_before, self.exit.is_some())
    }

    /// A finished command keeps no descriptors open (records live for a day; descriptors
    /// would pile up and make every spawn copy a longer table). Reads reopen the file.
    fn release(&mut self) {
        if let Backing::Dir(out) = &mut self.bytes {
            *out = None;
        }
        self.streams = None;
    }

    /// A view of a running foreground command whose output is kept in memory until it
    /// grows past what is worth keeping there (then it spills to the directory).
    pub fn memory(dir: &Path) -> LogView {
        Self::empty(dir, Backing::Memory(Vec::new()))
    }

    /// A finished foreground command read back from the store.
    pub fn stored(
        dir: &Path,
        path: PathBuf,
        offset: u64,
        len: u64,
        index: Vec<(u64, Stream)>,
        exit: ExitRecord,
    ) -> LogView {
        let mut v = Self::empty(dir, Backing::Store { path, offset });
        v.end = len;
        v.index = index;
        v.exit = Some(exit);
        v
    }

    /// The in-memory bytes, if this view holds them.
    pub fn memory_bytes(&self) -> Option<&[u8]> {
        match &self.bytes {
            Backing::Memory(b) => Some(b),
            _ => None,
        }
    }

    pub fn index(&self) -> &[(u64, Stream)] {
        &self.index
    }

    /// Appends to an in-memory view (same stream-switch rule as `LogWriter`).
    pub fn memory_append(&mut self, stream: Stream, data: &[u8]) {
        let Backing::Memory(bytes) = &mut self.bytes else {
            return;
        };
        let last = self.index.last().map(|&(_, s)| s).unwrap_or(Stream::Stdout);
        if last != stream {
            self.index.push((self.end, stream));
        }
        bytes.extend_from_slice(data);
        self.end += data.len() as u64;
    }

    /// The in-memory output now lives in the store: drop the copy.
    pub fn moved_to_store(&mut self, path: PathBuf, offset: u64) {
        self.bytes = Backing::Store { path, offset };
    }

    /// Reads `len` bytes at `seq` from wherever they are.
    fn fetch(&self, seq: u64, len: usize, file: Option<&File>) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        match (&self.bytes, file) {
            (Backing::Memory(b), _) => {
                buf.copy_from_slice(&b[seq as usize..seq as usize + len]);
            }
            (Backing::Store { offset, .. }, Some(f)) => f.read_exact_at(&mut buf, offset + seq)?,
            (Backing::Dir(_), Some(f)) => f.read_exact_at(&mut buf, seq)?,
            (_, None) => {}
        }
        Ok(buf)
    }

    fn read_index(&mut self) {
        if self.streams.is_none() {
            self.streams = File::open(self.dir.join(STREAMS)).ok();
        }
        let Some(f) = self.streams.as_mut() else {
            return;
        };
        if f.seek(SeekFrom::Start(self.index_bytes_read)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        if f.read_to_end(&mut buf).is_err() {
            return;
        }
        let whole = buf.len() / RECORD * RECORD;
        for rec in buf[..whole].chunks_exact(RECORD) {
            let seq = u64::from_le_bytes(rec[..8].try_into().unwrap_or_default());
            self.index.push((seq, byte_stream(rec[8])));
        }
        self.index_bytes_read += whole as u64;
    }

    /// For an in-process writer: record an append without touching the disk.
    pub fn note_append(&mut self, end: u64, switch: Option<(u64, Stream)>) {
        if let Some(s) = switch {
            self.index.push(s);
            self.index_bytes_read += RECORD as u64;
        }
        self.end = self.end.max(end);
    }

    pub fn set_truncated(&mut self, t: u64) {
        if t > self.truncated_before {
            self.truncated_before = t;
            // Keep the last switch at or before the cut: it names the stream of the first kept byte.
            let keep_from = self
                .index
                .partition_point(|&(s, _)| s <= t)
                .saturating_sub(1);
            self.index.drain(..keep_from);
        }
    }

    pub fn set_exit(&mut self, exit: ExitRecord) {
        self.exit = Some(exit);
        self.release();
    }

    fn stream_at(&self, seq: u64) -> (Stream, u64) {
        // The last switch at or before seq names the stream; the next switch ends the run.
        let i = self.index.partition_point(|&(s, _)| s <= seq);
        let stream = if i == 0 {
            Stream::Stdout
        } else {
            self.index[i - 1].1
        };
        let run_end = self.index.get(i).map(|&(s, _)| s).unwrap_or(u64::MAX);
        (stream, run_end)
    }

    /// Reads at most `max` bytes from `from`. A trailing incomplete UTF-8 sequence is held back
    /// until the command ends, so live readers never see a character split in two.
    pub fn read(&self, from: u64, max: usize) -> std::io::Result<ReadOut> {
        let done_writing = self.exit.is_some();
        let truncated = (from < self.truncated_before).then_some(self.truncated_before);
        let mut seq = from.max(self.truncated_before).min(self.end);
        let stop = self.end.min(seq.saturating_add(max as u64));
        let mut segments = Vec::new();
        let reopened;
        let file = match &self.bytes {
            Backing::Dir(Some(f)) => Some(f),
            Backing::Dir(None) if seq < stop => {
                reopened = File::open(self.dir.join(OUTPUT))?;
                Some(&reopened)
            }
            Backing::Store { path, .. } if seq < stop => {
                reopened = File::open(path)?;
                Some(&reopened)
            }
            _ => None,
        };
        while seq < stop {
            let (stream, run_end) = self.stream_at(seq);
            let seg_end = stop.min(run_end);
            let bytes = self.fetch(seq, (seg_end - seq) as usize, file)?;
            segments.push(Segment { seq, stream, bytes });
            seq = seg_end;
        }
        // Hold back a split character at the live edge (never at a stream switch or the end).
        if !done_writing
            && seq == self.end
            && let Some(last) = segments.last_mut()
        {
            let hold = crate::text::incomplete_utf8_tail(&last.bytes);
            if hold > 0 {
                last.bytes.truncate(last.bytes.len() - hold);
                seq -= hold as u64;
                if last.bytes.is_empty() {
                    segments.pop();
                }
            }
        }
        Ok(ReadOut {
            segments,
            next_seq: seq,
            done: done_writing && seq >= self.end,
            truncated_before: truncated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_output_reads_back_by_stream_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = LogWriter::create(dir.path(), 1 << 20).unwrap();
        w.append(Stream::Stdout, b"hello ");
        w.append(Stream::Stdout, b"world\n");
        w.append(Stream::Stderr, b"oops\n");
        w.append(Stream::Stdout, b"bye\n");
        let v = LogView::open(dir.path());
        assert_eq!(v.end, 21);
        let r = v.read(0, 1000).unwrap();
        let segs: Vec<(u64, Stream, &[u8])> = r
            .segments
            .iter()
            .map(|s| (s.seq, s.stream, s.bytes.as_slice()))
            .collect();
        assert_eq!(
            segs,
            vec![
                (0, Stream::Stdout, b"hello world\n".as_slice()),
                (12, Stream::Stderr, b"oops\n".as_slice()),
                (17, Stream::Stdout, b"bye\n".as_slice()),
            ]
        );
        assert!(!r.done, "no exit record yet");
        let mid = v.read(13, 5).unwrap();
        assert_eq!(mid.segments[0].bytes, b"ops\n");
        assert_eq!(mid.segments[1].bytes, b"b");
        assert_eq!(mid.next_seq, 18);
    }

    #[test]
    fn a_split_character_is_held_back_until_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = LogWriter::create(dir.path(), 1 << 20).unwrap();
        let check = "✓".as_bytes();
        w.append(Stream::Stdout, &[b'a', check[0], check[1]]);
        let v = LogView::open(dir.path());
        let r = v.read(0, 100).unwrap();
        assert_eq!(r.next_seq, 1);
        w.append(Stream::Stdout, &check[2..]);
        let mut v = LogView::open(dir.path());
        let r = v.read(1, 100).unwrap();
        assert_eq!(r.segments[0].bytes, check);
        // An invalid tail is delivered once the command has ended.
        w.append(Stream::Stdout, &[0xe2]);
        v.refresh();
        v.set_exit(ExitRecord {
            exit_code: 0,
            signal: None,
            timed_out: false,
            ended_at: String::new(),
            output_error: None,
            reported: false,
        });
        let r = v.read(4, 100).unwrap();
        assert_eq!(r.segments[0].bytes, vec![0xe2]);
        assert!(r.done);
    }

    #[test]
    fn the_cap_drops_the_oldest_bytes_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = LogWriter::create(dir.path(), 8192).unwrap();
        let block: Vec<u8> = (0..1000u32).map(|i| b'a' + (i % 26) as u8).collect();
        for _ in 0..40 {
            w.append(Stream::Stdout, &block);
        }
        let v = LogView::open(dir.path());
        assert_eq!(v.end, 40_000);
        assert!(v.truncated_before > 0, "cap enforced");
        assert!(v.end - v.truncated_before <= 8192 + 4096 + 2048);
        let r = v.read(0, 1 << 20).unwrap();
        assert_eq!(r.truncated_before, Some(v.truncated_before));
        let first = &r.segments[0];
        assert_eq!(first.seq, v.truncated_before);
        // The kept bytes are the true bytes at those offsets.
        let off = (first.seq % 1000) as usize;
        assert_eq!(first.bytes[0], block[off]);
        let disk = std::fs::metadata(dir.path().join(OUTPUT)).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert!(disk.blocks() * 512 < 40_000, "punched blocks are freed");
    }
}
