//! What makes the mock a model that continues its own text, for the
//! failover of a call (Polar's `stream::failover`):
//!
//! - a token-in request (`/v1/completions`, `/generate`) whose prompt ends
//!   inside an assistant turn (the generation prompt, then generated ids)
//!   continues that turn: the scripted turn whose generation starts with
//!   those ids (the session's turns, any of them: a replica that never saw
//!   the session finds it too), or the built-in policy's, generates its
//!   remaining ids with the same ids and logprobs an unfaulted reply has
//!   ([`generate_from`]), without using up a turn;
//! - a request Polar sends again (`x-polar-attempt` 2 or more) gets the
//!   turn the session got last on this replica (its next one if it got
//!   none), and no scripted fault (`error`, `disconnect_after`,
//!   `abort_after`) fires on it: faults hit a call's first attempt only;
//!   a continuation's faults at or before the tokens it starts after do
//!   not fire again either;
//! - with [`MockConfig::down_after_fault`](super::MockConfig), the replica
//!   answers every request after its first scripted cut or abort with 503,
//!   as a replica that died;
//! - SGLang's `/detokenize`, which Polar resumes with, is served by
//!   `vllm::detokenize` under SGLang's reply key (`text`).

use http::HeaderMap;

use super::codec::Codec;
use super::generate::{Generation, generate_with};
use super::script::{Plan, Policy};
use super::template::PromptFacts;
use super::tokenizer;

/// The header Polar numbers a call's later attempts with.
pub const ATTEMPT_HEADER: &str = "x-polar-attempt";

/// Whether a request is a call's attempt after the first.
pub fn is_retry(headers: &HeaderMap) -> bool {
    headers
        .get(ATTEMPT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|n| n >= 2)
}

/// The generated ids at the end of `prompt_ids`: those after the last
/// `<|im_start|>assistant\n` (and the generation glue), when the turn was
/// not ended. Empty when the prompt ends with the generation prompt.
pub fn partial_turn<'a>(prompt_ids: &'a [u32], glue: &str) -> &'a [u32] {
    let Some(start) = prompt_ids.iter().rposition(|&id| id == tokenizer::IM_START) else {
        return &[];
    };
    let head = tokenizer::encode(&format!("assistant\n{glue}"));
    let Some(rest) = prompt_ids[start + 1..].strip_prefix(head.as_slice()) else {
        return &[];
    };
    if rest.contains(&tokenizer::IM_END) {
        return &[];
    }
    rest
}

/// The plan a continuation of `partial` (which follows `head`) follows:
/// the first of `candidates` whose generation starts with it.
pub fn continued_plan(
    codec: &Codec,
    candidates: Vec<Plan>,
    head: &[u32],
    partial: &[u32],
    max_tokens: usize,
) -> Option<Plan> {
    candidates.into_iter().find(|plan| {
        let g = generate_with(
            codec,
            head.to_vec(),
            &without_faults(plan),
            max_tokens.saturating_add(partial.len()),
        );
        g.ids.starts_with(partial)
    })
}

/// `plan` without its scripted faults.
pub fn without_faults(plan: &Plan) -> Plan {
    Plan {
        error: None,
        disconnect_after: None,
        abort_after: None,
        ..plan.clone()
    }
}

/// The generation of `plan` after its first `done` tokens, which end
/// `prompt_ids`: the same ids, logprobs and finish as the whole turn's;
/// faults at or before `done` do not fire.
pub fn generate_from(
    codec: &Codec,
    prompt_ids: Vec<u32>,
    plan: &Plan,
    max_tokens: usize,
    done: usize,
) -> Generation {
    let mut whole_plan = plan.clone();
    whole_plan.error = None;
    whole_plan.disconnect_after = None;
    if plan.abort_after.is_some_and(|n| n <= done) {
        whole_plan.abort_after = None;
    }
    let base = prompt_ids.len().saturating_sub(done);
    let whole = generate_with(
        codec,
        prompt_ids[..base].to_vec(),
        &whole_plan,
        max_tokens.saturating_add(done),
    );
    let done = done.min(whole.ids.len());
    let offset = whole.spans.get(done).map_or(whole.text.len(), |s| s.start);
    let text = whole.text[offset..].to_owned();
    Generation {
        prompt_ids,
        parsed: codec.parse(&text),
        // Continuations are token-in requests, streamed as raw text.
        streamed: None,
        text,
        ids: whole.ids[done..].to_vec(),
        spans: whole.spans[done..]
            .iter()
            .map(|s| s.start - offset..s.end - offset)
            .collect(),
        logprobs: whole.logprobs[done..].to_vec(),
        finish: whole.finish,
        disconnect_after: plan
            .disconnect_after
            .filter(|&n| n > done)
            .map(|n| n - done),
        codec: codec.clone(),
    }
}

/// The plan of a request and the ids of its turn already generated (0
/// unless it continues one): see the module docs.
pub fn plan_of_request(
    codec: &Codec,
    policy: &Policy,
    session: &str,
    facts: &PromptFacts,
    prompt_ids: &[u32],
    max_tokens: usize,
    retry: bool,
) -> (Plan, usize) {
    for partial in codec.partial_turns(prompt_ids) {
        let head = &prompt_ids[..prompt_ids.len() - partial.len()];
        if let Some(plan) = continued_plan(
            codec,
            policy.turns_of(session, facts),
            head,
            partial,
            max_tokens,
        ) {
            let plan = if retry { without_faults(&plan) } else { plan };
            return (plan, partial.len());
        }
    }
    if retry {
        return (without_faults(&policy.repeat(session, facts)), 0);
    }
    (policy.next(session, facts), 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::generate;

    fn mock() -> Codec {
        Codec::Mock {
            glue: String::new(),
        }
    }

    fn plan() -> Plan {
        Plan {
            think: Some("Let me see.".into()),
            text: "Writing it now.".into(),
            tool_calls: vec![("bash".into(), r#"{"command":"ls"}"#.into())],
            disconnect_after: Some(6),
            ..Plan::default()
        }
    }

    #[test]
    fn a_continuation_is_the_rest_of_the_whole_turn() {
        let prompt = tokenizer::encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        let whole = generate(prompt.clone(), &without_faults(&plan()), 1000);
        for done in [1, 6, 9, whole.ids.len() - 1] {
            let mut input = prompt.clone();
            input.extend(&whole.ids[..done]);
            assert_eq!(partial_turn(&input, ""), &whole.ids[..done]);
            let rest = generate_from(&mock(), input, &plan(), 1000, done);
            assert_eq!(rest.ids, whole.ids[done..]);
            assert_eq!(rest.logprobs, whole.logprobs[done..]);
            assert_eq!(rest.finish, whole.finish);
            assert_eq!(rest.disconnect_after, (done < 6).then(|| 6 - done));
            assert_eq!(
                tokenizer::decode(&rest.ids).unwrap(),
                whole.text[whole.spans[done].start..]
            );
        }
        assert!(partial_turn(&prompt, "").is_empty());
        let found = continued_plan(
            &mock(),
            vec![Plan::default(), plan()],
            &[],
            &whole.ids[..4],
            1000,
        );
        assert_eq!(found, Some(plan()));
        assert_eq!(
            continued_plan(&mock(), vec![Plan::default()], &[], &whole.ids[..4], 1000),
            None
        );
    }

    #[test]
    fn attempts_after_the_first_are_marked() {
        let mut h = HeaderMap::new();
        assert!(!is_retry(&h));
        h.insert(ATTEMPT_HEADER, "2".parse().unwrap());
        assert!(is_retry(&h));
    }
}
