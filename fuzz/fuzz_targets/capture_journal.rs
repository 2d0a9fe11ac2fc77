//! The capture journal's reader, which the start-up replay trusts to say
//! which lines to put back in the session logs (`polar_capture::frame`),
//! on any bytes: never a panic and no allocation beyond the input; every
//! frame read encodes back to exactly the bytes it was read from, in
//! order, up to where reading stopped; a clean end leaves only zeros; a
//! bad frame is reported at that offset; the same frames read through a
//! small buffer as from the slice.
#![no_main]

use std::io::BufReader;

use libfuzzer_sys::fuzz_target;
use polar_capture::frame::{FrameEnd, FrameReader, encode};

fuzz_target!(|data: &[u8]| {
    let mut reader = FrameReader::new(data);
    let frames: Vec<_> = reader.by_ref().collect();
    let end = reader.end().cloned().expect("reading stopped");
    let mut again = Vec::new();
    for f in &frames {
        again.extend(encode(&f.session, f.key, f.offset, &f.line));
    }
    assert_eq!(again.len() as u64, reader.offset());
    assert_eq!(&data[..again.len()], &again[..]);
    match end {
        // The input ended, or only zeros (the space written ahead) follow.
        FrameEnd::Clean => assert!(data[again.len()..].iter().all(|b| *b == 0)),
        FrameEnd::Bad { offset, .. } => {
            assert_eq!(offset, reader.offset());
            assert!(again.len() < data.len());
        }
    }
    let mut small = FrameReader::new(BufReader::with_capacity(5, data));
    let frames_again: Vec<_> = small.by_ref().collect();
    assert_eq!(frames_again, frames);
    assert_eq!(small.end(), reader.end());
});
