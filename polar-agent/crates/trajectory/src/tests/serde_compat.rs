//! What was written before the whitespace tokens, splice shapes and
//! off-policy counts existed still reads: builder options without
//! `whitespace`, spans without `shape` or `off_policy_context_tokens`,
//! statistics without the new counts.

use serde_json::json;

use crate::{CallSpan, Join, ReconstructionStats, SpliceCounts, SpliceShape, TemplateInfo};

#[test]
fn template_ids_without_whitespace_read_as_none() {
    let t: TemplateInfo =
        serde_json::from_value(json!({"end_of_turn": [2], "think": [3, 4]})).unwrap();
    assert!(t.whitespace.is_empty());
    assert_eq!(
        serde_json::to_value(&t).unwrap(),
        json!({"end_of_turn": [2], "think": [3, 4]}),
        "no whitespace key when there are none"
    );
    let with: TemplateInfo =
        serde_json::from_value(json!({"end_of_turn": [2], "think": [3, 4], "whitespace": [5, 13]}))
            .unwrap();
    assert_eq!(with.whitespace, [5, 13]);
    assert!(with.is_whitespace(13) && !with.is_whitespace(2));
}

#[test]
fn old_spans_and_stats_read_with_no_shape_and_zero_counts() {
    let span: CallSpan = serde_json::from_value(json!({
        "response_start": 10,
        "response_len": 4,
        "join": {"kind": "splice", "diverged_at": 7, "resumed_from": 9},
    }))
    .unwrap();
    assert_eq!(
        span.join,
        Join::Splice {
            diverged_at: 7,
            resumed_from: 9,
            shape: None
        }
    );
    assert_eq!(span.off_policy_context_tokens, 0);
    let new = CallSpan {
        join: Join::Splice {
            diverged_at: 7,
            resumed_from: 9,
            shape: Some(SpliceShape::WhitespaceMerge),
        },
        off_policy_context_tokens: 3,
        ..span
    };
    let v = serde_json::to_value(&new).unwrap();
    assert_eq!(v["join"]["shape"], "whitespace_merge");
    assert_eq!(v["off_policy_context_tokens"], 3);
    assert_eq!(SpliceShape::WhitespaceMerge.as_str(), "whitespace_merge");

    let mut old = serde_json::to_value(ReconstructionStats::default()).unwrap();
    let obj = old.as_object_mut().unwrap();
    for k in [
        "template_splices_by_shape",
        "off_policy_joins",
        "off_policy_context_tokens",
    ] {
        assert!(obj.remove(k).is_some(), "{k} is serialized");
    }
    let stats: ReconstructionStats = serde_json::from_value(old).unwrap();
    assert_eq!(stats.template_splices_by_shape, SpliceCounts::default());
    assert_eq!(
        (stats.off_policy_joins, stats.off_policy_context_tokens),
        (0, 0)
    );
}
