//! `[harness.NAME]`: harnesses the operator defines in the node's
//! configuration, which a task names `custom:NAME` ([`CustomHarness`]): the
//! command line, the environment and the files written into HOME, the API
//! the harness speaks and its shell tool, how its installation is checked.
//! The raw table ([`RawHarness`]) is checked here into its validated form,
//! with errors at `harness.NAME.<key>`.
//!
//! The configuration is trusted; a task only picks a name. The checks catch
//! an operator's mistakes before a session runs: a program given by a
//! relative path, a HOME file that would land outside HOME, a variable in
//! Polar's own `POLAR_` namespace, a placeholder that does not exist, and
//! `{instruction}` inside a shell's `-c` script (the task's instruction
//! would become shell code: such a command reads `"$POLAR_INSTRUCTION"`).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::error::{KeyError, KeyPath};
use polar_chat::Api;
use polar_spec::harness::{ModeKind, is_custom_name};

/// The placeholders a custom harness's command, variables and HOME files
/// may hold, replaced per session: the task's instruction, the root URL of
/// the harness's API (its real endpoint in transparent mode, the agent's
/// base-URL listener in base-URL mode) and the API key to send.
pub const PLACEHOLDERS: [&str; 3] = ["{instruction}", "{base_url}", "{api_key}"];

/// One `[harness.NAME]` table as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHarness {
    /// `command`: the argv, its program by name (found on `PATH`, after
    /// `bin_dir`) or by absolute path.
    pub command: Vec<String>,
    /// `api`: the API the harness speaks.
    pub api: Api,
    /// `shell_tool`: the name of the tool it runs shell commands with.
    pub shell_tool: Option<String>,
    /// `mode`: `transparent` (default) or `base_url`.
    pub mode: Option<String>,
    /// `env`: variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `files`: HOME-relative path = contents.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// `bin_dir`: the directory holding the program.
    pub bin_dir: Option<String>,
    /// `read_only`: more directories the sandbox must see.
    #[serde(default)]
    pub read_only: Vec<String>,
    /// `install_check`: the command that shows the harness is installed.
    pub install_check: Option<Vec<String>>,
}

/// A harness defined in the configuration, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomHarness {
    /// Its name (`[harness.NAME]`; a task writes `custom:NAME`).
    pub name: String,
    /// The argv, with placeholders.
    pub command: Vec<String>,
    /// The API it speaks.
    pub api: Api,
    /// Its shell tool, recorded with the session's metadata.
    pub shell_tool: Option<String>,
    /// The mode it runs in.
    pub mode: ModeKind,
    /// Variables, with placeholders.
    pub env: Vec<(String, String)>,
    /// HOME files (relative, no `..`), contents with placeholders.
    pub files: Vec<(PathBuf, String)>,
    /// Where its program is, put first on the sandbox's `PATH` (absolute).
    pub bin_dir: Option<PathBuf>,
    /// More directories bound read-only (absolute).
    pub read_only: Vec<PathBuf>,
    /// Run on the host before a session (bounded); must exit 0, its first
    /// line of output is the version. By default `PROGRAM --version`.
    pub install_check: Vec<String>,
}

fn invalid(key: &KeyPath, reason: impl Into<String>) -> KeyError {
    KeyError::new(key.clone(), reason)
}

/// The unknown `{word}` placeholders in `text`.
fn unknown_placeholders(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        rest = &rest[open..];
        let Some(close) = rest.find('}') else { break };
        let word = &rest[..=close];
        let inner = &word[1..word.len() - 1];
        if !inner.is_empty()
            && inner.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            && !PLACEHOLDERS.contains(&word)
        {
            out.push(word.to_owned());
        }
        rest = &rest[1..];
    }
    out
}

fn absolute(key: &KeyPath, text: &str) -> Result<PathBuf, KeyError> {
    let p = Path::new(text);
    if !p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(invalid(key, "an absolute path without `..`"));
    }
    Ok(p.to_owned())
}

