//! What each harness needs to run unattended in a sandbox: its command line
//! with tool use approved, the files written into its HOME and its
//! variables, in transparent mode (it keeps its hard-coded endpoint) and in
//! base-URL mode (pointed at the agent with a per-session key). Observed
//! behaviour behind each choice: HARNESSES.md in the shared docs. The
//! Python harnesses' presets are in [`super::litellm`].

use std::path::PathBuf;

use super::{Harness, HarnessName, Mode};

/// The model each harness is told to use (the backend answers any name).
pub const CODEX_MODEL: &str = "gpt-5";
/// Anthropic model named to opencode and pi.
pub const ANTHROPIC_MODEL: &str = "claude-sonnet-4-5";
/// The model Gemini CLI is pinned to: with a model named, it skips its
/// router (a non-streamed classifier call before every turn).
pub const GEMINI_MODEL: &str = "gemini-2.5-pro";
/// Model named in OpenAI-compatible set-ups (Qwen Code, base-URL mode).
pub const OPENAI_MODEL: &str = "polar-model";
/// The model Copilot CLI is given: one of its catalog's, so that its
/// agent configuration (tools, limits) is the one it ships for it; spoken
/// to over OpenAI Chat, its provider's default wire API (its help advises
/// Responses for GPT-5 models only).
pub const COPILOT_MODEL: &str = "gpt-4.1";
/// The model Hermes Agent is given on its DashScope provider.
pub const HERMES_MODEL: &str = "qwen3-coder-plus";

/// A harness's command line, environment and HOME files for one session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Setup {
    /// Argv inside the sandbox (the program by name, found on `PATH`).
    pub argv: Vec<String>,
    /// Environment.
    pub env: Vec<(String, String)>,
    /// Files written under HOME: (relative path, contents).
    pub files: Vec<(PathBuf, String)>,
}

pub(super) fn kv(k: &str, v: &str) -> (String, String) {
    (k.to_owned(), v.to_owned())
}

fn file(path: &str, contents: String) -> (PathBuf, String) {
    (PathBuf::from(path), contents)
}

/// The set-up of `harness` for `instruction`. `command` is the shell
/// preset's custom command (empty: run the instruction with `sh -c`).
/// Every harness is also given `POLAR_INSTRUCTION` (and in base-URL mode
/// `POLAR_BASE_URL` and `POLAR_API_KEY`).
pub fn setup(harness: &Harness, instruction: &str, mode: &Mode, command: &[String]) -> Setup {
    let mut s = match harness {
        Harness::Preset(h) => preset(*h, instruction, mode, command),
        Harness::Custom(c) => super::custom::setup(c, instruction, mode),
    };
    s.env.push(kv("POLAR_INSTRUCTION", instruction));
    if let Mode::BaseUrl { url, key } = mode {
        s.env.push(kv("POLAR_BASE_URL", url));
        s.env.push(kv("POLAR_API_KEY", key));
    }
    s
}

fn preset(harness: HarnessName, instruction: &str, mode: &Mode, command: &[String]) -> Setup {
    let i = instruction.to_owned();
    match harness {
        HarnessName::Codex => codex(i, mode),
        HarnessName::ClaudeCode => claude_code(i, mode),
        HarnessName::GeminiCli => gemini_cli(i, mode),
        HarnessName::QwenCode => qwen_code(i, mode),
        HarnessName::Opencode => opencode(i, mode),
        HarnessName::Pi => pi(i, mode),
        HarnessName::MiniSweAgent => super::litellm::mini_swe_agent(i, mode),
        HarnessName::Aider => super::litellm::aider(i, mode),
        HarnessName::Openhands => super::litellm::openhands(mode),
        HarnessName::Copilot => copilot(i, mode),
        HarnessName::Hermes => hermes(i, mode),
        HarnessName::Shell => Setup {
            argv: if command.is_empty() {
                vec!["sh".into(), "-c".into(), i]
            } else {
                command.to_vec()
            },
            ..Setup::default()
        },
    }
}

fn codex(i: String, mode: &Mode) -> Setup {
    let mut argv: Vec<String> = [
        "codex",
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "-m",
        CODEX_MODEL,
        "-c",
        "analytics.enabled=false",
    ]
    .map(String::from)
    .to_vec();
    argv.push(i);
    match mode {
        Mode::Transparent => Setup {
            argv,
            env: vec![kv("OPENAI_API_KEY", "sk-polar-sandbox")],
            files: vec![file(
                ".codex/config.toml",
                format!("model = \"{CODEX_MODEL}\"\n"),
            )],
        },
        Mode::BaseUrl { url, key } => Setup {
            argv,
            env: vec![kv("POLAR_CODEX_KEY", key)],
            files: vec![file(
                ".codex/config.toml",
                format!(
                    "model = \"{CODEX_MODEL}\"\nmodel_provider = \"polar\"\n\n\
                     [model_providers.polar]\nname = \"Polar\"\nbase_url = \"{url}/v1\"\n\
                     env_key = \"POLAR_CODEX_KEY\"\nwire_api = \"responses\"\n"
                ),
            )],
        },
    }
}

