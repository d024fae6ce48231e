//! Live video for viewers: an init segment, then one fragment per picture, starting at a
//! keyframe. The viewer's timeline runs without gaps (each picture lasts one frame interval),
//! so a `<video>` element or a MediaSource buffer never waits on a hole while the screen is
//! still; the recording files keep true wall-clock times instead.

use std::sync::Mutex;
use std::time::Instant;

use berth_protocol::sync::Locked;
use bytes::Bytes;
use tokio::sync::mpsc;

use super::mp4::{self, Sample, TIMESCALE};
use super::pipeline::{Picture, Sink, Tick, Verdict};

/// Fragments a viewer may have in flight before it counts as behind.
pub const QUEUE: usize = 64;

struct State {
    started: bool,
    /// Fell behind: drop pictures until the next keyframe.
    resync: bool,
    sequence: u32,
    decode: u64,
}

pub struct StreamSink {
    tx: mpsc::Sender<Bytes>,
    frame_ticks: u32,
    state: Mutex<State>,
}

impl StreamSink {
    pub fn new(fps: u32) -> (StreamSink, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (
            StreamSink {
                tx,
                frame_ticks: TIMESCALE / fps.max(1),
                state: Mutex::new(State {
                    started: false,
                    resync: false,
                    sequence: 1,
                    decode: 0,
                }),
            },
            rx,
        )
    }
}

impl Sink for StreamSink {
    fn push(&self, pic: &Picture<'_>) -> Verdict {
        if self.tx.is_closed() {
            return Verdict::Done;
        }
        let mut st = self.state.locked();
        if (!st.started || st.resync) && !pic.sync {
            return Verdict::Keep;
        }
        if !st.started {
            let init = mp4::init_segment(pic.track, false);
            if self.tx.try_send(Bytes::from(init.bytes)).is_err() {
                return Verdict::Done;
            }
            st.started = true;
        }
        let frag = mp4::fragment(
            st.sequence,
            st.decode,
            &[Sample {
                data: pic.data.to_vec(),
                duration: self.frame_ticks,
                sync: pic.sync,
            }],
        );
        match self.tx.try_send(Bytes::from(frag)) {
            Ok(()) => {
                st.resync = false;
                st.sequence += 1;
                st.decode += self.frame_ticks as u64;
                Verdict::Keep
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                st.resync = true;
                Verdict::Resync
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Verdict::Done,
        }
    }

    fn tick(&self, _now: Instant, _tick: Tick) -> Verdict {
        if self.tx.is_closed() {
            Verdict::Done
        } else {
            Verdict::Keep
        }
    }

    fn fail(&self, error: &str) {
        tracing::info!(error, "live stream ended: the recorder failed");
    }
}
