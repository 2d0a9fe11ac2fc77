//! Why an evaluation could not be made as asked, and whose doing that is:
//! [`Broken`] names the cause, [`Broken::side`] decides the side, in one
//! place.
//!
//! What the sandbox left is the policy's: a results directory the
//! evaluator cannot write, a quota whose bytes or inodes are exhausted, a
//! file where a directory is expected, a workspace (or a file the task
//! named in it) the evaluator cannot read, a path that leads out of the
//! workspace. An evaluation such leftovers made impossible is scored as the
//! policy's failure: reward 0.0, the cause in the error and in the detail's
//! `broken` (a policy that expects to fail must not learn to break its
//! evaluation so that the trainer drops the sample). What is the node's:
//! the runtime could not run the command, a tool the evaluator needs is
//! missing from the sandbox, the node's own I/O failed, the evaluator hit a
//! bug. Those give no reward and an unusable sample, as any infrastructure
//! fault.
//!
//! Causes are found from an errno ([`Broken::of_errno`]) where the agent
//! did the I/O, and from the message of a failed command or of the
//! runtime's error (`(os error N)`, or the C library's text for the
//! commands the evaluator runs in the sandbox, whose locale is `C.UTF-8`:
//! [`Broken::of_message`]). No space is the policy's only when the
//! session's own quota is full ([`confirmed`]): the node's disk filling up
//! is the node's.

use nix::errno::Errno;
use serde::Serialize;

/// Whose doing a broken evaluation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// What the sandbox left: scored 0.0.
    Policy,
    /// The node's: no reward, an unusable sample.
    Node,
}

/// Why an evaluation could not be made as asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Broken {
    /// The session's disk quota has no bytes or inodes left (ENOSPC,
    /// EDQUOT).
    NoSpace,
    /// A directory the evaluator writes in (the reward file's, the
    /// workspace) refuses it (EACCES, EPERM, EROFS).
    Unwritable,
    /// A file where a directory is expected, or a directory where a file
    /// is (ENOTDIR, EISDIR; `mkdir -p` saying "File exists").
    NotADirectory,
    /// A file the evaluator reads (the workspace, a test patch file the
    /// task named in it) is missing, unreadable, not a regular file or too
    /// large.
    Unreadable,
    /// A path leads out of the workspace (a planted symlink).
    Escapes,
    /// The commit recorded before the harness ran, which the judge's diff
    /// is taken against, is no longer in the workspace's repository.
    BaseGone,
    /// The workspace holds more git repositories than the evaluation's
    /// clean-up of their configurations takes
    /// ([`crate::isolation::MAX_REPOSITORIES`]).
    TooManyRepositories,
    /// The test command's output was over what the evaluator reads
    /// ([`crate::output::MAX_STREAM_BYTES`] a stream): verdicts may be in
    /// the part left out, and the code under test writes to that output.
    TooMuchOutput,
    /// The runtime could not run the command.
    Runner,
    /// A program the evaluator runs (git, patch, sh) is missing in the
    /// sandbox.
    ToolMissing,
    /// The node's own I/O failed.
    NodeIo,
    /// The evaluator hit a bug.
    Bug,
}

impl Broken {
    /// Whose doing it is.
    pub fn side(self) -> Side {
        match self {
            Self::NoSpace
            | Self::Unwritable
            | Self::NotADirectory
            | Self::Unreadable
            | Self::Escapes
            | Self::BaseGone
            | Self::TooManyRepositories
            | Self::TooMuchOutput => Side::Policy,
            Self::Runner | Self::ToolMissing | Self::NodeIo | Self::Bug => Side::Node,
        }
    }

    /// The snake_case name (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSpace => "no_space",
            Self::Unwritable => "unwritable",
            Self::NotADirectory => "not_a_directory",
            Self::Unreadable => "unreadable",
            Self::Escapes => "escapes",
            Self::BaseGone => "base_gone",
            Self::TooManyRepositories => "too_many_repositories",
            Self::TooMuchOutput => "too_much_output",
            Self::Runner => "runner",
            Self::ToolMissing => "tool_missing",
            Self::NodeIo => "node_io",
            Self::Bug => "bug",
        }
    }

    /// What the sandbox's leftovers explain of an errno met on the
    /// session's directories; `None` for the rest (the node's).
    pub fn of_errno(errno: Errno) -> Option<Self> {
        match errno {
            Errno::ENOSPC | Errno::EDQUOT => Some(Self::NoSpace),
            Errno::EACCES | Errno::EPERM | Errno::EROFS => Some(Self::Unwritable),
            Errno::ENOTDIR | Errno::EISDIR => Some(Self::NotADirectory),
            Errno::EXDEV => Some(Self::Escapes),
            _ => None,
        }
    }

    /// What the sandbox's leftovers explain of a failed command's or the
    /// runtime's message: the clean-up's
    /// [`crate::isolation::TOO_MANY_REPOSITORIES`], else the first
    /// `(os error N)` in it, else the C library's text of those errnos;
    /// `None` when none is there.
    pub fn of_message(message: &str) -> Option<Self> {
        if message.contains(crate::isolation::TOO_MANY_REPOSITORIES) {
            return Some(Self::TooManyRepositories);
        }
        if let Some(errno) = os_error(message) {
            return Self::of_errno(errno);
        }
        const TEXTS: [(&str, Broken); 8] = [
            ("No space left on device", Broken::NoSpace),
            ("Disk quota exceeded", Broken::NoSpace),
            ("Permission denied", Broken::Unwritable),
            ("Operation not permitted", Broken::Unwritable),
            ("Read-only file system", Broken::Unwritable),
            ("Not a directory", Broken::NotADirectory),
            ("Is a directory", Broken::NotADirectory),
            // `mkdir -p` of a directory where a file is.
            ("File exists", Broken::NotADirectory),
        ];
        TEXTS
            .iter()
            .filter_map(|(text, cause)| message.find(text).map(|at| (at, *cause)))
            .min_by_key(|(at, _)| *at)
            .map(|(_, cause)| cause)
    }
}