fn program(key: &KeyPath, argv: &[String]) -> Result<(), KeyError> {
    let Some(first) = argv.first() else {
        return Err(invalid(key, "a non-empty argv"));
    };
    let p = Path::new(first);
    if first.trim().is_empty() || (p.components().count() > 1 && !p.is_absolute()) {
        return Err(invalid(
            &key.index(0),
            "a program by name (found on PATH) or by absolute path",
        ));
    }
    Ok(())
}

/// Whether `argv` hands a script to a shell with `-c`.
fn is_shell_script(argv: &[String]) -> bool {
    let shells = ["sh", "bash", "dash", "zsh", "ksh", "ash"];
    argv.first()
        .and_then(|p| Path::new(p).file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| shells.contains(&n))
        && argv
            .iter()
            .skip(1)
            .any(|a| a.starts_with('-') && a.contains('c'))
}

/// Checks `[harness.NAME]` tables.
pub(crate) fn validate_harnesses(
    raw: &BTreeMap<String, RawHarness>,
) -> Result<BTreeMap<String, CustomHarness>, KeyError> {
    raw.iter()
        .map(|(name, h)| {
            let key = KeyPath::root().key("harness").key(name);
            validate_harness(&key, name, h).map(|c| (name.clone(), c))
        })
        .collect()
}

fn validate_harness(key: &KeyPath, name: &str, h: &RawHarness) -> Result<CustomHarness, KeyError> {
    if !is_custom_name(name) {
        return Err(invalid(
            key,
            "a harness name is 1 to 64 of a-z, 0-9, `_`, `-`, starting with a letter",
        ));
    }
    command(&key.key("command"), &h.command)?;
    let mode = match h.mode.as_deref() {
        None | Some("transparent") => ModeKind::Transparent,
        Some("base_url") => ModeKind::BaseUrl,
        Some(_) => return Err(invalid(&key.key("mode"), "transparent or base_url")),
    };
    let env = env(&key.key("env"), &h.env)?;
    let files = home_files(&key.key("files"), &h.files)?;
    let bin_dir = h
        .bin_dir
        .as_deref()
        .map(|d| absolute(&key.key("bin_dir"), d))
        .transpose()?;
    let read_only = h
        .read_only
        .iter()
        .enumerate()
        .map(|(i, d)| absolute(&key.key("read_only").index(i), d))
        .collect::<Result<Vec<_>, _>>()?;
    let install_check = match &h.install_check {
        Some(argv) => {
            program(&key.key("install_check"), argv)?;
            argv.clone()
        }
        None => vec![h.command[0].clone(), "--version".into()],
    };
    if h.shell_tool.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(invalid(&key.key("shell_tool"), "a tool name"));
    }
    Ok(CustomHarness {
        name: name.to_owned(),
        command: h.command.clone(),
        api: h.api,
        shell_tool: h.shell_tool.clone(),
        mode,
        env,
        files,
        bin_dir,
        read_only,
        install_check,
    })
}

/// `command`: a program, known placeholders only, and never the task's
/// text inside a shell script.
fn command(key: &KeyPath, argv: &[String]) -> Result<(), KeyError> {
    program(key, argv)?;
    for (i, arg) in argv.iter().enumerate() {
        if let Some(p) = unknown_placeholders(arg).first() {
            return Err(invalid(
                &key.index(i),
                format!(
                    "unknown placeholder {p} (known: {})",
                    PLACEHOLDERS.join(", ")
                ),
            ));
        }
    }
    if is_shell_script(argv) && argv.iter().any(|a| a.contains("{instruction}")) {
        return Err(invalid(
            key,
            "{instruction} in a shell script would run the task's text as shell code: \
             read \"$POLAR_INSTRUCTION\" instead",
        ));
    }
    Ok(())
}

