//! A command's output as the evaluators read it ([`CommandOutput::read`]):
//! each stream whole up to [`MAX_STREAM_BYTES`], else its start and its
//! end (cut at line ends) around a line saying how many bytes were left
//! out.
//!
//! The end is kept because the test runners print their verdicts last
//! (pytest's `-rA` summary, unittest's totals), after the tests' captured
//! output: with the start alone, a solution that prints enough pushes the
//! real summary out of what is read. Lines left out can still hold
//! verdicts (`-v` progress lines, or a summary that a process the
//! solution started buried under more output), so `test_output` scores a
//! cut output as the policy's failure rather than parse part of it
//! ([`crate::Broken::TooMuchOutput`]).

use std::io::{self, Read, Seek, SeekFrom};

use super::CommandOutput;

/// The most of each stream read whole.
pub const MAX_STREAM_BYTES: u64 = 4 << 20;

impl CommandOutput {
    /// Reads the two streams of a command that ended with `exit`, each of
    /// `len` bytes, read from its start (see the module doc). Blocks.
    pub fn read(
        exit: Option<i32>,
        (mut stdout, stdout_len): (impl Read + Seek, u64),
        (mut stderr, stderr_len): (impl Read + Seek, u64),
    ) -> io::Result<Self> {
        Ok(Self {
            exit,
            stdout: ends(&mut stdout, stdout_len, MAX_STREAM_BYTES)?,
            stderr: ends(&mut stderr, stderr_len, MAX_STREAM_BYTES)?,
            stdout_bytes: stdout_len,
            stderr_bytes: stderr_len,
        })
    }

    /// Output held in memory, taken as [`CommandOutput::read`] takes it.
    pub fn of_bytes(exit: Option<i32>, stdout: &[u8], stderr: &[u8]) -> Self {
        let take = |b: &[u8]| {
            let len = b.len() as u64;
            if len <= MAX_STREAM_BYTES {
                return String::from_utf8_lossy(b).into_owned();
            }
            let half = (MAX_STREAM_BYTES / 2) as usize;
            join(&b[..half], &b[b.len() - half..], len)
        };
        Self {
            exit,
            stdout: take(stdout),
            stderr: take(stderr),
            stdout_bytes: stdout.len() as u64,
            stderr_bytes: stderr.len() as u64,
        }
    }

    /// Whether a stream was over [`MAX_STREAM_BYTES`], its middle left out.
    pub fn cut(&self) -> bool {
        self.stdout_bytes > MAX_STREAM_BYTES || self.stderr_bytes > MAX_STREAM_BYTES
    }
}

/// The `len` bytes of `r`: whole when at most `limit`, else the first and
/// the last `limit / 2` bytes ([`join`]).
fn ends(r: &mut (impl Read + Seek), len: u64, limit: u64) -> io::Result<String> {
    r.seek(SeekFrom::Start(0))?;
    let mut head = Vec::new();
    if len <= limit {
        r.take(limit).read_to_end(&mut head)?;
        return Ok(String::from_utf8_lossy(&head).into_owned());
    }
    let half = limit / 2;
    r.take(half).read_to_end(&mut head)?;
    r.seek(SeekFrom::Start(len - half))?;
    let mut tail = Vec::new();
    r.take(half).read_to_end(&mut tail)?;
    Ok(join(&head, &tail, len))
}

/// The start `head` and the end `tail` of a stream of `len` bytes, cut at
/// line ends (a line longer than either is kept cut), around a line saying
/// how many bytes were left out.
fn join(head: &[u8], tail: &[u8], len: u64) -> String {
    let head = match head.iter().rposition(|&b| b == b'\n') {
        Some(end) => &head[..=end],
        None => head,
    };
    let tail = match tail.iter().position(|&b| b == b'\n') {
        Some(start) => &tail[start + 1..],
        None => tail,
    };
    let left_out = len.saturating_sub((head.len() + tail.len()) as u64);
    let mut out = String::from_utf8_lossy(head).into_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "[polar: {left_out} bytes of this output left out]\n"
    ));
    out.push_str(&String::from_utf8_lossy(tail));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_stream_is_read_whole_and_a_long_one_by_its_ends() {
        let out = CommandOutput::of_bytes(Some(0), b"a\nb\n", b"");
        assert_eq!((out.stdout.as_str(), out.cut()), ("a\nb\n", false));

        // A flood of passing lines, then the runner's summary.
        let flood = "PASSED t.py::test_add\n".repeat(300_000);
        let text = format!("start\n{flood}FAILED t.py::test_add - assert 1 == 5\n");
        let out = CommandOutput::of_bytes(Some(1), text.as_bytes(), b"");
        assert!(out.cut());
        assert_eq!(out.stdout_bytes, text.len() as u64);
        assert!(out.stdout.starts_with("start\nPASSED"));
        assert!(
            out.stdout
                .ends_with("PASSED t.py::test_add\nFAILED t.py::test_add - assert 1 == 5\n")
        );
        assert!(out.stdout.len() as u64 <= MAX_STREAM_BYTES + 100);
        // Whole lines only, and the count of what was left out is true.
        let marker = out
            .stdout
            .lines()
            .find(|l| l.starts_with("[polar: "))
            .unwrap();
        let left: usize = marker["[polar: ".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(left + out.stdout.len() - marker.len() - 1, text.len());
        assert!(out.stdout.lines().all(|l| {
            l == "start" || l.starts_with("PASSED t.py") || l.starts_with("FAILED") || l == marker
        }));

        // Read from a file, the same.
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
        let read = CommandOutput::read(Some(1), (f, text.len() as u64), (io::Cursor::new(b""), 0))
            .unwrap();
        assert!(read == out, "the file's read differs from memory's");

        // One line longer than the limit is cut where it must be.
        let one = "x".repeat(5 << 20);
        let out = CommandOutput::of_bytes(Some(0), b"", one.as_bytes());
        assert!(out.cut() && out.stderr.contains("[polar: "));
        assert!(out.stderr.len() as u64 <= MAX_STREAM_BYTES + 100);
    }
}
