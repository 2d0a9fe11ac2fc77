//! The presets of the Python harnesses that reach the model through
//! LiteLLM: mini-swe-agent, Aider and OpenHands (its SDK's default agent,
//! run by `openhands_run.py`, which the preset writes into HOME). Each
//! runs from a virtual environment of its own (`.polar-cache/venvs/<venv>`,
//! made by `cargo xtask harnesses` from `python/requirements/<venv>.txt`)
//! and is named an OpenAI model (`openai/polar-model`), which LiteLLM sends
//! to OpenAI Chat at `api.openai.com` through the OpenAI SDK's httpx
//! client: in transparent mode that endpoint is redirected and decrypted
//! like any hard-coded one (httpx and LiteLLM trust `SSL_CERT_FILE`, which
//! the sandbox sets to the agent's bundle); in base-URL mode
//! `OPENAI_BASE_URL` points it at the agent. LiteLLM's model cost map is read from its own package
//! (`LITELLM_LOCAL_MODEL_COST_MAP`), never fetched. Observed behaviour
//! behind each choice: `docs/HARNESSES-MORE.md`.

use std::path::PathBuf;

use super::Mode;
use super::custom::SANDBOX_KEY;
use super::presets::{OPENAI_MODEL, Setup, kv};

/// The context window Aider is told the model has (it sizes its chat
/// history summaries by it).
pub const AIDER_CONTEXT_TOKENS: u32 = 131_072;
/// The longest reply Aider is told the model writes.
pub const AIDER_OUTPUT_TOKENS: u32 = 32_768;

/// The model LiteLLM is named: OpenAI's provider, Polar's model name.
pub fn litellm_model() -> String {
    format!("openai/{OPENAI_MODEL}")
}

