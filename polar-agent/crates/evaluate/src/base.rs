//! The commit the judge's diff is taken against, recorded before the
//! harness runs so that the policy cannot move it, with the objects the
//! diff reads of it.
//!
//! The workspace's `HEAD` is the policy's: a change it commits no longer
//! shows in `git diff HEAD`. So the gateway runs [`RECORD_SCRIPT`] in the
//! session's sandbox after the prepare steps, before the harness (like an
//! evaluator command: on a git directory of the evaluator's own,
//! [`crate::isolation::GIT_PRELUDE`]), reads its answer
//! ([`DiffBase::of_record`]) and keeps it in its own session state, never
//! in the sandbox. Diff commands get it in [`BASE_VAR`]: a commit id, or
//! `none` when the workspace had no commit (every file is then shown as
//! added, whatever repository the policy made since); without it they diff
//! against `HEAD`.
//!
//! The workspace's object store is the policy's too, and git does not
//! check an object's contents against its name when it reads it: a loose
//! object rewritten under the base's blob id changes what the diff shows
//! as the old side. So the script also packs the base's snapshot (the
//! commit, its tree, every tree and blob in it) into [`PACK_DIR`] under
//! its tmp, before the policy has run; the node moves that pack out of the
//! sandbox's reach (root's, read-only) and shows it to every later
//! evaluation's commands read-only, naming it in [`OBJECTS_VAR`]. The
//! default diff then reads the base from that pack alone, never from the
//! workspace's store. Without the pack (a node that could not keep it) the
//! diff reads the workspace's store, and a recorded commit found gone
//! there (the repository removed, its history rewritten and the objects
//! pruned) exits with [`BASE_GONE_EXIT`]: the policy's doing, scored 0.0
//! ([`crate::Broken::BaseGone`]).

/// The variable naming the base to diff command.
pub const BASE_VAR: &str = "POLAR_DIFF_BASE";
/// The exit status of a diff command whose recorded base is gone.
pub const BASE_GONE_EXIT: i32 = 3;
/// The value of [`BASE_VAR`] for a workspace that had no commit.
pub const NO_HISTORY: &str = "none";
/// The variable naming the object directory that holds the base's pack,
/// read-only, when the node kept one.
pub const OBJECTS_VAR: &str = "POLAR_DIFF_BASE_OBJECTS";
/// The directory [`RECORD_SCRIPT`] works in, under its `TMPDIR`.
pub const RECORD_DIR: &str = "polar-base";
/// Where [`RECORD_SCRIPT`] writes the base's pack, under its `TMPDIR`:
/// an object directory's `pack/` (`pack-<hash>.pack`, `.idx` and, from
/// newer git, `.rev`).
pub const PACK_DIR: &str = "polar-base/pack";

/// The command printing the workspace's `HEAD` commit, or `none` when the
/// workspace has no repository or no commit; for a commit it also writes
/// the pack of its snapshot to `$TMPDIR/`[`PACK_DIR`] (a pack it could not
/// write is said on stderr: the commit is still recorded). The pack is
/// written to stdout and indexed in place (`index-pack`, which hashes every
/// object): pack-objects' own files start in the object directory, on
/// another mount than the sandbox's tmp.
pub const RECORD_SCRIPT: &str = concat!(
    crate::isolation::git_prelude!(),
    r#"command -v git >/dev/null 2>&1 || { echo none; exit 0; }
polar_git_setup
case $? in
  0) polar_id=$(polar_git rev-parse -q --verify 'HEAD^{commit}') || { echo none; exit 0; }
     polar_base="${TMPDIR:-/tmp}/polar-base"
     polar_p="$polar_base/pack"
     if ! { mkdir -p "$polar_p" \
            && polar_git rev-list --objects --no-walk "$polar_id" > "$polar_base/objects" \
            && polar_git pack-objects -q --stdout < "$polar_base/objects" > "$polar_p/new.pack" \
            && polar_h=$(polar_git index-pack "$polar_p/new.pack") \
            && mv "$polar_p/new.pack" "$polar_p/pack-$polar_h.pack" \
            && mv "$polar_p/new.idx" "$polar_p/pack-$polar_h.idx" \
            && { [ ! -e "$polar_p/new.rev" ] || mv "$polar_p/new.rev" "$polar_p/pack-$polar_h.rev"; }; }; then
       echo 'polar: the base snapshot could not be packed' >&2
       rm -rf "$polar_p"
     fi
     echo "$polar_id" ;;
  1) echo none ;;
  *) echo 'polar: no git directory could be made for the base' >&2; exit 2 ;;
esac"#
);

/// What the judge's diff compares the workspace with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DiffBase {
    /// Not recorded: the workspace's `HEAD` at evaluation time.
    #[default]
    Head,
    /// The workspace had no commit before the harness ran.
    NoHistory,
    /// The workspace's `HEAD` before the harness ran (hex object id).
    Commit(String),
}

impl DiffBase {
    /// The base [`RECORD_SCRIPT`] printed; `None` for anything else.
    pub fn of_record(stdout: &str) -> Option<Self> {
        let line = stdout.trim();
        if line == NO_HISTORY {
            return Some(Self::NoHistory);
        }
        let hex = line
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (hex && matches!(line.len(), 40 | 64)).then(|| Self::Commit(line.to_owned()))
    }

    /// The diff command's variables.
    pub fn env(&self) -> Vec<(String, String)> {
        let value = match self {
            Self::Head => return Vec::new(),
            Self::NoHistory => NO_HISTORY.to_owned(),
            Self::Commit(id) => id.clone(),
        };
        vec![(BASE_VAR.to_owned(), value)]
    }

    /// For the evaluation's detail.
    pub fn describe(&self) -> String {
        match self {
            Self::Head => "HEAD".to_owned(),
            Self::NoHistory => NO_HISTORY.to_owned(),
            Self::Commit(id) => id.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_as_a_commit_none_or_nothing() {
        let sha1 = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            DiffBase::of_record(&format!("{sha1}\n")),
            Some(DiffBase::Commit(sha1.into()))
        );
        let sha256 = "a".repeat(64);
        assert_eq!(
            DiffBase::of_record(&sha256),
            Some(DiffBase::Commit(sha256.clone()))
        );
        assert_eq!(DiffBase::of_record("none\n"), Some(DiffBase::NoHistory));
        for bad in [
            "",
            "HEAD",
            "0123",
            &sha1.to_uppercase(),
            "--output=x",
            &"g".repeat(40),
        ] {
            assert_eq!(DiffBase::of_record(bad), None, "{bad}");
        }
        assert!(DiffBase::Head.env().is_empty());
        assert_eq!(
            DiffBase::NoHistory.env(),
            vec![(BASE_VAR.to_owned(), "none".to_owned())]
        );
    }
}
