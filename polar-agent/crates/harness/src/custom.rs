//! A harness the node's configuration defines (`[harness.NAME]`,
//! [`CustomHarness`]): its set-up for one session (the placeholders of its
//! command line, variables and HOME files replaced) and the check that it
//! is installed (its program found, its install check run).
//!
//! `{base_url}` is the root of the harness's API: in transparent mode the
//! provider's real endpoint (`https://api.openai.com/v1`, ...), which the
//! redirect brings to the agent like any hard-coded one; in base-URL mode
//! the agent's base-URL listener (with `/v1` for the OpenAI APIs).
//! `{api_key}` is a placeholder key in transparent mode (the session is the
//! kernel's attribution) and the session's key in base-URL mode.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::presets::Setup;
use super::{HarnessError, Install, Mode};
use polar_chat::Api;
use polar_config::CustomHarness;

/// The key a harness is given in transparent mode.
pub const SANDBOX_KEY: &str = "sk-polar-sandbox";

/// The root URL of `api` in `mode`.
pub fn base_url(api: Api, mode: &Mode) -> String {
    let v1 = matches!(api, Api::OpenaiChat | Api::OpenaiResponses);
    match mode {
        Mode::Transparent => match api {
            Api::AnthropicMessages => "https://api.anthropic.com".into(),
            Api::OpenaiChat | Api::OpenaiResponses => "https://api.openai.com/v1".into(),
            Api::Gemini => "https://generativelanguage.googleapis.com".into(),
        },
        Mode::BaseUrl { url, .. } if v1 => format!("{url}/v1"),
        Mode::BaseUrl { url, .. } => url.clone(),
    }
}

/// `text` with the placeholders replaced, in one pass (a replaced value is
/// never scanned again: an instruction holding `{api_key}` stays as
/// written).
fn expand(text: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        rest = &rest[open..];
        for (name, value) in values {
            if let Some(after) = rest.strip_prefix(name) {
                out.push_str(value);
                rest = after;
                continue 'scan;
            }
        }
        out.push('{');
        rest = &rest[1..];
    }
    out.push_str(rest);
    out
}

/// The set-up of `h` for `instruction` in `mode` (without Polar's own
/// variables, which [`super::presets::setup`] adds).
pub fn setup(h: &CustomHarness, instruction: &str, mode: &Mode) -> Setup {
    let base = base_url(h.api, mode);
    let key = match mode {
        Mode::Transparent => SANDBOX_KEY,
        Mode::BaseUrl { key, .. } => key.as_str(),
    };
    let values = [
        ("{instruction}", instruction),
        ("{base_url}", base.as_str()),
        ("{api_key}", key),
    ];
    Setup {
        argv: h.command.iter().map(|a| expand(a, &values)).collect(),
        env: h
            .env
            .iter()
            .map(|(k, v)| (k.clone(), expand(v, &values)))
            .collect(),
        files: h
            .files
            .iter()
            .map(|(p, c)| (p.clone(), expand(c, &values)))
            .collect(),
    }
}

/// Finds `program` (an absolute path, or a name in `bin_dir` then `dirs`).
fn locate(
    program: &str,
    bin_dir: Option<&Path>,
    dirs: &[PathBuf],
) -> Result<PathBuf, Vec<PathBuf>> {
    if Path::new(program).is_absolute() {
        let p = PathBuf::from(program);
        return if p.is_file() { Ok(p) } else { Err(Vec::new()) };
    }
    let searched: Vec<PathBuf> = bin_dir
        .map(Path::to_path_buf)
        .into_iter()
        .chain(dirs.iter().cloned())
        .collect();
    let found = searched
        .iter()
        .map(|d| d.join(program))
        .find(|p| p.is_file());
    found.ok_or(searched)
}