/// The variables LiteLLM needs in `mode`: the key (a placeholder in
/// transparent mode) and, in base-URL mode, the agent's URL.
fn litellm_env(mode: &Mode) -> Vec<(String, String)> {
    let mut env = vec![
        // The cost map ships in the package; the default fetches it from
        // raw.githubusercontent.com at import.
        kv("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
    ];
    match mode {
        Mode::Transparent => env.push(kv("OPENAI_API_KEY", SANDBOX_KEY)),
        Mode::BaseUrl { url, key } => {
            env.push(kv("OPENAI_API_KEY", key));
            env.push(kv("OPENAI_BASE_URL", &format!("{url}/v1")));
            env.push(kv("OPENAI_API_BASE", &format!("{url}/v1")));
        }
    }
    env
}

/// mini-swe-agent: `mini` with every command approved (`-y`), ending when
/// the model runs `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (no prompt
/// after it: `--exit-immediately`), no cost limit (`-l 0`: the backend's
/// model has no price). `MSWEA_CONFIGURED` skips its first-run set-up
/// wizard, `MSWEA_COST_TRACKING=ignore_errors` its refusal of a model
/// without a price.
pub fn mini_swe_agent(i: String, mode: &Mode) -> Setup {
    let mut env = vec![
        kv("MSWEA_CONFIGURED", "true"),
        kv("MSWEA_COST_TRACKING", "ignore_errors"),
    ];
    env.extend(litellm_env(mode));
    Setup {
        argv: vec![
            "mini".into(),
            "-y".into(),
            "--exit-immediately".into(),
            "-m".into(),
            litellm_model(),
            "-l".into(),
            "0".into(),
            "-t".into(),
            i,
        ],
        env,
        files: Vec::new(),
    }
}

/// Where the OpenHands runner is written, under HOME.
pub const OPENHANDS_RUNNER: &str = ".polar/openhands_run.py";

/// OpenHands: the SDK's default agent in CLI mode (terminal, file editor,
/// task tracker; no browser) run by a small runner Polar writes into HOME
/// (the SDK ships no program), on the instruction, until the agent calls
/// its `finish` tool. Every action runs without confirmation (the SDK's
/// default policy).
pub fn openhands(mode: &Mode) -> Setup {
    Setup {
        argv: vec![
            "sh".into(),
            "-c".into(),
            format!("exec python \"$HOME/{OPENHANDS_RUNNER}\" \"$POLAR_INSTRUCTION\""),
        ],
        env: litellm_env(mode),
        files: vec![(
            PathBuf::from(OPENHANDS_RUNNER),
            include_str!("openhands_run.py").to_owned(),
        )],
    }
}

/// Aider: one request (`--message`), every question answered yes
/// (`--yes-always`), no git (`--no-git`: the workspace need not be a
/// repository, and no commit-message calls), no update check, analytics
/// or release notes, its chat and input histories kept out of the
/// workspace. A task's test command reaches it in Aider's own terms: a
/// `.aider.conf.yml` in the workspace (`test-cmd`, `auto-test: true`) or
/// `AIDER_TEST_CMD` and `AIDER_AUTO_TEST` in the runtime spec's
/// environment.
pub fn aider(i: String, mode: &Mode) -> Setup {
    let env = litellm_env(mode);
    let mut argv: Vec<String> = [
        "aider",
        "--model",
        &litellm_model(),
        "--yes-always",
        "--no-git",
        "--no-check-update",
        "--no-show-release-notes",
        "--analytics-disable",
        "--no-show-model-warnings",
        "--no-pretty",
        "--no-fancy-input",
        "--no-detect-urls",
        "--chat-history-file",
        "/dev/null",
        "--input-history-file",
        "/dev/null",
        "--message",
    ]
    .map(String::from)
    .to_vec();
    argv.push(i);
    // The model's metadata: without it Aider fetches LiteLLM's model list
    // from raw.githubusercontent.com for a model it does not know, and
    // warns about its unknown context window.
    let metadata = serde_json::json!({ litellm_model(): {
        "max_input_tokens": AIDER_CONTEXT_TOKENS,
        "max_output_tokens": AIDER_OUTPUT_TOKENS,
        "input_cost_per_token": 0,
        "output_cost_per_token": 0,
        "litellm_provider": "openai",
        "mode": "chat",
    }});
    Setup {
        argv,
        env,
        files: vec![(
            PathBuf::from(".aider.model.metadata.json"),
            metadata.to_string(),
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HarnessName;
    use crate::presets::setup;

    fn env<'a>(s: &'a Setup, k: &str) -> Option<&'a str> {
        s.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn python_presets_run_unattended_against_openai_or_the_agent() {
        let t = Mode::Transparent;
        let m = setup(&HarnessName::MiniSweAgent.into(), "do it", &t, &[]);
        assert_eq!(
            m.argv.join(" "),
            "mini -y --exit-immediately -m openai/polar-model -l 0 -t do it"
        );
        assert_eq!(env(&m, "MSWEA_CONFIGURED"), Some("true"));
        assert_eq!(env(&m, "LITELLM_LOCAL_MODEL_COST_MAP"), Some("True"));
        assert_eq!(env(&m, "OPENAI_API_KEY"), Some(SANDBOX_KEY));
        assert!(env(&m, "OPENAI_BASE_URL").is_none());
        let a = setup(&HarnessName::Aider.into(), "do it", &t, &[]);
        assert_eq!(a.argv[..3], ["aider", "--model", "openai/polar-model"]);
        assert_eq!(a.argv[a.argv.len() - 2..], ["--message", "do it"]);
        for flag in ["--yes-always", "--no-git", "--no-check-update"] {
            assert!(a.argv.iter().any(|x| x == flag), "{flag}");
        }
        let meta: serde_json::Value = serde_json::from_str(&a.files[0].1).unwrap();
        assert_eq!(meta["openai/polar-model"]["litellm_provider"], "openai");
        let b = Mode::BaseUrl {
            url: "http://127.0.0.1:8787".into(),
            key: "polar-k".into(),
        };
        let o = setup(&HarnessName::Openhands.into(), "do it", &t, &[]);
        assert_eq!(o.argv[0], "sh");
        assert!(o.argv[2].contains(OPENHANDS_RUNNER), "{:?}", o.argv);
        assert!(o.files[0].1.contains("get_default_agent"));
        assert_eq!(env(&o, "POLAR_INSTRUCTION"), Some("do it"));
        for h in [
            HarnessName::MiniSweAgent,
            HarnessName::Aider,
            HarnessName::Openhands,
        ] {
            let s = setup(&h.into(), "x", &b, &[]);
            assert_eq!(env(&s, "OPENAI_BASE_URL"), Some("http://127.0.0.1:8787/v1"));
            assert_eq!(env(&s, "OPENAI_API_KEY"), Some("polar-k"));
        }
        assert_eq!(HarnessName::Aider.venv(), Some("aider"));
        assert_eq!(HarnessName::Aider.distribution(), Some("aider-chat"));
        assert_eq!(HarnessName::Pi.venv(), None);
    }
}
