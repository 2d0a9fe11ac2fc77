//! The Gemini generateContent request parser, on any body: see
//! `polar_fuzz::check_request`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polar_chat::Api;

fuzz_target!(|data: &[u8]| polar_fuzz::check_request(Api::Gemini, data));

polar_fuzz::json_mutator!(include_str!("../dicts/request_gemini.dict"));
