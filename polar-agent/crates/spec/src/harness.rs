//! The harnesses a task can name: a preset ([`HarnessName`]) or one the
//! node's operator defined in its configuration ([`HarnessChoice::Custom`],
//! written `custom:NAME`), and how a harness reaches the model
//! ([`ModeKind`]).

use std::fmt;
use std::str::FromStr;

/// A harness name that is not a preset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown harness {0:?}; one of: codex, claude_code, gemini_cli, qwen_code, opencode, pi, \
     mini_swe_agent, aider, openhands, copilot, hermes, shell, or custom:NAME for a harness the \
     node's configuration defines"
)]
pub struct UnknownHarness(pub String);

/// A preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HarnessName {
    /// Codex CLI (`@openai/codex`).
    Codex,
    /// Claude Code (`@anthropic-ai/claude-code`).
    ClaudeCode,
    /// Gemini CLI (`@google/gemini-cli`).
    GeminiCli,
    /// Qwen Code (`@qwen-code/qwen-code`).
    QwenCode,
    /// opencode (`opencode-ai`).
    Opencode,
    /// pi (`@mariozechner/pi-coding-agent`).
    Pi,
    /// mini-swe-agent (PyPI `mini-swe-agent`).
    MiniSweAgent,
    /// Aider (PyPI `aider-chat`).
    Aider,
    /// OpenHands' default agent (PyPI `openhands-sdk`, `openhands-tools`).
    Openhands,
    /// GitHub Copilot CLI (`@github/copilot`).
    Copilot,
    /// Hermes Agent (PyPI `hermes-agent`, in a virtual environment of its
    /// own).
    Hermes,
    /// A custom command.
    Shell,
}

impl HarnessName {
    /// Every preset.
    pub const ALL: [Self; 12] = [
        Self::Codex,
        Self::ClaudeCode,
        Self::GeminiCli,
        Self::QwenCode,
        Self::Opencode,
        Self::Pi,
        Self::MiniSweAgent,
        Self::Aider,
        Self::Openhands,
        Self::Copilot,
        Self::Hermes,
        Self::Shell,
    ];

    /// The preset's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Codex => "codex",
            Self::ClaudeCode => "claude_code",
            Self::GeminiCli => "gemini_cli",
            Self::QwenCode => "qwen_code",
            Self::Opencode => "opencode",
            Self::Pi => "pi",
            Self::MiniSweAgent => "mini_swe_agent",
            Self::Aider => "aider",
            Self::Openhands => "openhands",
            Self::Copilot => "copilot",
            Self::Hermes => "hermes",
            Self::Shell => "shell",
        }
    }

    /// The binary it runs (`None` for the shell preset).
    pub fn binary(self) -> Option<&'static str> {
        match self {
            Self::Codex => Some("codex"),
            Self::ClaudeCode => Some("claude"),
            Self::GeminiCli => Some("gemini"),
            Self::QwenCode => Some("qwen"),
            Self::Opencode => Some("opencode"),
            Self::Pi => Some("pi"),
            Self::MiniSweAgent => Some("mini"),
            Self::Aider => Some("aider"),
            // The SDK has no program: its environment's interpreter runs
            // the preset's runner.
            Self::Openhands => Some("python"),
            Self::Copilot => Some("copilot"),
            Self::Hermes => Some("hermes"),
            Self::Shell => None,
        }
    }

    /// The virtual environment a Python harness is installed in
    /// (`.polar-cache/venvs/NAME`, made by `cargo xtask harnesses`); `None`
    /// for the npm-installed ones and the shell preset.
    pub fn venv(self) -> Option<&'static str> {
        match self {
            Self::MiniSweAgent => Some("mini-swe-agent"),
            Self::Aider => Some("aider"),
            Self::Openhands => Some("openhands"),
            Self::Hermes => Some("hermes"),
            _ => None,
        }
    }

    /// The Python distribution of a Python harness, whose version (read
    /// from its environment's metadata) the install check reports: the
    /// programs' own `--version` starts them (mini-swe-agent has none,
    /// Hermes asks PyPI for updates and writes into HOME).
    pub fn distribution(self) -> Option<&'static str> {
        match self {
            Self::MiniSweAgent => Some("mini-swe-agent"),
            Self::Aider => Some("aider-chat"),
            Self::Openhands => Some("openhands-sdk"),
            Self::Hermes => Some("hermes-agent"),
            _ => None,
        }
    }

    /// The mode used unless another is asked for: transparent for all.
    /// Each one keeps its hard-coded endpoint, which a built-in model route
    /// covers (Qwen Code's openai auth without a base URL goes to DashScope,
    /// itself a model route; opencode and pi are given an Anthropic model on
    /// their command line; mini-swe-agent, Aider and OpenHands are given an
    /// OpenAI model, which LiteLLM sends to `api.openai.com`; Copilot CLI is
    /// given api.openai.com as its bring-your-own-model provider, Hermes
    /// Agent DashScope as its provider).
    pub fn default_mode(self) -> ModeKind {
        ModeKind::Transparent
    }
}

