//! Where a file goes: `task=<task_id>/<name>.<ext>` under the destination
//! root, Hive-style, so Spark, pyarrow and DuckDB see `task` as a partition
//! column. Names are escaped so any task or session id is one safe path
//! component: bytes outside `[A-Za-z0-9._-]` (and a leading dot) become
//! `%XX`, overlong names are shortened with a hash.

use std::fmt::Write as _;

use super::format::Format;

/// The partition directory of sessions without a task (Hive's name for a
/// null partition value, which pyarrow and Spark read back as null).
pub const NULL_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

/// Longest escaped name kept whole; longer ones are cut and hashed.
const MAX_NAME: usize = 180;

/// A file's place relative to the destination root.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileKey {
    /// The partition directory (`task=...`).
    pub partition: String,
    /// The file name (`<name>.<ext>`).
    pub file: String,
}

impl FileKey {
    /// The key of file `name` (a session or batch id) of `task` in `format`.
    pub fn new(task: Option<&str>, name: &str, format: Format) -> Self {
        Self {
            partition: partition_dir(task),
            file: format!("{}.{}", escape(name), format.extension()),
        }
    }

    /// `partition/file`, with `/` separators.
    pub fn relative(&self) -> String {
        format!("{}/{}", self.partition, self.file)
    }
}

/// The partition directory of `task`.
pub fn partition_dir(task: Option<&str>) -> String {
    match task {
        Some(t) if !t.is_empty() => format!("task={}", escape(t)),
        _ => format!("task={NULL_PARTITION}"),
    }
}

/// `s` as one safe path component.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, b) in s.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-') || (b == b'.' && i > 0);
        if plain {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    if out.is_empty() {
        out.push_str("%00");
    }
    if out.len() > MAX_NAME {
        let hash = fnv1a(s.as_bytes());
        out.truncate(MAX_NAME - 17);
        // Never cut an escape in half.
        if let Some(p) = out.rfind('%').filter(|&p| p + 3 > out.len()) {
            out.truncate(p);
        }
        let _ = write!(out, "-{hash:016x}");
    }
    out
}

/// FNV-1a, 64 bits: a stable hash that needs no dependency.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_ids_stay_readable() {
        let k = FileKey::new(
            Some("swe-bench_42.v2"),
            "s-0123456789abcdef",
            Format::Parquet,
        );
        assert_eq!(
            k.relative(),
            "task=swe-bench_42.v2/s-0123456789abcdef.parquet"
        );
    }

    #[test]
    fn unsafe_bytes_are_escaped() {
        assert_eq!(escape("a/b c"), "a%2Fb%20c");
        assert_eq!(escape(".."), "%2E.");
        assert_eq!(escape(".hidden"), "%2Ehidden");
        assert_eq!(escape("é"), "%C3%A9");
        assert_eq!(escape("a=b%"), "a%3Db%25");
        assert_eq!(escape(""), "%00");
    }

    #[test]
    fn no_task_is_the_null_partition() {
        assert_eq!(partition_dir(None), "task=__HIVE_DEFAULT_PARTITION__");
        assert_eq!(partition_dir(Some("")), "task=__HIVE_DEFAULT_PARTITION__");
    }

    #[test]
    fn long_names_are_cut_and_hashed_distinctly() {
        let a = escape(&"x".repeat(500));
        let b = escape(&format!("{}y", "x".repeat(499)));
        assert!(a.len() <= MAX_NAME && b.len() <= MAX_NAME);
        assert_ne!(a, b);
        let c = escape(&"/".repeat(100));
        assert!(c.len() <= MAX_NAME, "{c}");
        assert!(!c.contains("%2-"), "an escape was cut: {c}");
    }
}
