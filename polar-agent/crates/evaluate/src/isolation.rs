//! What keeps an evaluation out of reach of what the sandbox left: the
//! variables every evaluator command gets ([`env`]) and the way the
//! evaluators run `git` ([`GIT_PRELUDE`]).
//!
//! The runner gives each evaluation a HOME and a `/tmp` of its own, made
//! fresh (the sandbox never saw them), and an environment built from an
//! allowlist (the runtime's `PATH`, locale, trust variables, the task's
//! declared environment; nothing of the harness's), to which these are
//! added: Python without a user site (`PYTHONNOUSERSITE`) and with its
//! bytecode cache in the evaluation's own tmp (`PYTHONPYCACHEPREFIX`: a
//! `__pycache__` planted in the workspace is never read), and `git`
//! without system or global configuration, attributes, hooks, fsmonitor,
//! pager, replace objects or prompts, for every `git` an evaluator command
//! runs.
//!
//! # git
//!
//! Overrides cannot tame a repository configuration the workspace wrote:
//! `-c` and `GIT_CONFIG_*` win only for keys they name, while
//! `filter.<driver>.clean` / `smudge` / `process` and
//! `diff.<driver>.textconv` run programs under names the workspace's
//! `.gitattributes` chooses, and `include.path` brings in more. So the
//! evaluators never let git read the workspace's `.git/config` at all:
//! [`GIT_PRELUDE`] defines `polar_git_setup`, which builds a git directory
//! of the evaluator's own in its tmp (a configuration it writes, holding
//! only the repository format and its extensions, read with `git config
//! --file`, which follows no include; `HEAD`, refs, `packed-refs` and
//! `shallow` copied; an index read from `HEAD`'s tree, holding no file
//! times or sizes, so that every file's content is compared: the
//! workspace's index, whose recorded times the policy can match with a
//! file's, is never read) and points `GIT_DIR` at it, with
//! `GIT_OBJECT_DIRECTORY` at the workspace's object store (objects are data:
//! reading them runs nothing) and `GIT_WORK_TREE` at the workspace. Its
//! configuration names no driver, hook, pager, fsmonitor or helper, so
//! whatever the attributes say, nothing runs; `polar_git` then adds
//! `core.hooksPath=/dev/null`, `core.fsmonitor=false`, `--no-pager`
//! besides, and the callers pass `--no-ext-diff --no-textconv` to diffs.
//! Without a readable repository `polar_git_setup` returns 1 with a git
//! directory over an empty object store (so `git apply` still works on the
//! files, like `patch`, and never discovers the workspace's `.git`).
//!
//! The task's own commands (an evaluator's `command`, a `[[post]]` step)
//! run whatever `git` they call on the workspace's repository itself. So
//! before the first of them, the node runs [`CLEAN_GIT_SCRIPT`] in the
//! sandbox: every repository configuration the workspace holds (each
//! `.git` found below it, a directory or a `gitdir:` file, through its
//! `commondir`; `config` and `config.worktree`) that the sandbox could
//! have written is replaced by one holding only data keys ([`GIT_KEEP`]:
//! the repository format and extensions, file-system flags, user, remotes'
//! URLs and refspecs, branches' upstreams), read with `git config --file
//! --no-includes` (which runs nothing); the policy's file is kept beside
//! it as `config.polar-policy`. With no driver, program, hook path or
//! include left, the attributes name nothing that runs. A workspace that
//! is itself a bare repository (a `HEAD`, `objects/` and `refs/` at its
//! top, found by git before any `.git`) is never used implicitly:
//! [`env`] sets `safe.bareRepository=explicit`.
//!
//! # Python's path
//!
//! Python puts the working directory (or a script's directory) first on
//! `sys.path`, so a `pytest.py`, `unittest.py` or any module named like one
//! the tests import, left in the workspace, would be imported in its place.
//! Every evaluator command runs Python with `PYTHONSAFEPATH` (nothing is
//! put first) and `PYTHONPATH` at a directory of the evaluation's own,
//! written by the agent and read-only to the sandbox, holding only
//! [`SITECUSTOMIZE`]: it appends the working directory and a script's own
//! directory at the *end* of the path. The workspace's modules (the code
//! under test) still import; a name the interpreter or its installed
//! packages provide comes from them. A workspace's own `sitecustomize.py`
//! or `usercustomize.py` is never imported (ours is found first), and its
//! `.pth` files are never read (the workspace is no site directory).
//!
//! # pytest
//!
//! An evaluator given `tests` (the workspace directory the task's tests
//! were uploaded to, with `replace = true` so that it holds nothing of the
//! sandbox's) runs pytest pinned by [`pytest_addopts`]: its configuration
//! is the tests directory's own or none (`-c`), never a `pytest.ini`,
//! `tox.ini`, `setup.cfg` or `pyproject.toml` of the workspace; no
//! `conftest.py` above the tests directory is loaded (`--confcutdir`);
//! test directories go at the end of `sys.path` (`--import-mode=append`);
//! no cache is read or written; plugins load only when named
//! (`PYTEST_DISABLE_PLUGIN_AUTOLOAD`: a `*.dist-info` left in the workspace
//! cannot declare one).
//!
//! pytest's default import mode puts a test module's base directory (the
//! first directory above it without an `__init__.py`) first on `sys.path`.
//! For a tests directory that is no package that is the tests directory
//! itself (the task's: its helpers are found first, as the tests expect);
//! for one that is a package (`__init__.py`) it is the workspace, whose
//! `fractions.py` would then stand in for the one the tests import. So a
//! package is imported with `--import-mode=importlib`, which leaves
//! `sys.path` alone: the package's modules are found by their path, the
//! workspace (the code under test, and the package for absolute imports)
//! stays at the end where [`SITECUSTOMIZE`] put it.
//!
//! Tests: `tests::isolation` (a workspace whose `.git/config`, included
//! file and attributes try each way to run a program: the marker file must
//! not appear, where plain `git` makes it; modules, configurations and
//! conftests planted around tests).