fn claude_code(i: String, mode: &Mode) -> Setup {
    let mut env = vec![
        kv("IS_SANDBOX", "1"),
        kv("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        kv("DISABLE_AUTOUPDATER", "1"),
    ];
    match mode {
        Mode::Transparent => env.push(kv("ANTHROPIC_API_KEY", "sk-ant-polar-sandbox")),
        Mode::BaseUrl { url, key } => {
            env.push(kv("ANTHROPIC_BASE_URL", url));
            env.push(kv("ANTHROPIC_API_KEY", key));
        }
    }
    Setup {
        argv: vec![
            "claude".into(),
            "-p".into(),
            "--dangerously-skip-permissions".into(),
            i,
        ],
        env,
        files: Vec::new(),
    }
}

fn gemini_cli(i: String, mode: &Mode) -> Setup {
    let settings = r#"{"security":{"auth":{"selectedType":"gemini-api-key"}},"privacy":{"usageStatisticsEnabled":false}}"#;
    let env = match mode {
        Mode::Transparent => vec![kv("GEMINI_API_KEY", "polar-sandbox-key")],
        Mode::BaseUrl { url, key } => {
            vec![kv("GOOGLE_GEMINI_BASE_URL", url), kv("GEMINI_API_KEY", key)]
        }
    };
    Setup {
        argv: vec![
            "gemini".into(),
            "-m".into(),
            GEMINI_MODEL.into(),
            "-p".into(),
            i,
            "--yolo".into(),
            "--skip-trust".into(),
        ],
        env,
        files: vec![file(".gemini/settings.json", settings.to_owned())],
    }
}

fn qwen_code(i: String, mode: &Mode) -> Setup {
    let settings = r#"{"security":{"auth":{"selectedType":"openai"}},"privacy":{"usageStatisticsEnabled":false}}"#;
    let mut env = vec![kv("OPENAI_MODEL", OPENAI_MODEL)];
    match mode {
        // No base URL: Qwen Code's openai auth goes to DashScope, a model
        // route of its own.
        Mode::Transparent => env.push(kv("OPENAI_API_KEY", "sk-polar-sandbox")),
        Mode::BaseUrl { url, key } => {
            env.push(kv("OPENAI_BASE_URL", &format!("{url}/v1")));
            env.push(kv("OPENAI_API_KEY", key));
        }
    }
    Setup {
        argv: vec!["qwen".into(), "-p".into(), i, "--yolo".into()],
        env,
        files: vec![file(".qwen/settings.json", settings.to_owned())],
    }
}

fn opencode(i: String, mode: &Mode) -> Setup {
    match mode {
        Mode::Transparent => Setup {
            argv: vec![
                "opencode".into(),
                "run".into(),
                "--auto".into(),
                "-m".into(),
                format!("anthropic/{ANTHROPIC_MODEL}"),
                i,
            ],
            env: vec![kv("ANTHROPIC_API_KEY", "sk-ant-polar-sandbox")],
            files: vec![file(
                ".config/opencode/opencode.json",
                r#"{"$schema":"https://opencode.ai/config.json","autoupdate":false,"share":"disabled"}"#
                    .to_owned(),
            )],
        },
        Mode::BaseUrl { url, key } => Setup {
            argv: vec![
                "opencode".into(),
                "run".into(),
                "--auto".into(),
                "-m".into(),
                format!("polar/{OPENAI_MODEL}"),
                i,
            ],
            env: Vec::new(),
            files: vec![file(
                ".config/opencode/opencode.json",
                serde_json::json!({
                    "$schema": "https://opencode.ai/config.json",
                    "autoupdate": false,
                    "share": "disabled",
                    "model": format!("polar/{OPENAI_MODEL}"),
                    "provider": {"polar": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "Polar",
                        "options": {"baseURL": format!("{url}/v1"), "apiKey": key},
                        "models": {OPENAI_MODEL: {"name": "Polar", "tool_call": true}}
                    }}
                })
                .to_string(),
            )],
        },
    }
}

