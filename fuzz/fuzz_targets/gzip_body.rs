//! gzip request bodies (`polar_wire::gzip`): any bytes inflate to what
//! flate2 reads from them whole, or fail; never more than the limit is
//! held (a bomb stops at it), and a body within the limit is not refused.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use polar_wire::gzip::{InflateError, inflate_limited};

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let mut want = Vec::new();
    let read = flate2::read::MultiGzDecoder::new(data)
        .take(LIMIT as u64 + 1)
        .read_to_end(&mut want);
    match (inflate_limited(data, LIMIT), read) {
        (Ok(got), Ok(_)) => assert_eq!(got, want),
        (Err(InflateError::TooLarge), _) => {
            assert!(want.len() > LIMIT, "refused {} bytes", want.len())
        }
        (Err(InflateError::Corrupt(_)), Err(_)) => {}
        (Err(InflateError::Corrupt(_)), Ok(_)) => {
            // flate2 stopped at the limit before the corruption.
            assert!(want.len() > LIMIT);
        }
        (Ok(got), Err(e)) => panic!("inflated {} bytes flate2 refuses: {e}", got.len()),
        (Err(InflateError::Sink(())), _) => unreachable!("the sink never fails"),
    }
});
