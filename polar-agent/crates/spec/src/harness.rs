//! The harness presets a task can name ([`HarnessName`]) and how a harness
//! reaches the model ([`ModeKind`]).

use std::fmt;
use std::str::FromStr;

/// A harness name that is not a preset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown harness {0:?}; one of: codex, claude_code, gemini_cli, qwen_code, opencode, pi, shell"
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
    /// A custom command.
    Shell,
}

impl HarnessName {
    /// Every preset.
    pub const ALL: [Self; 7] = [
        Self::Codex,
        Self::ClaudeCode,
        Self::GeminiCli,
        Self::QwenCode,
        Self::Opencode,
        Self::Pi,
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
            Self::Shell => None,
        }
    }

    /// The mode used unless another is asked for: transparent for all.
    /// Each one keeps its hard-coded endpoint, which a built-in model route
    /// covers (Qwen Code's openai auth without a base URL goes to DashScope,
    /// itself a model route; opencode and pi are given an Anthropic model on
    /// their command line).
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
