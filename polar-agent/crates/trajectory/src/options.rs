//! Which builder makes the traces, and its options. Serializable, so a task
//! can choose its builder.

use serde::{Deserialize, Serialize};

use super::template::TemplateInfo;

/// The trajectory builder.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Builder {
    /// One trace per call, loss 1 on every generated token.
    PerRequest,
    /// Calls extending earlier calls merge into one trace.
    PrefixMerging(PrefixMergingOptions),
}

impl Default for Builder {
    fn default() -> Self {
        Self::PrefixMerging(PrefixMergingOptions::default())
    }
}

/// Options of the prefix-merging builder.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PrefixMergingOptions {
    /// The template's special token ids. Without them, template mismatches
    /// are recognised only by position and always start a new segment.
    pub template: Option<TemplateInfo>,
    /// Splice template mismatches into the trace (when `template` is known
    /// and the tokens allow it) instead of starting a new segment.
    pub splice: bool,
    /// What becomes of a call a retry superseded.
    pub retries: RetryPolicy,
}

impl Default for PrefixMergingOptions {
    fn default() -> Self {
        Self {
            template: None,
            splice: true,
            retries: RetryPolicy::default(),
        }
    }
}

/// What becomes of a call a retry superseded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryPolicy {
    /// Delivered as its own single-call trace labelled `superseded_retry`
    /// (what the model generated is never lost; a trainer may filter it).
    #[default]
    KeepAsTrace,
    /// Left out, listed in `calls_dropped` with reason `superseded_retry`.
    Drop,
}
