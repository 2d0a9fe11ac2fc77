//! The test-output parsers the `test_output` evaluator scores a session by
//! (`polar_evaluate::Parser`: `pytest`, `unittest`), on any output: the test
//! command runs the policy's code in the sandbox, so what it prints is
//! hostile. See `polar_fuzz::check_test_output`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| polar_fuzz::check_test_output(data));
