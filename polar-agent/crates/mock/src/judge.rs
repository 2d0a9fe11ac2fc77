//! The mock as a judge model: how it answers a judge request of Polar's
//! `llm_judge` evaluator, deterministically and from what the request
//! shows, so that a test of the judge can fail.
//!
//! A request whose first user message begins with [`MARKER`] is a judge
//! request; it consumes no scripted turn. The mock reads the criteria
//! (lines ``- `name` (weight W): description`` under `## Criteria`) and the
//! fenced block under `## Workspace diff`, and scores each criterion:
//! - its description quotes text in backticks: 10 when every quoted text
//!   is on an added line of the diff (a line starting with `+`, not
//!   `+++`), else 0;
//! - its description starts with `Keeps` and quotes text: 10 when no
//!   quoted text is on a removed line (`-`, not `---`), else 0;
//! - it quotes nothing: 5.
//!
//! It answers `{"scores": {...}, "rationale": "..."}` with the reason for
//! each score. A judge request without a criterion gets a non-JSON answer
//! (what a real model might do), which the evaluator must refuse.

use serde_json::{Map, Value, json};

use super::script::Plan;
use super::template::PromptFacts;

/// The first line of a judge request (`polar_evaluate::judge::JUDGE_MARKER`).
pub const MARKER: &str = "# Polar judge request";

/// The plan for a judge request, `None` for any other request.
pub fn plan(facts: &PromptFacts) -> Option<Plan> {
    let prompt = facts.first_user.as_deref()?;
    if !prompt.starts_with(MARKER) {
        return None;
    }
    Some(Plan {
        text: answer(prompt),
        ..Plan::default()
    })
}

/// The lines of the section titled `title` (up to the next `## `).
fn section<'a>(prompt: &'a str, title: &str) -> Vec<&'a str> {
    prompt
        .lines()
        .skip_while(|l| l.trim_end() != title)
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect()
}

/// The texts between backticks in `s`.
fn quoted(s: &str) -> Vec<&str> {
    s.split('`')
        .enumerate()
        .filter(|(i, t)| i % 2 == 1 && !t.is_empty())
        .map(|(_, t)| t)
        .collect()
}

/// The judge's answer to `prompt`.
pub fn answer(prompt: &str) -> String {
    let diff = section(prompt, "## Workspace diff");
    let lines = |sign: char, header: &str| -> Vec<&str> {
        diff.iter()
            .filter(|l| l.starts_with(sign) && !l.starts_with(header))
            .map(|l| &l[1..])
            .collect()
    };
    let (added, removed) = (lines('+', "+++"), lines('-', "---"));
    let mut scores = Map::new();
    let mut reasons = Vec::new();
    for line in section(prompt, "## Criteria") {
        let Some(rest) = line.strip_prefix("- `") else {
            continue;
        };
        let Some((name, rest)) = rest.split_once('`') else {
            continue;
        };
        let description = rest.split_once("): ").map_or("", |(_, d)| d);
        let wanted = quoted(description);
        let (score, reason) = if wanted.is_empty() {
            (5, format!("{name}: nothing to look for"))
        } else if description.starts_with("Keeps") {
            let gone: Vec<&str> = wanted
                .iter()
                .filter(|w| removed.iter().any(|l| l.contains(*w)))
                .copied()
                .collect();
            if gone.is_empty() {
                (10, format!("{name}: the diff keeps {wanted:?}"))
            } else {
                (0, format!("{name}: the diff removes {gone:?}"))
            }
        } else {
            let missing: Vec<&str> = wanted
                .iter()
                .filter(|w| !added.iter().any(|l| l.contains(*w)))
                .copied()
                .collect();
            if missing.is_empty() {
                (10, format!("{name}: the diff adds {wanted:?}"))
            } else {
                (0, format!("{name}: the diff does not add {missing:?}"))
            }
        };
        scores.insert(name.to_owned(), Value::from(score));
        reasons.push(reason);
    }
    if scores.is_empty() {
        return "I cannot tell what to judge.".to_owned();
    }
    json!({"scores": scores, "rationale": reasons.join("; ")}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPT: &str = "# Polar judge request\nScore.\n\n## Criteria\n\
        - `fixed` (weight 2): calc.py holds `return a + b`.\n\
        - `style` (weight 1): readable.\n\n## Task\n```\nfix it\n```\n\n\
        ## Workspace diff\n```\n--- /dev/null\n+++ b/calc.py\n+def add(a, b):\n+    return a + b\n```\n\n\
        ## Transcript\n```\nreturn a + b\n```\n";

    #[test]
    fn scores_follow_the_diff_not_the_transcript() {
        let v: Value = serde_json::from_str(&answer(PROMPT)).unwrap();
        assert_eq!(v["scores"]["fixed"], 10);
        assert_eq!(v["scores"]["style"], 5);
        let bad = PROMPT.replace("+    return a + b", "+    return a - b");
        let v: Value = serde_json::from_str(&answer(&bad)).unwrap();
        assert_eq!(v["scores"]["fixed"], 0, "{v}");
        assert!(serde_json::from_str::<Value>(&answer("# Polar judge request\nnothing")).is_err());
    }

    #[test]
    fn a_criterion_that_keeps_text_fails_when_the_diff_removes_it() {
        let keeps = PROMPT.replace(
            "- `style` (weight 1): readable.",
            "- `tests` (weight 1): Keeps `assert add(2, 3) == 5`.",
        );
        let v: Value = serde_json::from_str(&answer(&keeps)).unwrap();
        assert_eq!(v["scores"]["tests"], 10, "{v}");
        let removed = keeps.replace(
            "+++ b/calc.py\n",
            "+++ b/calc.py\n--- a/test_calc.py\n-    assert add(2, 3) == 5\n",
        );
        let v: Value = serde_json::from_str(&answer(&removed)).unwrap();
        assert_eq!(v["scores"]["tests"], 0, "{v}");
        assert_eq!(v["scores"]["fixed"], 10, "{v}");
    }
}
