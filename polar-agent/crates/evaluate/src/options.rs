//! Evaluator options: the raw object parsed into a kind's serde type
//! (unknown options rejected, errors naming the option), and the checks
//! shared by the evaluators that run commands: argv, timeout, env, and paths
//! relative to the workspace.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::{EvalError, isolation, workspace};

/// The default timeout of an evaluation command.
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// The longest timeout of an evaluation command (a day).
pub const MAX_TIMEOUT_SECS: u64 = 86_400;

/// Parses a kind's options, naming the option at fault.
pub(super) fn parse_raw<T: DeserializeOwned>(options: &Map<String, Value>) -> Result<T, EvalError> {
    serde_path_to_error::deserialize(Value::Object(options.clone())).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        if let Some(name) = quoted_field(&message, "missing field `") {
            return EvalError::option(name, "required");
        }
        if let Some(name) = quoted_field(&message, "unknown field `") {
            let known = message.split_once(", expected ").map_or("", |(_, k)| k);
            return EvalError::option(name, format!("unknown option; expected {known}"));
        }
        let option = if path == "." {
            "options".to_owned()
        } else {
            path
        };
        EvalError::option(option, message)
    })
}

fn quoted_field(message: &str, prefix: &str) -> Option<String> {
    let rest = message.strip_prefix(prefix)?;
    rest.split('`').next().map(str::to_owned)
}

/// The options of every evaluator that runs commands, as given (each
/// kind's serde type has these fields, `deny_unknown_fields` ruling out
/// `flatten`).
#[derive(Clone, Debug, Default)]
pub(super) struct RawRun {
    /// The command: a string for `sh -c`, or an argv array.
    pub command: Option<Value>,
    /// `timeout_secs`.
    pub timeout_secs: Option<u64>,
    /// `fresh`.
    pub fresh: Option<bool>,
    /// `env`.
    pub env: Option<BTreeMap<String, String>>,
    /// `tests`.
    pub tests: Option<String>,
    /// `restore`.
    pub restore: Option<Vec<String>>,
}

/// The checked options of every evaluator that runs commands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// The command's argv.
    pub argv: Vec<String>,
    /// How long each command may run.
    pub timeout: Duration,
    /// Run in a fresh sandbox.
    pub fresh: bool,
    /// Extra variables.
    pub env: Vec<(String, String)>,
    /// The workspace directory holding the task's uploaded tests, which
    /// pytest is pinned to ([`crate::isolation::pytest_addopts`]).
    pub tests: Option<PathBuf>,
    /// Workspace paths put back, before the evaluation's first command,
    /// as they were before the harness ran ([`Evaluator::restore_paths`]).
    ///
    /// [`Evaluator::restore_paths`]: crate::Evaluator::restore_paths
    pub restore: Vec<PathBuf>,
}

impl RunOptions {
    /// Checks the shared options; `reserved` are variables the evaluator
    /// sets itself.
    pub(super) fn check(raw: RawRun, reserved: &[&str]) -> Result<Self, EvalError> {
        let command = raw
            .command
            .ok_or_else(|| EvalError::option("command", "required"))?;
        let argv = argv_of("command", &command)?;
        let secs = raw.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS);
        if !(1..=MAX_TIMEOUT_SECS).contains(&secs) {
            return Err(EvalError::option(
                "timeout_secs",
                format!("must be between 1 and {MAX_TIMEOUT_SECS}, not {secs}"),
            ));
        }
        let mut env = Vec::new();
        for (name, value) in raw.env.unwrap_or_default() {
            let option = format!("env.{name}");
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(EvalError::option(
                    option,
                    "a variable name must be non-empty, without `=` or NUL",
                ));
            }
            if reserved.contains(&name.as_str()) {
                return Err(EvalError::option(option, "set by the evaluator itself"));
            }
            if value.contains('\0') {
                return Err(EvalError::option(option, "contains a NUL byte"));
            }
            env.push((name, value));
        }
        let tests = raw
            .tests
            .map(|t| {
                if t.contains(|c: char| c.is_whitespace() || "'\"\\".contains(c)) {
                    return Err(EvalError::option(
                        "tests",
                        format!("{t:?}: must not contain whitespace, quotes or backslashes"),
                    ));
                }
                relative_path("tests", &t)
            })
            .transpose()?;
        let restore = restore_paths(raw.restore.unwrap_or_default(), tests.as_deref())?;
        Ok(Self {
            argv,
            timeout: Duration::from_secs(secs),
            fresh: raw.fresh.unwrap_or(false),
            env,
            tests,
            restore,
        })
    }

    /// The command's variables for a session whose workspace is
    /// `workspace`: the evaluator's, with `PYTEST_ADDOPTS` pinned to
    /// `tests` when given (its configuration file, and whether it is a
    /// package, looked up beneath the workspace, off the async workers) and
    /// pytest's plugin autoloading off.
    pub(super) async fn env_for(&self, workspace: &Path) -> Vec<(String, String)> {
        let Some(tests) = &self.tests else {
            return self.env.clone();
        };
        let (ws, dir) = (workspace.to_owned(), tests.clone());
        let (config, package) = tokio::task::spawn_blocking(move || {
            let config = isolation::PYTEST_CONFIGS
                .into_iter()
                .find(|name| workspace::is_file(&ws, &dir.join(name)));
            let package = workspace::is_file(&ws, &dir.join(isolation::PACKAGE_MARKER));
            (config, package)
        })
        .await
        .unwrap_or((None, false));
        let task = self
            .env
            .iter()
            .find(|(k, _)| k == "PYTEST_ADDOPTS")
            .map(|(_, v)| v.as_str());
        let mut env: Vec<(String, String)> = self
            .env
            .iter()
            .filter(|(k, _)| k != "PYTEST_ADDOPTS")
            .cloned()
            .collect();
        env.push((
            "PYTEST_ADDOPTS".to_owned(),
            isolation::pytest_addopts(tests, config, package, task),
        ));
        env.push(("PYTEST_DISABLE_PLUGIN_AUTOLOAD".to_owned(), "1".to_owned()));
        env
    }
}

