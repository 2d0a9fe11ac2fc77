//! Test-output parsers (pure): a test command's output to per-test outcomes.
//!
//! - `pytest`: the `-rA` short summary lines (`PASSED path::name`,
//!   `FAILED path::name - message`, `ERROR path - message`, `SKIPPED [n]
//!   path::name: reason`, `XFAIL`, `XPASS`), the `-v` progress lines
//!   (`path::name STATUS [ 50%]`) and pytest-xdist's (`[gw0] [ 50%] STATUS
//!   path::name`). Node ids keep their parameters (`test_x[a-b]`, spaces and
//!   ` - ` inside the brackets included). Colour codes are removed.
//!   Skips reported by location only (`SKIPPED [2] t.py:12: reason`) name
//!   no test and are left out.
//! - `unittest`: `python -m unittest -v` (and Django's runner) lines
//!   `test_x (module.Class.test_x) ... ok|FAIL|ERROR|skipped '...'|expected
//!   failure|unexpected success`, the older `(module.Class)` form, a
//!   docstring's first line on the next line, the result on a later line
//!   after the test's own output, and the `FAIL: test_x (module.Class)`
//!   headers. Names are `module.Class.test_x`.
//! - `regex`: every line is matched against a pass and a fail expression
//!   with a named group `name`.
//!
//! A test reported several times keeps its worst status (a test that
//! `PASSED` and then had an `ERROR` in teardown is an error).

use std::collections::BTreeMap;

use regex::Regex;
use serde::Serialize;

/// A test's outcome, ordered from best to worst.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TestStatus {
    /// Passed.
    Passed,
    /// Failed as expected (`XFAIL`, `expected failure`).
    XFail,
    /// Skipped.
    Skipped,
    /// Passed though expected to fail (`XPASS`, `unexpected success`).
    XPass,
    /// Failed.
    Failed,
    /// Errored (setup, teardown, collection, an exception).
    Error,
}

impl TestStatus {
    /// Every status, best first.
    pub const ALL: [Self; 6] = [
        Self::Passed,
        Self::XFail,
        Self::Skipped,
        Self::XPass,
        Self::Failed,
        Self::Error,
    ];

    /// Whether the test counts as passed (as in SWE-bench: passed or xfail).
    pub fn is_success(self) -> bool {
        matches!(self, Self::Passed | Self::XFail)
    }

    /// Whether the test counts as failed (not passed, not skipped).
    pub fn is_failure(self) -> bool {
        matches!(self, Self::XPass | Self::Failed | Self::Error)
    }

    /// The status as written in details.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::XFail => "xfail",
            Self::Skipped => "skipped",
            Self::XPass => "xpass",
            Self::Failed => "failed",
            Self::Error => "error",
        }
    }

    fn from_pytest(word: &str) -> Option<Self> {
        Some(match word {
            "PASSED" => Self::Passed,
            "FAILED" => Self::Failed,
            "ERROR" => Self::Error,
            "SKIPPED" => Self::Skipped,
            "XFAIL" => Self::XFail,
            "XPASS" => Self::XPass,
            _ => return None,
        })
    }
}

/// Per-test outcomes by test name, in name order.
pub type TestOutcomes = BTreeMap<String, TestStatus>;

/// Records `status` for `name`, keeping the worst one seen.
fn record(outcomes: &mut TestOutcomes, name: &str, status: TestStatus) {
    let name = name.trim();
    if name.is_empty() {
        return;
    }
    outcomes
        .entry(name.to_owned())
        .and_modify(|s| *s = (*s).max(status))
        .or_insert(status);
}

/// A test-output parser.
#[derive(Clone, Debug)]
pub enum Parser {
    /// `pytest -rA` / `-v`.
    Pytest,
    /// `python -m unittest -v`.
    Unittest,
    /// Lines matching `pass` are passes, `fail` failures (group `name`).
    Regex {
        /// Passing tests.
        pass: Regex,
        /// Failing tests.
        fail: Option<Regex>,
    },
}