fn pi(i: String, mode: &Mode) -> Setup {
    match mode {
        Mode::Transparent => Setup {
            argv: vec![
                "pi".into(),
                "-p".into(),
                "--model".into(),
                format!("anthropic/{ANTHROPIC_MODEL}"),
                i,
            ],
            env: vec![kv("ANTHROPIC_API_KEY", "sk-ant-polar-sandbox")],
            files: Vec::new(),
        },
        Mode::BaseUrl { url, key } => Setup {
            argv: vec![
                "pi".into(),
                "-p".into(),
                "--model".into(),
                format!("polar/{OPENAI_MODEL}"),
                i,
            ],
            env: Vec::new(),
            files: vec![file(
                ".pi/agent/models.json",
                serde_json::json!({"providers": {"polar": {
                    "baseUrl": format!("{url}/v1"),
                    "api": "openai-completions",
                    "apiKey": key,
                    "models": [{"id": OPENAI_MODEL}]
                }}})
                .to_string(),
            )],
        },
    }
}

/// Copilot CLI with its bring-your-own-model provider (OpenAI Chat) and
/// offline: no GitHub login, no call to GitHub's Copilot services, no
/// telemetry, no update check. In transparent mode the provider is OpenAI's
/// real endpoint, which the built-in routes intercept; Copilot CLI has no
/// other way to reach a model without a GitHub token (HARNESSES-MORE.md).
fn copilot(i: String, mode: &Mode) -> Setup {
    let (base, key) = match mode {
        Mode::Transparent => ("https://api.openai.com/v1".to_owned(), "sk-polar-sandbox"),
        Mode::BaseUrl { url, key } => (format!("{url}/v1"), key.as_str()),
    };
    Setup {
        argv: vec![
            "copilot".into(),
            "-p".into(),
            i,
            "--allow-all-tools".into(),
            "--allow-all-paths".into(),
            "--no-ask-user".into(),
            "--no-auto-update".into(),
            "--disable-client-telemetry".into(),
        ],
        env: vec![
            kv("COPILOT_OFFLINE", "true"),
            kv("COPILOT_AUTO_UPDATE", "false"),
            kv("COPILOT_PROVIDER_TYPE", "openai"),
            kv("COPILOT_PROVIDER_BASE_URL", &base),
            kv("COPILOT_PROVIDER_API_KEY", key),
            kv("COPILOT_MODEL", COPILOT_MODEL),
        ],
        files: Vec::new(),
    }
}