/// The most paths `restore` may list.
pub const MAX_RESTORE_PATHS: usize = 64;

/// Checks `restore`: at most [`MAX_RESTORE_PATHS`] paths relative to the
/// workspace, none inside another (or the same twice), none holding or
/// inside `tests` (uploaded after the run: putting it back would undo the
/// upload). Sorted.
fn restore_paths(given: Vec<String>, tests: Option<&Path>) -> Result<Vec<PathBuf>, EvalError> {
    if given.len() > MAX_RESTORE_PATHS {
        return Err(EvalError::option(
            "restore",
            format!("at most {MAX_RESTORE_PATHS} paths, not {}", given.len()),
        ));
    }
    let mut paths = Vec::with_capacity(given.len());
    for (i, p) in given.iter().enumerate() {
        let option = format!("restore[{i}]");
        let path = relative_path(&option, p)?;
        if let Some(t) = tests
            && (path.starts_with(t) || t.starts_with(&path))
        {
            return Err(EvalError::option(
                option,
                format!(
                    "{p:?} overlaps `tests` ({}), which is uploaded after the run",
                    t.display()
                ),
            ));
        }
        paths.push(path);
    }
    paths.sort();
    for pair in paths.windows(2) {
        if pair[1].starts_with(&pair[0]) {
            return Err(EvalError::option(
                "restore",
                format!(
                    "{} is listed with {} (one holds the other)",
                    pair[1].display(),
                    pair[0].display()
                ),
            ));
        }
    }
    Ok(paths)
}

/// A command option (`option`): a non-empty string run with `sh -c`, or a
/// non-empty array of strings.
pub(super) fn argv_of(option: &str, command: &Value) -> Result<Vec<String>, EvalError> {
    let bad = |reason: &str| EvalError::option(option, reason);
    let argv = match command {
        Value::String(s) if s.trim().is_empty() => return Err(bad("must not be empty")),
        Value::String(s) => vec!["sh".to_owned(), "-c".to_owned(), s.clone()],
        Value::Array(items) => {
            let argv = items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("an argv array must hold only strings"))?;
            match argv.first() {
                None => return Err(bad("an argv array must not be empty")),
                Some(program) if program.is_empty() => {
                    return Err(bad("the program (first element) must not be empty"));
                }
                Some(_) => argv,
            }
        }
        _ => {
            return Err(bad(
                "must be a string (run with sh -c) or an array of strings (the argv)",
            ));
        }
    };
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(bad("contains a NUL byte"));
    }
    Ok(argv)
}

/// Checks a path relative to the workspace: not empty, not absolute, no
/// `..`, naming a file.
pub(super) fn relative_path(option: &str, path: &str) -> Result<PathBuf, EvalError> {
    let bad = |reason: &str| EvalError::option(option, format!("{path:?}: {reason}"));
    if path.is_empty() {
        return Err(EvalError::option(option, "must not be empty"));
    }
    if path.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    let p = Path::new(path);
    let mut normal = PathBuf::new();
    for component in p.components() {
        match component {
            Component::Normal(c) => normal.push(c),
            Component::CurDir => {}
            Component::ParentDir => return Err(bad("must not contain `..`")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(bad("must be relative to the workspace, not absolute"));
            }
        }
    }
    if normal.as_os_str().is_empty() {
        return Err(bad("must name a file in the workspace"));
    }
    Ok(normal)
}

/// The last `max` bytes of `s` (cut at a character boundary), for details.
pub(super) fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}
