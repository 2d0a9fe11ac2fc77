//! Reading a backend's refusal of a request over the model's context out
//! of its error text, so that the harness can be told in its own API's
//! words (each CLI compacts or shrinks `max_tokens` only on the message its
//! provider's servers send).
//!
//! The texts read, as the servers word them:
//! - vLLM (`serving_engine.py`): "This model's maximum context length is M
//!   tokens. However, your request has P input tokens. ...", older "...
//!   However, you requested T tokens (P in the messages, C in the
//!   completion). ...", and "'max_tokens' or 'max_completion_tokens' is too
//!   large: C. This model's maximum context length is M tokens and your
//!   request has P input tokens (C > M - P).";
//! - SGLang (`tokenizer_manager.py`): "The input (P tokens) is longer than
//!   the model's context length (M tokens)."

/// A request the backend refused because prompt and completion do not fit
/// the model's context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ContextOverflow {
    /// The prompt's tokens.
    pub prompt: u32,
    /// The completion tokens asked for, when the backend said (its refusal
    /// is then of `max_tokens`, the prompt alone may fit).
    pub completion: Option<u32>,
    /// The model's context length.
    pub max: u32,
}

impl ContextOverflow {
    /// Whether the prompt alone exceeds the context (else only the prompt
    /// plus the completion asked for does).
    pub fn prompt_too_long(&self) -> bool {
        self.prompt >= self.max
    }
}

/// The overflow a backend's error text reports, if it is one.
pub fn context_overflow(text: &str) -> Option<ContextOverflow> {
    if let Some(max) = number_after(text, "maximum context length is ") {
        let completion = number_after(text, "is too large: ")
            .or_else(|| number_after_in(text, "in the messages, ", " in the completion"));
        let prompt = number_after_in(text, "(", " in the messages")
            .or_else(|| number_after(text, "request has "))
            .or_else(|| number_after(text, "messages resulted in "))
            .or_else(|| number_after(text, "you requested "))?;
        return Some(ContextOverflow {
            prompt,
            completion,
            max,
        });
    }
    let prompt = number_after(text, "The input (")?;
    let max = number_after(text, "context length (")?;
    Some(ContextOverflow {
        prompt,
        completion: None,
        max,
    })
}

/// The decimal number right after the first `marker` in `text`.
fn number_after(text: &str, marker: &str) -> Option<u32> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    rest[..digits].parse().ok()
}

/// The number that ends right before `end`, after the last `start` before
/// it: "(4000 in the messages" read with `(` and ` in the messages`.
fn number_after_in(text: &str, start: &str, end: &str) -> Option<u32> {
    let head = &text[..text.find(end)?];
    let from = head.rfind(start)? + start.len();
    head[from..].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_backend_wording() {
        let cases = [
            (
                "This model's maximum context length is 32768 tokens. However, your request has 40000 input tokens. Please reduce the length of the input messages.",
                ContextOverflow {
                    prompt: 40000,
                    completion: None,
                    max: 32768,
                },
            ),
            (
                "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
                ContextOverflow {
                    prompt: 4000,
                    completion: Some(1000),
                    max: 4096,
                },
            ),
            (
                "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context length is 4096 tokens and your request has 3500 input tokens (1000 > 4096 - 3500).",
                ContextOverflow {
                    prompt: 3500,
                    completion: Some(1000),
                    max: 4096,
                },
            ),
            (
                "The input (40000 tokens) is longer than the model's context length (32768 tokens).",
                ContextOverflow {
                    prompt: 40000,
                    completion: None,
                    max: 32768,
                },
            ),
            (
                r#"{"object":"error","message":"This model's maximum context length is 100 tokens. However, your request has 120 input tokens.","type":"BadRequestError","code":400}"#,
                ContextOverflow {
                    prompt: 120,
                    completion: None,
                    max: 100,
                },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(context_overflow(text), Some(want), "{text}");
        }
        let fits: Vec<bool> = cases.iter().map(|(_, o)| o.prompt_too_long()).collect();
        assert_eq!(fits, [true, false, false, true, true]);
    }

    #[test]
    fn other_refusals_are_not_overflows() {
        for text in [
            "",
            "invalid tool_choice",
            "This model's maximum context length is many tokens.",
            "The input (x tokens) is longer than the model's context length (32768 tokens).",
            "This model's maximum context length is 99999999999 tokens. However, your request has 1 input tokens.",
        ] {
            assert_eq!(context_overflow(text), None, "{text}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(text in ".{0,200}") {
            let _ = context_overflow(&text);
        }
    }
}
