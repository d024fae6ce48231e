//! The VNC relay's RFB filter (`desktop::vnc::ClientFilter::feed`) for a viewer that may not
//! send input (view-only, or while another person holds the controls): arbitrary client bytes
//! in arbitrary splits.
//!
//! Input: a count byte n (n % 16), n chunk lengths (0 means 1), then the client's byte
//! stream, cut into chunks of those lengths in turn.
//!
//! What the filter promises, checked here:
//! - the split points do not matter: chunk by chunk, it forwards exactly what it forwards for
//!   the whole stream at once, and fails at the same message with the same reason;
//! - it forwards whole messages of the input, in order, only ever dropping some;
//! - what it forwards passes the filter again unchanged, so it holds no dropped kind and no
//!   partial message: a view-only server never sees input, resize or power messages;
//! - anything forwarded starts with the client's RFB version.
#![no_main]

use berth_agent::desktop::vnc::ClientFilter;
use libfuzzer_sys::fuzz_target;

fn chunks(data: &[u8]) -> (Vec<usize>, &[u8]) {
    let Some((&n, rest)) = data.split_first() else {
        return (vec![], data);
    };
    let n = usize::from(n % 16).min(rest.len());
    let lens = rest[..n].iter().map(|&l| usize::from(l).max(1)).collect();
    (lens, &rest[n..])
}

/// Whether `sub` is `whole` with some bytes left out, order kept.
fn is_subsequence(sub: &[u8], whole: &[u8]) -> bool {
    let mut it = whole.iter();
    sub.iter().all(|b| it.any(|w| w == b))
}

fuzz_target!(|data: &[u8]| {
    let (lens, stream) = chunks(data);

    // Chunk by chunk, as WebSocket frames arrive; the relay stops at the first error.
    let mut split = ClientFilter::default();
    let mut forwarded = Vec::new();
    let mut split_err = None;
    let mut at = 0;
    let mut i = 0;
    while at < stream.len() {
        let len = if lens.is_empty() {
            stream.len()
        } else {
            lens[i % lens.len()]
        };
        i += 1;
        let end = (at + len).min(stream.len());
        match split.feed(&stream[at..end], false) {
            Ok(out) => forwarded.extend(out),
            Err(e) => {
                split_err = Some(e);
                break;
            }
        }
        at = end;
    }

    // All at once.
    let whole = ClientFilter::default().feed(stream, false);
    match (&whole, &split_err) {
        (Ok(out), None) => assert_eq!(out, &forwarded, "split points changed the output"),
        (Err(a), Some(b)) => assert_eq!(a, b, "split points changed the failure"),
        (Ok(_), Some(e)) => panic!("fails only when split: {e}"),
        (Err(e), None) => panic!("fails only when whole: {e}"),
    }

    assert!(is_subsequence(&forwarded, stream));
    if !forwarded.is_empty() {
        assert!(forwarded.starts_with(b"RFB 003."));
        assert_eq!(forwarded[..12], stream[..12]);
    }

    // Filtering what was forwarded forwards all of it: every message in it is whole and of a
    // kind a viewer may send.
    let again = ClientFilter::default()
        .feed(&forwarded, false)
        .expect("forwarded bytes pass the filter again");
    assert_eq!(again, forwarded, "the filter forwarded something it drops");
});