use std::path::Path;

/// The file the evaluation's Python directory holds.
pub const SITECUSTOMIZE_NAME: &str = "sitecustomize.py";

/// Polar's `sitecustomize.py` for evaluations (see the module doc).
pub const SITECUSTOMIZE: &str = r#"# Polar's evaluation: the working directory and a script's own directory
# come after the interpreter's modules and the installed packages.
import os as _polar_os
import sys as _polar_sys


def _polar_append():
    extra = []
    try:
        extra.append(_polar_os.getcwd())
    except OSError:
        pass
    argv0 = _polar_sys.argv[0] if _polar_sys.argv else ""
    if argv0 not in ("", "-c", "-m") and _polar_os.path.isfile(argv0):
        extra.append(_polar_os.path.dirname(_polar_os.path.abspath(argv0)))
    for p in extra:
        if p not in _polar_sys.path:
            _polar_sys.path.append(p)


_polar_append()
del _polar_append, _polar_os, _polar_sys
"#;

/// The configuration files pytest reads, in its order; the first one a
/// tests directory holds is its configuration.
pub const PYTEST_CONFIGS: [&str; 5] = [
    "pytest.ini",
    ".pytest.ini",
    "pyproject.toml",
    "tox.ini",
    "setup.cfg",
];

/// The file that makes a tests directory a package, imported by pytest
/// with `--import-mode=importlib` (see the module doc).
pub const PACKAGE_MARKER: &str = "__init__.py";

/// `PYTEST_ADDOPTS` pinning pytest to the tests directory `tests`
/// (relative to the working directory, checked free of whitespace and
/// quotes), its configuration file `config` (one of [`PYTEST_CONFIGS`]
/// in it, or none) and, when it is a `package` ([`PACKAGE_MARKER`]), the
/// import mode that keeps the workspace off the front of `sys.path`;
/// followed by the task's own `PYTEST_ADDOPTS`.
pub fn pytest_addopts(
    tests: &Path,
    config: Option<&str>,
    package: bool,
    task: Option<&str>,
) -> String {
    let tests = tests.display();
    let config = match config {
        Some(name) => format!("{tests}/{name}"),
        None => "/dev/null".to_owned(),
    };
    let mut opts = format!("-p no:cacheprovider --rootdir=. --confcutdir={tests} -c {config}");
    if package {
        opts.push_str(" --import-mode=importlib");
    }
    if let Some(task) = task.filter(|t| !t.trim().is_empty()) {
        opts.push(' ');
        opts.push_str(task);
    }
    opts
}