/// `cause` as found, with [`Broken::NoSpace`] confirmed: it is the
/// policy's only when the session's disk quota is what is full
/// ([`crate::workspace::quota_full`]); a full disk without a quota is the
/// node's ([`Broken::NodeIo`]).
pub async fn confirmed(workspace: &std::path::Path, cause: Broken) -> Broken {
    if cause != Broken::NoSpace {
        return cause;
    }
    let ws = workspace.to_owned();
    match tokio::task::spawn_blocking(move || crate::workspace::quota_full(&ws)).await {
        Ok(Ok(true)) => Broken::NoSpace,
        _ => Broken::NodeIo,
    }
}

/// The errno of the first `(os error N)` in `message`.
fn os_error(message: &str) -> Option<Errno> {
    let (_, rest) = message.split_once("(os error ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().map(Errno::from_raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_are_the_policys_and_the_rest_the_nodes() {
        for (cause, side) in [
            (Broken::NoSpace, Side::Policy),
            (Broken::Unwritable, Side::Policy),
            (Broken::NotADirectory, Side::Policy),
            (Broken::Unreadable, Side::Policy),
            (Broken::Escapes, Side::Policy),
            (Broken::BaseGone, Side::Policy),
            (Broken::TooManyRepositories, Side::Policy),
            (Broken::TooMuchOutput, Side::Policy),
            (Broken::Runner, Side::Node),
            (Broken::ToolMissing, Side::Node),
            (Broken::NodeIo, Side::Node),
            (Broken::Bug, Side::Node),
        ] {
            assert_eq!(cause.side(), side, "{cause:?}");
            assert_eq!(
                serde_json::to_value(cause).unwrap(),
                serde_json::json!(cause.as_str())
            );
        }
    }

    #[test]
    fn errnos_name_their_cause() {
        assert_eq!(Broken::of_errno(Errno::ENOSPC), Some(Broken::NoSpace));
        assert_eq!(Broken::of_errno(Errno::EDQUOT), Some(Broken::NoSpace));
        assert_eq!(Broken::of_errno(Errno::EACCES), Some(Broken::Unwritable));
        assert_eq!(Broken::of_errno(Errno::EROFS), Some(Broken::Unwritable));
        assert_eq!(
            Broken::of_errno(Errno::ENOTDIR),
            Some(Broken::NotADirectory)
        );
        assert_eq!(Broken::of_errno(Errno::EXDEV), Some(Broken::Escapes));
        assert_eq!(Broken::of_errno(Errno::EIO), None);
        assert_eq!(Broken::of_errno(Errno::ENOMEM), None);
    }

    #[test]
    fn messages_name_their_cause() {
        for (message, cause) in [
            (
                "create /s/logs/eval-0.out: No space left on device (os error 28)",
                Some(Broken::NoSpace),
            ),
            (
                "create /s/logs/eval-0.out: Permission denied (os error 13)",
                Some(Broken::Unwritable),
            ),
            // The errno wins over a text further on.
            ("spawn: (os error 5): Permission denied", None),
            (
                "mkdir: cannot create directory '.polar': Not a directory",
                Some(Broken::NotADirectory),
            ),
            (
                "sh: 1: cannot create .polar/reward: Permission denied",
                Some(Broken::Unwritable),
            ),
            (
                "touch: cannot touch 'x': Disk quota exceeded",
                Some(Broken::NoSpace),
            ),
            (
                "mkdir: cannot create directory '.polar': File exists",
                Some(Broken::NotADirectory),
            ),
            (
                "rm: cannot remove 'r': Is a directory",
                Some(Broken::NotADirectory),
            ),
            // The first cause in the text is the one.
            (
                "No space left on device; then Permission denied",
                Some(Broken::NoSpace),
            ),
            ("bwrap: execvp git: No such file or directory", None),
            ("", None),
        ] {
            assert_eq!(Broken::of_message(message), cause, "{message}");
        }
    }
}