impl Parser {
    /// The parser's name, as in the options.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pytest => "pytest",
            Self::Unittest => "unittest",
            Self::Regex { .. } => "regex",
        }
    }

    /// Parses a command's output.
    pub fn parse(&self, output: &str) -> TestOutcomes {
        match self {
            Self::Pytest => pytest(output),
            Self::Unittest => unittest(output),
            Self::Regex { pass, fail } => regex(output, pass, fail.as_ref()),
        }
    }

    /// The name a parsed test has, for a name given in `fail_to_pass` or
    /// `pass_to_pass` (only `unittest` has several spellings).
    pub fn canonical_name(&self, name: &str) -> String {
        match self {
            Self::Unittest => unittest_name(name.trim()).unwrap_or_else(|| name.trim().to_owned()),
            Self::Pytest | Self::Regex { .. } => name.trim().to_owned(),
        }
    }
}

/// Removes ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(line: &str) -> std::borrow::Cow<'_, str> {
    if !line.contains('\u{1b}') {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Splits a pytest node id off the front of `s`: a path without spaces,
/// then, if a `[` follows, the parameters up to the matching `]`. Returns
/// the id and the rest.
fn split_nodeid(s: &str) -> Option<(&str, &str)> {
    let end = s
        .find(|c: char| c.is_whitespace() || c == '[')
        .unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    if !s[end..].starts_with('[') {
        return Some((&s[..end], &s[end..]));
    }
    let mut depth = 0usize;
    for (i, c) in s[end..].char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    let close = end + i + 1;
                    return Some((&s[..close], &s[close..]));
                }
            }
            _ => {}
        }
    }
    // Unbalanced brackets: the id runs to a message separator or the end.
    let close = s.find(" - ").unwrap_or(s.len());
    Some((s[..close].trim_end(), &s[close..]))
}

/// Whether a name looks like a pytest node id or test file (not a log
/// record's `logger:file:line`).
fn is_nodeid(id: &str) -> bool {
    id.contains("::") || id.ends_with(".py")
}

/// Parses `pytest -rA` / `-v` output.
pub fn pytest(output: &str) -> TestOutcomes {
    let mut outcomes = TestOutcomes::new();
    for raw in output.lines() {
        let line = strip_ansi(raw);
        let mut line = line.trim();
        // pytest-xdist prefixes: `[gw0] [ 50%] `.
        while let Some(rest) = line.strip_prefix('[') {
            match rest.split_once(']') {
                Some((inside, after))
                    if inside.starts_with("gw") || inside.trim_end().ends_with('%') =>
                {
                    line = after.trim_start();
                }
                _ => break,
            }
        }
        if let Some((name, status)) = pytest_summary(line).or_else(|| pytest_progress(line)) {
            record(&mut outcomes, name, status);
        }
    }
    outcomes
}

/// `STATUS nodeid[ - message]` (one space after the status word, unlike a
/// log record's padded level name).
fn pytest_summary(line: &str) -> Option<(&str, TestStatus)> {
    let (word, rest) = line.split_once(' ')?;
    let status = TestStatus::from_pytest(word)?;
    if rest.starts_with(char::is_whitespace) {
        return None;
    }
    let rest = if status == TestStatus::Skipped {
        // `SKIPPED [1] path::name: reason`
        let (count, after) = rest.strip_prefix('[')?.split_once("] ")?;
        count.parse::<u64>().ok()?;
        after
    } else {
        rest
    };
    let (id, _) = split_nodeid(rest)?;
    let id = if status == TestStatus::Skipped {
        id.strip_suffix(':').unwrap_or(id)
    } else {
        id
    };
    (id.contains("::") || (status != TestStatus::Skipped && is_nodeid(id))).then_some((id, status))
}

/// `nodeid STATUS[ (reason)][ [ 50%]]`.
fn pytest_progress(line: &str) -> Option<(&str, TestStatus)> {
    let (id, rest) = split_nodeid(line)?;
    if !id.contains("::") {
        return None;
    }
    let word = rest.split_whitespace().next()?;
    TestStatus::from_pytest(word).map(|status| (id, status))
}