/// The variables added to every evaluator command's environment, with
/// `tmp` the evaluation's own tmp directory and `python` its Python
/// directory (holding [`SITECUSTOMIZE`]) as the command sees them.
pub fn env(tmp: &str, python: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("PYTHONNOUSERSITE", "1"),
        ("PYTHONSAFEPATH", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("GIT_CONFIG_NOSYSTEM", "1"),
        ("GIT_CONFIG_GLOBAL", "/dev/null"),
        ("GIT_ATTR_NOSYSTEM", "1"),
        ("GIT_NO_REPLACE_OBJECTS", "1"),
        ("GIT_TERMINAL_PROMPT", "0"),
        ("GIT_PAGER", "cat"),
        ("PAGER", "cat"),
        ("GIT_CONFIG_COUNT", "4"),
        ("GIT_CONFIG_KEY_0", "core.hooksPath"),
        ("GIT_CONFIG_VALUE_0", "/dev/null"),
        ("GIT_CONFIG_KEY_1", "core.fsmonitor"),
        ("GIT_CONFIG_VALUE_1", "false"),
        ("GIT_CONFIG_KEY_2", "core.attributesFile"),
        ("GIT_CONFIG_VALUE_2", "/dev/null"),
        ("GIT_CONFIG_KEY_3", "safe.bareRepository"),
        ("GIT_CONFIG_VALUE_3", "explicit"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    env.push((
        "PYTHONPYCACHEPREFIX".to_owned(),
        format!("{}/.pycache", tmp.trim_end_matches('/')),
    ));
    env.push(("PYTHONPATH".to_owned(), python.to_owned()));
    env
}

/// The shell functions `polar_git_setup` and `polar_git` (see the module
/// doc), and the two they share with the other scripts: `polar_git_dirs
/// ENTRY` (the git directory and common directory a `.git` entry names:
/// `polar_src`, `polar_common`) and `polar_git_use DIR OBJECTS FORMAT REFS`
/// (a git directory of the evaluator's own made current, its configuration
/// holding the format only); a macro so that scripts can be `concat!`ed
/// with it.
macro_rules! git_prelude {
    () => {
        r#"polar_git_setup() {
  polar_git_dirs "$PWD/.git"
  polar_g=$(mktemp -d "${TMPDIR:-/tmp}/polar-git.XXXXXX") || return 2
  mkdir -p "$polar_g/refs" "$polar_g/objects" || return 2
  polar_repo=0
  if [ -n "$polar_src" ] && [ -d "$polar_common/objects" ] && [ -f "$polar_src/HEAD" ] \
     && cp "$polar_src/HEAD" "$polar_g/HEAD" 2>/dev/null; then
    [ -d "$polar_common/refs" ] && cp -R "$polar_common/refs/." "$polar_g/refs/" 2>/dev/null
    [ -d "$polar_common/reftable" ] && cp -R "$polar_common/reftable" "$polar_g/" 2>/dev/null
    for polar_f in packed-refs shallow; do
      [ -f "$polar_common/$polar_f" ] && cp "$polar_common/$polar_f" "$polar_g/" 2>/dev/null
    done
    polar_format=$(git config --file "$polar_common/config" --get extensions.objectformat 2>/dev/null)
    polar_refs=$(git config --file "$polar_common/config" --get extensions.refstorage 2>/dev/null)
    polar_objects="$polar_common/objects"
  else
    printf 'ref: refs/heads/main\n' > "$polar_g/HEAD"
    polar_format= polar_refs=
    polar_objects="$polar_g/objects"
    polar_repo=1
  fi
  polar_git_use "$polar_g" "$polar_objects" "$polar_format" "$polar_refs" || return 2
  if [ $polar_repo = 0 ]; then
    git -c core.hooksPath=/dev/null -c core.fsmonitor=false read-tree HEAD >/dev/null 2>&1
  fi
  return $polar_repo
}
polar_git_dirs() {
  polar_src=
  if [ -d "$1" ]; then polar_src=$1
  elif [ -f "$1" ]; then
    polar_src=$(sed -n '1s/^gitdir: *//p' "$1" 2>/dev/null)
    case "$polar_src" in ''|/*) ;; *) polar_src="$(dirname "$1")/$polar_src" ;; esac
  fi
  polar_common=$polar_src
  if [ -n "$polar_src" ] && [ -f "$polar_src/commondir" ]; then
    polar_c=$(head -n 1 "$polar_src/commondir")
    case "$polar_c" in /*) polar_common=$polar_c ;; *) polar_common="$polar_src/$polar_c" ;; esac
  fi
}
polar_git_use() {
  {
    printf '[core]\n\tbare = false\n'
    if [ -n "$3$4" ]; then
      printf '\trepositoryformatversion = 1\n[extensions]\n'
      [ -n "$3" ] && printf '\tobjectformat = %s\n' "$3"
      [ -n "$4" ] && printf '\trefstorage = %s\n' "$4"
    else
      printf '\trepositoryformatversion = 0\n'
    fi
  } > "$1/config" || return 2
  GIT_DIR="$1" GIT_WORK_TREE="$PWD" GIT_OBJECT_DIRECTORY="$2"
  export GIT_DIR GIT_WORK_TREE GIT_OBJECT_DIRECTORY
  unset GIT_INDEX_FILE GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_COMMON_DIR GIT_EXTERNAL_DIFF
}
polar_git() {
  git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.pager=cat --no-pager "$@"
}
"#
    };
}
pub(crate) use git_prelude;

/// The shell text defining `polar_git_setup`, `polar_git` and their helpers.
pub const GIT_PRELUDE: &str = git_prelude!();

/// The repository configuration keys [`CLEAN_GIT_SCRIPT`] keeps (an
/// extended regular expression over git's normalized key names): data
/// that names no program.
pub const GIT_KEEP: &str = concat!(
    r"^(core\.(repositoryformatversion|bare|filemode|symlinks|ignorecase|precomposeunicode",
    r"|logallrefupdates|autocrlf|eol|safecrlf|sparsecheckout|sparsecheckoutcone)",
    r"|extensions\..*|user\.(name|email)|init\.defaultbranch",
    r"|remote\..*\.(url|fetch)|branch\..*\.(remote|merge))$"
);

/// The most repositories [`CLEAN_GIT_SCRIPT`] cleans: a workspace holding
/// more is refused at once (the policy's: a task's workspace holds a few,
/// and the clean-up runs several programs for each, so thousands would
/// run it past its time and the sample would be dropped).
pub const MAX_REPOSITORIES: usize = 1000;

/// What [`CLEAN_GIT_SCRIPT`] says when the workspace holds more than
/// [`MAX_REPOSITORIES`].
pub const TOO_MANY_REPOSITORIES: &str = "polar: too many git repositories in the workspace";

/// The argv running [`CLEAN_GIT_SCRIPT`] with [`GIT_KEEP`].
pub fn clean_git_argv() -> Vec<String> {
    let max = MAX_REPOSITORIES.to_string();
    [
        "sh",
        "-c",
        CLEAN_GIT_SCRIPT,
        "polar-clean-git",
        GIT_KEEP,
        &max,
        TOO_MANY_REPOSITORIES,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The command that replaces every repository configuration of the
/// workspace (its working directory) by its [`GIT_KEEP`] keys (see the
/// module doc). Exits 0 when done (also without git), 1 naming a
/// configuration it could not replace, 4 saying [`TOO_MANY_REPOSITORIES`]
/// (its third argument) when there are more than its second
/// ([`MAX_REPOSITORIES`]), before cleaning any. Paths holding a newline
/// are not walked (no command the task runs reaches them by name).
pub const CLEAN_GIT_SCRIPT: &str = concat!(
    git_prelude!(),
    r#"command -v git >/dev/null 2>&1 || exit 0
polar_keep="$1"
polar_cfg() { (cd / && git config --file "$@"); }
polar_clean() {
  [ -e "$1" ] || [ -L "$1" ] || return 0
  polar_d=$(dirname "$1")
  # A file neither the sandbox's nor in a directory of its was not the
  # policy's to write (a system or image repository).
  [ -O "$1" ] || [ -O "$polar_d" ] || [ -w "$1" ] || [ -w "$polar_d" ] || return 0
  if [ -O "$polar_d" ]; then chmod u+rwx "$polar_d" || return 1; fi
  rm -rf "$1.polar-clean" "$1.polar-policy" && : > "$1.polar-clean" || return 1
  polar_cfg "$1" --no-includes --name-only --get-regexp "$polar_keep" 2>/dev/null | sort -u \
    | while IFS= read -r polar_k; do
        polar_cfg "$1" --no-includes --get-all "$polar_k" | while IFS= read -r polar_v; do
          polar_cfg "$1.polar-clean" --add "$polar_k" "$polar_v" || exit 1
        done || exit 1
      done || return 1
  mv -f "$1" "$1.polar-policy" && mv -f "$1.polar-clean" "$1"
}
polar_repo() {
  polar_git_dirs "$1"
  [ -n "$polar_src" ] && [ -d "$polar_src" ] || return 0
  for polar_f in "$polar_common/config" "$polar_common/config.worktree" "$polar_src/config.worktree"; do
    polar_clean "$polar_f" || { echo "polar: the repository configuration $polar_f could not be replaced" >&2; return 1; }
  done
}
polar_found() {
  find . -name .git -prune ! -path '*
*' -print 2>/dev/null
}
if [ "$(polar_found | head -n "$(($2 + 1))" | wc -l)" -gt "$2" ]; then
  echo "$3 (more than $2)" >&2
  exit 4
fi
polar_found | while IFS= read -r polar_g; do
  polar_repo "$PWD/${polar_g#./}" || exit 1
done"#
);