/// Hermes Agent in one-shot mode (`-z`: approvals bypassed, only the final
/// answer printed) on its DashScope provider (`alibaba`, OpenAI Chat at
/// `dashscope-intl.aliyuncs.com`, a built-in model route), with its
/// run-time package installs off (its environment is read-only in the
/// sandbox).
fn hermes(i: String, mode: &Mode) -> Setup {
    let mut env = vec![kv("HERMES_DISABLE_LAZY_INSTALLS", "1")];
    match mode {
        Mode::Transparent => env.push(kv("DASHSCOPE_API_KEY", "sk-polar-sandbox")),
        Mode::BaseUrl { url, key } => {
            env.push(kv("DASHSCOPE_BASE_URL", &format!("{url}/v1")));
            env.push(kv("DASHSCOPE_API_KEY", key));
        }
    }
    Setup {
        argv: vec![
            "hermes".into(),
            "-z".into(),
            i,
            "--provider".into(),
            "alibaba".into(),
            "-m".into(),
            HERMES_MODEL.into(),
            "--yolo".into(),
        ],
        env,
        files: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(s: &'a Setup, k: &str) -> Option<&'a str> {
        s.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn transparent_command_lines_match_what_was_observed() {
        let t = Mode::Transparent;
        let line = |h: HarnessName| setup(&h.into(), "do it", &t, &[]).argv.join(" ");
        assert_eq!(
            line(HarnessName::Codex),
            "codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -m gpt-5 -c analytics.enabled=false do it"
        );
        assert_eq!(
            line(HarnessName::ClaudeCode),
            "claude -p --dangerously-skip-permissions do it"
        );
        assert_eq!(
            line(HarnessName::GeminiCli),
            "gemini -m gemini-2.5-pro -p do it --yolo --skip-trust"
        );
        assert_eq!(line(HarnessName::QwenCode), "qwen -p do it --yolo");
        assert_eq!(
            line(HarnessName::Opencode),
            "opencode run --auto -m anthropic/claude-sonnet-4-5 do it"
        );
        assert_eq!(
            line(HarnessName::Pi),
            "pi -p --model anthropic/claude-sonnet-4-5 do it"
        );
        assert_eq!(
            line(HarnessName::Copilot),
            "copilot -p do it --allow-all-tools --allow-all-paths --no-ask-user --no-auto-update \
             --disable-client-telemetry"
        );
        assert_eq!(
            line(HarnessName::Hermes),
            "hermes -z do it --provider alibaba -m qwen3-coder-plus --yolo"
        );
        assert_eq!(line(HarnessName::Shell), "sh -c do it");
        assert_eq!(
            setup(&HarnessName::Shell.into(), "x", &t, &["true".into()]).argv,
            vec!["true".to_owned()]
        );
    }

    #[test]
    fn transparent_env_and_files() {
        let t = Mode::Transparent;
        let c = setup(&HarnessName::ClaudeCode.into(), "x", &t, &[]);
        assert_eq!(env(&c, "IS_SANDBOX"), Some("1"));
        assert_eq!(
            env(&c, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"),
            Some("1")
        );
        assert!(env(&c, "ANTHROPIC_BASE_URL").is_none());
        let g = setup(&HarnessName::GeminiCli.into(), "x", &t, &[]);
        let settings: serde_json::Value = serde_json::from_str(&g.files[0].1).unwrap();
        assert_eq!(
            settings["security"]["auth"]["selectedType"],
            "gemini-api-key"
        );
        assert_eq!(settings["privacy"]["usageStatisticsEnabled"], false);
        let q = setup(&HarnessName::QwenCode.into(), "x", &t, &[]);
        assert!(env(&q, "OPENAI_BASE_URL").is_none());
        assert_eq!(env(&q, "POLAR_INSTRUCTION"), Some("x"));
    }

    #[test]
    fn base_url_mode_points_each_harness_at_the_agent_with_the_session_key() {
        let m = Mode::BaseUrl {
            url: "http://127.0.0.1:8787".into(),
            key: "polar-k1".into(),
        };
        let c = setup(&HarnessName::ClaudeCode.into(), "x", &m, &[]);
        assert_eq!(env(&c, "ANTHROPIC_BASE_URL"), Some("http://127.0.0.1:8787"));
        assert_eq!(env(&c, "ANTHROPIC_API_KEY"), Some("polar-k1"));
        let q = setup(&HarnessName::QwenCode.into(), "x", &m, &[]);
        assert_eq!(env(&q, "OPENAI_BASE_URL"), Some("http://127.0.0.1:8787/v1"));
        let g = setup(&HarnessName::GeminiCli.into(), "x", &m, &[]);
        assert_eq!(
            env(&g, "GOOGLE_GEMINI_BASE_URL"),
            Some("http://127.0.0.1:8787")
        );
        let x = setup(&HarnessName::Codex.into(), "x", &m, &[]);
        assert!(
            x.files[0]
                .1
                .contains("base_url = \"http://127.0.0.1:8787/v1\"")
        );
        assert!(x.files[0].1.contains("wire_api = \"responses\""));
        assert_eq!(env(&x, "POLAR_CODEX_KEY"), Some("polar-k1"));
        let o = setup(&HarnessName::Opencode.into(), "x", &m, &[]);
        let cfg: serde_json::Value = serde_json::from_str(&o.files[0].1).unwrap();
        assert_eq!(cfg["provider"]["polar"]["options"]["apiKey"], "polar-k1");
        assert!(o.argv.contains(&"polar/polar-model".to_owned()));
        let p = setup(&HarnessName::Pi.into(), "x", &m, &[]);
        let models: serde_json::Value = serde_json::from_str(&p.files[0].1).unwrap();
        assert_eq!(
            models["providers"]["polar"]["baseUrl"],
            "http://127.0.0.1:8787/v1"
        );
        let c = setup(&HarnessName::Copilot.into(), "x", &m, &[]);
        assert_eq!(
            env(&c, "COPILOT_PROVIDER_BASE_URL"),
            Some("http://127.0.0.1:8787/v1")
        );
        assert_eq!(env(&c, "COPILOT_PROVIDER_API_KEY"), Some("polar-k1"));
        let h = setup(&HarnessName::Hermes.into(), "x", &m, &[]);
        assert_eq!(
            env(&h, "DASHSCOPE_BASE_URL"),
            Some("http://127.0.0.1:8787/v1")
        );
        assert_eq!(env(&h, "DASHSCOPE_API_KEY"), Some("polar-k1"));
    }

    #[test]
    fn copilot_and_hermes_keep_their_real_endpoints_in_transparent_mode() {
        let t = Mode::Transparent;
        let c = setup(&HarnessName::Copilot.into(), "x", &t, &[]);
        assert_eq!(
            env(&c, "COPILOT_PROVIDER_BASE_URL"),
            Some("https://api.openai.com/v1")
        );
        assert_eq!(env(&c, "COPILOT_OFFLINE"), Some("true"));
        assert_eq!(env(&c, "COPILOT_MODEL"), Some(COPILOT_MODEL));
        let h = setup(&HarnessName::Hermes.into(), "x", &t, &[]);
        assert!(env(&h, "DASHSCOPE_BASE_URL").is_none());
        assert_eq!(env(&h, "HERMES_DISABLE_LAZY_INSTALLS"), Some("1"));
        assert!(env(&h, "DASHSCOPE_API_KEY").is_some());
    }
}