/// The canonical name of a unittest test: `name (dotted)` or `name
/// (dotted.name)` to `dotted.name`; a dotted name as it is.
fn unittest_name(s: &str) -> Option<String> {
    let (name, rest) = s.split_once(" (")?;
    let dotted = rest.strip_suffix(')')?;
    let valid =
        |t: &str| !t.is_empty() && !t.contains(char::is_whitespace) && !t.contains(['(', ')']);
    if !valid(name) || !valid(dotted) {
        return None;
    }
    let suffix = dotted.strip_suffix(name);
    Some(if suffix.is_some_and(|d| d.ends_with('.')) {
        dotted.to_owned()
    } else {
        format!("{dotted}.{name}")
    })
}

/// A unittest result word (what follows ` ... `).
fn unittest_result(s: &str) -> Option<TestStatus> {
    let s = s.trim();
    Some(match s {
        "ok" => TestStatus::Passed,
        "FAIL" => TestStatus::Failed,
        "ERROR" => TestStatus::Error,
        "expected failure" => TestStatus::XFail,
        "unexpected success" => TestStatus::XPass,
        _ if s.starts_with("skipped") => TestStatus::Skipped,
        _ => return None,
    })
}

/// Parses `python -m unittest -v` output.
pub fn unittest(output: &str) -> TestOutcomes {
    let mut outcomes = TestOutcomes::new();
    // A test whose result is still to come (docstring line, own output).
    let mut pending: Option<String> = None;
    for raw in output.lines() {
        let line = strip_ansi(raw);
        let line = line.trim_end();
        if let Some((header, status)) = [
            ("FAIL: ", TestStatus::Failed),
            ("ERROR: ", TestStatus::Error),
            ("UNEXPECTED SUCCESS: ", TestStatus::XPass),
        ]
        .into_iter()
        .find_map(|(h, s)| line.strip_prefix(h).map(|rest| (rest, s)))
        {
            // `FAIL: test_x (m.C.test_x) (i=1)`: subtest parameters follow.
            let head = header.find(") (").map_or(header, |i| &header[..=i]);
            if let Some(name) = unittest_name(head) {
                record(&mut outcomes, &name, status);
            }
            pending = None;
            continue;
        }
        // `name (id) ... result`; the test's own output may hold ` ... ` too,
        // so the name is before the first and the result after the last.
        if let (Some((head, _)), Some((_, result))) =
            (line.split_once(" ... "), line.rsplit_once(" ... "))
        {
            let name = unittest_name(head.trim()).or_else(|| pending.take());
            match (name, unittest_result(result)) {
                (Some(name), Some(status)) => {
                    record(&mut outcomes, &name, status);
                    pending = None;
                }
                (Some(name), None) => pending = Some(name),
                (None, _) => {}
            }
            continue;
        }
        if let Some(rest) = line.strip_suffix(" ...") {
            // The test prints nothing yet: `test_x (m.C.test_x) ...`.
            pending = unittest_name(rest.trim()).or(pending);
            continue;
        }
        if let Some(name) = unittest_name(line.trim()) {
            pending = Some(name);
            continue;
        }
        if let (Some(status), Some(name)) = (unittest_result(line), pending.as_ref()) {
            record(&mut outcomes, name, status);
            pending = None;
        }
    }
    outcomes
}

/// Matches every line against `pass` and `fail` (group `name`).
pub fn regex(output: &str, pass: &Regex, fail: Option<&Regex>) -> TestOutcomes {
    let mut outcomes = TestOutcomes::new();
    for line in output.lines() {
        for (re, status) in [(Some(pass), TestStatus::Passed), (fail, TestStatus::Failed)] {
            let Some(re) = re else { continue };
            for caps in re.captures_iter(line) {
                if let Some(name) = caps.name("name") {
                    record(&mut outcomes, name.as_str(), status);
                }
            }
        }
    }
    outcomes
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