impl fmt::Display for HarnessName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HarnessName {
    type Err = UnknownHarness;

    fn from_str(s: &str) -> Result<Self, UnknownHarness> {
        let norm = s.replace('-', "_");
        Self::ALL
            .into_iter()
            .find(|h| h.as_str() == norm || (norm == "claude" && *h == Self::ClaudeCode))
            .ok_or_else(|| UnknownHarness(s.to_owned()))
    }
}

/// Which mode, without its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeKind {
    /// The harness keeps its hard-coded endpoint.
    Transparent,
    /// The harness is given the agent's base URL and a per-session key.
    BaseUrl,
}

/// How a task names a harness defined in a node's configuration.
pub const CUSTOM_PREFIX: &str = "custom:";

/// A harness name a task wrote that is neither a preset nor a well-formed
/// `custom:NAME`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadHarness {
    /// Not a preset.
    #[error(transparent)]
    Unknown(#[from] UnknownHarness),
    /// `custom:` followed by a name that no configuration may define.
    #[error(
        "{0:?} is not a custom harness name: `custom:` then 1 to 64 of a-z, 0-9, `_`, `-`, \
         starting with a letter"
    )]
    BadCustom(String),
}

/// The harness a task picked: a preset, or a harness the node's
/// configuration defines (`[harness.NAME]`), named `custom:NAME`. Which
/// custom names exist is known on the node only; the rollout server checks
/// the form.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HarnessChoice {
    /// A preset.
    Preset(HarnessName),
    /// A harness of the node's configuration, by its name there.
    Custom(String),
}

/// Whether `name` may name a configured harness: 1 to 64 of `a-z`, `0-9`,
/// `_`, `-`, starting with a letter.
pub fn is_custom_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

impl HarnessChoice {
    /// The shell preset, which takes a command of the task's own.
    pub fn is_shell(&self) -> bool {
        *self == Self::Preset(HarnessName::Shell)
    }
}

impl fmt::Display for HarnessChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Preset(h) => h.fmt(f),
            Self::Custom(n) => write!(f, "{CUSTOM_PREFIX}{n}"),
        }
    }
}

impl FromStr for HarnessChoice {
    type Err = BadHarness;

    fn from_str(s: &str) -> Result<Self, BadHarness> {
        match s.strip_prefix(CUSTOM_PREFIX) {
            Some(name) if is_custom_name(name) => Ok(Self::Custom(name.to_owned())),
            Some(_) => Err(BadHarness::BadCustom(s.to_owned())),
            None => Ok(Self::Preset(s.parse()?)),
        }
    }
}

impl From<HarnessName> for HarnessChoice {
    fn from(h: HarnessName) -> Self {
        Self::Preset(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_choice_is_a_preset_or_a_well_formed_custom_name() {
        assert_eq!(
            "claude".parse::<HarnessChoice>().unwrap(),
            HarnessChoice::Preset(HarnessName::ClaudeCode)
        );
        let c: HarnessChoice = "custom:my-agent_2".parse().unwrap();
        assert_eq!(c, HarnessChoice::Custom("my-agent_2".into()));
        assert_eq!(c.to_string(), "custom:my-agent_2");
        for bad in [
            "custom:",
            "custom:My",
            "custom:a b",
            "custom:../x",
            "custom:9x",
        ] {
            assert!(
                matches!(bad.parse::<HarnessChoice>(), Err(BadHarness::BadCustom(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            "cursor".parse::<HarnessChoice>(),
            Err(BadHarness::Unknown(_))
        ));
        assert!(!is_custom_name(&"a".repeat(65)));
        assert!(HarnessChoice::Preset(HarnessName::Shell).is_shell());
    }
}
