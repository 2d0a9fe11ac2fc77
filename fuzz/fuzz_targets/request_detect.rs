//! What the proxy makes of any request a sandbox sends: its classification
//! from method, path, headers and body (`polar_chat::provider::detect`),
//! then the parser of the API detected, with the model the path names. See
//! `polar_fuzz::check_detect`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| polar_fuzz::check_detect(data));