/// `env`: variable names, none of Polar's, values without NUL, known
/// placeholders only.
fn env(key: &KeyPath, vars: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, KeyError> {
    let mut env = Vec::new();
    for (k, v) in vars {
        let ek = key.key(k);
        let well_formed = k
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !well_formed {
            return Err(invalid(&ek, "a variable name: letters, digits and `_`"));
        }
        if k.starts_with("POLAR_") {
            return Err(invalid(&ek, "POLAR_ variables are Polar's own"));
        }
        if v.contains('\0') {
            return Err(invalid(&ek, "a value without NUL"));
        }
        if let Some(p) = unknown_placeholders(v).first() {
            return Err(invalid(&ek, format!("unknown placeholder {p}")));
        }
        env.push((k.clone(), v.clone()));
    }
    Ok(env)
}

/// `files`: paths relative to HOME without `.` or `..`.
fn home_files(
    key: &KeyPath,
    files: &BTreeMap<String, String>,
) -> Result<Vec<(PathBuf, String)>, KeyError> {
    files
        .iter()
        .map(|(rel, contents)| {
            let p = Path::new(rel);
            if rel.is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
                return Err(invalid(
                    &key.key(rel),
                    "a path relative to HOME, without `.` or `..`",
                ));
            }
            Ok((p.to_owned(), contents.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<BTreeMap<String, CustomHarness>, String> {
        #[derive(Deserialize)]
        struct File {
            harness: BTreeMap<String, RawHarness>,
        }
        let f: File = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        validate_harnesses(&f.harness).map_err(|e| e.to_string())
    }

    #[test]
    fn a_good_table_and_its_defaults() {
        let h = check(
            "[harness.pi-chat]\ncommand = [\"pi\", \"-p\", \"{instruction}\"]\napi = \"openai_chat\"\n\
             shell_tool = \"bash\"\nenv = { KEY = \"{api_key}\" }\n\
             files = { \".pi/agent/models.json\" = '{\"baseUrl\": \"{base_url}\"}' }\n",
        )
        .unwrap();
        let h = &h["pi-chat"];
        assert_eq!(h.api, Api::OpenaiChat);
        assert_eq!(h.mode, ModeKind::Transparent);
        assert_eq!(h.install_check, vec!["pi", "--version"]);
        assert_eq!(h.files[0].0, PathBuf::from(".pi/agent/models.json"));
        assert_eq!(h.env, vec![("KEY".into(), "{api_key}".into())]);
    }

    #[test]
    fn mistakes_are_refused_at_their_key() {
        let base = "api = \"openai_chat\"\n";
        for (table, key) in [
            ("[harness.Bad]\ncommand = [\"x\"]\n", "harness.Bad"),
            ("[harness.a]\ncommand = []\n", "harness.a.command"),
            (
                "[harness.a]\ncommand = [\"bin/x\"]\n",
                "harness.a.command[0]",
            ),
            (
                "[harness.a]\ncommand = [\"x\", \"{instructions}\"]\n",
                "harness.a.command[1]",
            ),
            (
                "[harness.a]\ncommand = [\"sh\", \"-c\", \"x {instruction}\"]\n",
                "harness.a.command",
            ),
            (
                "[harness.a]\ncommand = [\"x\"]\nmode = \"proxy\"\n",
                "harness.a.mode",
            ),
            (
                "[harness.a]\ncommand = [\"x\"]\nenv = { POLAR_INSTRUCTION = \"y\" }\n",
                "harness.a.env.POLAR_INSTRUCTION",
            ),
            (
                "[harness.a]\ncommand = [\"x\"]\nfiles = { \"../.ssh/keys\" = \"y\" }\n",
                "harness.a.files",
            ),
            (
                "[harness.a]\ncommand = [\"x\"]\nbin_dir = \"opt/bin\"\n",
                "harness.a.bin_dir",
            ),
            (
                "[harness.a]\ncommand = [\"x\"]\ninstall_check = []\n",
                "harness.a.install_check",
            ),
        ] {
            let e = check(&format!("{table}{base}")).unwrap_err();
            assert!(e.contains(key), "{key}: {e}");
        }
        let e =
            check("[harness.a]\ncommand = [\"x\"]\napi = \"openai_chat\"\nargs = 1\n").unwrap_err();
        assert!(e.contains("unknown field `args`"), "{e}");
        // A shell that reads the variable is fine.
        assert!(
            check("[harness.a]\ncommand = [\"sh\", \"-c\", \"agent \\\"$POLAR_INSTRUCTION\\\"\"]\napi = \"gemini\"\n")
                .is_ok()
        );
    }
}