/// Checks that `h` is installed: finds its program and runs its install
/// check (bounded by `timeout`). The installation's read-only directories
/// are the program's, as for a preset, and the configured `read_only`.
pub fn check_installed(
    h: &CustomHarness,
    dirs: &[PathBuf],
    timeout: Duration,
) -> Result<Install, HarnessError> {
    let not_installed = |binary: &str, searched: Vec<PathBuf>| HarnessError::NotInstalled {
        harness: format!("custom:{}", h.name),
        binary: binary.to_owned(),
        searched: searched
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let program = &h.command[0];
    let path = locate(program, h.bin_dir.as_deref(), dirs)
        .map_err(|searched| not_installed(program, searched))?;
    let check = locate(&h.install_check[0], h.bin_dir.as_deref(), dirs)
        .map_err(|searched| not_installed(&h.install_check[0], searched))?;
    let version = super::first_line_of(&check, &h.install_check[1..], timeout)?;
    let mut install = super::install_at(path, version);
    install.read_only.extend(h.read_only.iter().cloned());
    install.read_only.sort();
    install.read_only.dedup();
    Ok(install)
}

#[cfg(test)]
mod tests {
    use super::*;
    use polar_spec::harness::ModeKind;

    fn harness(dir: Option<PathBuf>) -> CustomHarness {
        CustomHarness {
            name: "agent".into(),
            command: vec!["my-agent".into(), "--task".into(), "{instruction}".into()],
            api: Api::OpenaiChat,
            shell_tool: Some("bash".into()),
            mode: ModeKind::Transparent,
            env: vec![
                ("AGENT_URL".into(), "{base_url}".into()),
                ("AGENT_KEY".into(), "{api_key}".into()),
            ],
            files: vec![(
                PathBuf::from(".agent/c.json"),
                r#"{"url": "{base_url}", "n": {"a": 1}}"#.into(),
            )],
            bin_dir: dir,
            read_only: vec![PathBuf::from("/opt/agent-data")],
            install_check: vec!["my-agent".into(), "version".into()],
        }
    }

    #[test]
    fn placeholders_are_replaced_once_per_mode() {
        let h = harness(None);
        let s = setup(&h, "fix {api_key} and $HOME", &Mode::Transparent);
        assert_eq!(
            s.argv,
            vec!["my-agent", "--task", "fix {api_key} and $HOME"]
        );
        assert_eq!(s.env[0].1, "https://api.openai.com/v1");
        assert_eq!(s.env[1].1, SANDBOX_KEY);
        assert_eq!(
            s.files[0].1,
            r#"{"url": "https://api.openai.com/v1", "n": {"a": 1}}"#
        );
        let m = Mode::BaseUrl {
            url: "http://127.0.0.1:8787".into(),
            key: "polar-k".into(),
        };
        let s = setup(&h, "x", &m);
        assert_eq!(s.env[0].1, "http://127.0.0.1:8787/v1");
        assert_eq!(s.env[1].1, "polar-k");
        assert_eq!(
            base_url(Api::AnthropicMessages, &m),
            "http://127.0.0.1:8787"
        );
        assert_eq!(
            base_url(Api::Gemini, &Mode::Transparent),
            "https://generativelanguage.googleapis.com"
        );
    }

    #[test]
    fn installed_means_found_and_its_check_passing() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let h = harness(Some(bin.clone()));
        let e = check_installed(&h, &[], Duration::from_secs(5))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("custom:agent is not installed") && e.contains("bin"),
            "{e}"
        );
        let script = bin.join("my-agent");
        std::fs::write(
            &script,
            "#!/bin/sh\n[ \"$1\" = version ] && echo 'agent 1.2.3' && exit 0\nexit 3\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let i = check_installed(&h, &[], Duration::from_secs(5)).unwrap();
        assert_eq!(i.version, "agent 1.2.3");
        assert_eq!(i.bin_dir, bin);
        assert!(
            i.read_only.contains(&PathBuf::from("/opt/agent-data")),
            "{:?}",
            i.read_only
        );
        let mut failing = h.clone();
        failing.install_check = vec!["my-agent".into(), "--nope".into()];
        let e = check_installed(&failing, &[], Duration::from_secs(5))
            .unwrap_err()
            .to_string();
        assert!(e.contains("failed"), "{e}");
    }
}
