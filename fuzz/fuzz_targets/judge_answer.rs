//! An `llm_judge` evaluator's answer read into criterion scores and a
//! reward (`polar_evaluate::judge::score`), on any text: the judge reads
//! the policy's work, which may steer what it answers. See
//! `polar_fuzz::check_judge_answer`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| polar_fuzz::check_judge_answer(data));
