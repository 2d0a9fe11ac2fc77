//! Bounded disk state on a gateway node. A session leaves three trees
//! under the state directory: `sandboxes/<s>/` (workspace, HOME, tmp, the
//! commands' logs), `sessions/<s>/` (the capture log and `session.json`)
//! and `attempts/<s>/` (earlier attempts set apart, `attempts.rs`).
//!
//! - A session that did not fail (`completed` or `timeout`), was torn down
//!   cleanly and whose trajectory export returned (the exporter fsyncs the
//!   file and its directory, or the object store acknowledged the upload:
//!   everything captured is durable elsewhere) has `sandboxes/<s>/` and
//!   `sessions/<s>/` removed at the end of POSTRUN ([`Retention::settle`]),
//!   its disk quota's tmpfs unmounted first (discarded, not copied to
//!   disk). Earlier attempts set apart are not in the export: they stay
//!   under the rule below.
//! - Everything else (a failed session, an export that failed, a
//!   cancelled or superseded attempt, earlier attempts, what a crashed
//!   agent left) is kept, its tmpfs copied to disk as before, for
//!   `keep_failed` counted from the last change of its top directories
//!   (only the agent changes those: a sandbox sees the directories below
//!   them, never them), and within `max_kept_bytes` over every kept
//!   session: past it, the oldest go first. [`Retention::sweep`] applies
//!   both, every [`SWEEP_EVERY`] (less for a short `keep_failed`), at
//!   start-up and after each kept session.
//!
//! The trees were written by a hostile sandbox: they are removed and
//! measured by descriptors beneath the state directory's own directories
//! (`polar_io::beneath`: no symlink followed, no `..`), never crossing into
//! another file system (a mount left below a session's directory fails
//! the removal, which is logged, and what is on it stays). Sessions in
//! progress here are never touched: INIT claims its session
//! ([`Retention::enter`]) until POSTRUN settled it, and waits for a sweep
//! that is removing that session's leftovers. Everything that touches the
//! disk runs on blocking threads.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use nix::sys::stat::{FileStat, SFlag};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use polar_ids::SessionId;
use polar_io::beneath::{Dir, MAX_DEPTH};
use polar_sandbox::runtime::steps::SandboxDirs;

/// The longest time between two sweeps.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The state directory's trees of a session, by name.
const TREES: [&str; 3] = [
    "sandboxes",
    polar_capture::SESSIONS_DIR,
    super::attempts::ATTEMPTS_DIR,
];

/// What a node keeps of failed sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    /// How long a kept session stays.
    pub failed_for: Duration,
    /// The ceiling of every kept session's bytes together.
    pub max_bytes: u64,
}

/// The claims on sessions: in progress here, or being removed by a sweep.
#[derive(Default)]
struct Claims {
    live: HashMap<String, usize>,
    removing: HashMap<String, CancellationToken>,
}

struct Shared {
    state_dir: PathBuf,
    keep: Keep,
    claims: Mutex<Claims>,
    /// Sizes measured by earlier sweeps: (newest change, bytes).
    sizes: Mutex<HashMap<String, (i64, u64)>>,
    kicked: Notify,
}

/// The node's retention of session state. Cloning shares it.
#[derive(Clone)]
pub struct Retention {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Retention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retention")
            .field("state_dir", &self.shared.state_dir)
            .field("keep", &self.shared.keep)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A session in progress on this node: sweeps leave it alone until it is
/// dropped.
#[derive(Debug)]
pub struct Live {
    retention: Retention,
    session: String,
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut c = lock(&self.retention.shared.claims);
        if let Some(n) = c.live.get_mut(&self.session) {
            *n -= 1;
            if *n == 0 {
                c.live.remove(&self.session);
            }
        }
    }
}

/// Why a sweep removed a session's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removed {
    /// Kept longer than `keep_failed`.
    Expired,
    /// The oldest while the kept bytes were over `max_kept_bytes`.
    OverCeiling,
}

/// What a sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Sessions whose state was removed, and why.
    pub removed: Vec<(String, Removed)>,
    /// Sessions kept.
    pub kept: usize,
    /// Their bytes.
    pub kept_bytes: u64,
    /// What could not be removed or measured, as text.
    pub failed: Vec<String>,
}

/// One kept session as a sweep sees it.
struct Kept {
    session: String,
    /// Its newest top directory's change (seconds since the epoch).
    changed: i64,
    bytes: u64,
}

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// The bytes on disk beneath `dir` (blocks, not lengths), on `dev` only:
/// nothing is followed, another file system is not counted.
fn usage(dir: &Dir, dev: u64, depth: usize) -> io::Result<u64> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other(format!(
            "measuring: deeper than {MAX_DEPTH} directories"
        )));
    }
    let mut total = 0u64;
    for name in dir.names()? {
        let st = match dir.stat_at(&name) {
            Ok(st) => st,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        total = total.saturating_add(u64::try_from(st.st_blocks).unwrap_or(0) * 512);
        if kind(&st) == SFlag::S_IFDIR && st.st_dev == dev {
            match dir.open_dir(Path::new(&name)) {
                Ok(sub) => total = total.saturating_add(usage(&sub, dev, depth + 1)?),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(total)
}

/// The bytes of the entry `name` of `parent` (a directory), itself
/// included.
fn usage_of(parent: &Dir, name: &OsStr) -> io::Result<u64> {
    let dir = parent.open_dir(Path::new(name))?;
    let st = dir.stat()?;
    let own = u64::try_from(st.st_blocks).unwrap_or(0) * 512;
    Ok(own.saturating_add(usage(&dir, st.st_dev, 0)?))
}

/// Removes every tree of `session` (`trees` of [`TREES`]) under
/// `state_dir`, the sandbox directory's tmpfs unmounted first. Blocks.
fn remove_trees(state_dir: &Path, session: &str, trees: &[&str]) -> io::Result<()> {
    let mut first_error = None;
    for tree in trees {
        let parent = state_dir.join(tree);
        let root = parent.join(session);
        if *tree == TREES[0] {
            let sid: SessionId = session
                .parse()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{e}")))?;
            if let Err(e) = SandboxDirs::of(state_dir, &sid).remove() {
                first_error.get_or_insert(io::Error::other(polar_io::chain(&e)));
            }
            continue;
        }
        let dir = match Dir::open_root(&parent) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if let Err(e) = dir.remove_on_this_fs(OsStr::new(session)) {
            first_error.get_or_insert(io::Error::new(
                e.kind(),
                format!("removing {}: {e}", root.display()),
            ));
        }
    }
    first_error.map_or(Ok(()), Err)
}

impl Retention {
    /// The retention of sessions' state under `state_dir`.
    pub fn new(state_dir: &Path, keep: Keep) -> Self {
        Self {
            shared: Arc::new(Shared {
                state_dir: state_dir.to_owned(),
                keep,
                claims: Mutex::new(Claims::default()),
                sizes: Mutex::new(HashMap::new()),
                kicked: Notify::new(),
            }),
        }
    }

    /// Claims `session` for an attempt starting here (before anything of
    /// it is touched on disk); waits while a sweep removes its leftovers.
    pub async fn enter(&self, session: &SessionId) -> Live {
        loop {
            let removing = {
                let mut c = lock(&self.shared.claims);
                match c.removing.get(session.as_str()) {
                    Some(t) => t.clone(),
                    None => {
                        *c.live.entry(session.as_str().to_owned()).or_default() += 1;
                        return Live {
                            retention: self.clone(),
                            session: session.as_str().to_owned(),
                        };
                    }
                }
            };
            removing.cancelled().await;
        }
    }

    /// The end of POSTRUN: with `keep` false (the session did not fail and
    /// its export returned), its sandbox and capture directories are
    /// removed; else its disk quota ends with its files copied to disk and
    /// a sweep is due. Then the claim ends. Whether the state was removed
    /// (a removal that fails is logged and left to the sweeps).
    pub async fn settle(&self, live: Live, keep: bool) -> bool {
        let session: SessionId = match live.session.parse() {
            Ok(s) => s,
            Err(_) => return false,
        };
        let state_dir = self.shared.state_dir.clone();
        if keep {
            crate::harness::run::release_dirs(SandboxDirs::of(&state_dir, &session)).await;
            drop(live);
            self.shared.kicked.notify_one();
            return false;
        }
        let sid = session.as_str().to_owned();
        let done =
            tokio::task::spawn_blocking(move || remove_trees(&state_dir, &sid, &TREES[..2])).await;
        drop(live);
        let error = match done {
            Ok(Ok(())) => {
                tracing::debug!(session = %session, "exported: the session's directories were removed");
                return true;
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(session = %session, error = %error, "removing an exported session's directories; left to the sweeps");
        self.shared.kicked.notify_one();
        false
    }

    /// Sweeps every [`SWEEP_EVERY`] (or half of `keep_failed` when that is
    /// shorter, at least a second), after each kept session and once at
    /// once, until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let every = (self.shared.keep.failed_for / 2).clamp(Duration::from_secs(1), SWEEP_EVERY);
        loop {
            let me = self.clone();
            match tokio::task::spawn_blocking(move || me.sweep(SystemTime::now())).await {
                Ok(s) => {
                    for f in &s.failed {
                        tracing::warn!(error = %f, "sweeping kept session state");
                    }
                    if !s.removed.is_empty() {
                        tracing::info!(
                            removed = s.removed.len(),
                            kept = s.kept,
                            kept_bytes = s.kept_bytes,
                            "kept session state swept"
                        );
                    }
                }
                Err(e) => tracing::warn!(error = %e, "the sweep of kept session state failed"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
                () = self.shared.kicked.notified() => {}
            }
        }
    }

    /// The kept sessions under the state directory (not in progress here),
    /// oldest first, measured (sizes of unchanged sessions remembered).
    fn kept(&self, failed: &mut Vec<String>) -> Vec<Kept> {
        let mut changed: HashMap<String, i64> = HashMap::new();
        let mut parents = Vec::new();
        for tree in TREES {
            let path = self.shared.state_dir.join(tree);
            let dir = match Dir::open_root(&path) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    failed.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            let names = match dir.names() {
                Ok(n) => n,
                Err(e) => {
                    failed.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            for name in names {
                // Dot names are a release in progress (`.<s>.persist`).
                let Some(s) = name.to_str().filter(|s| s.parse::<SessionId>().is_ok()) else {
                    continue;
                };
                let Ok(st) = dir.stat_at(&name) else { continue };
                if kind(&st) != SFlag::S_IFDIR {
                    continue;
                }
                let c = changed.entry(s.to_owned()).or_insert(i64::MIN);
                *c = (*c).max(st.st_mtime);
            }
            parents.push(dir);
        }
        {
            let c = lock(&self.shared.claims);
            changed.retain(|s, _| !c.live.contains_key(s) && !c.removing.contains_key(s));
        }
        let mut sizes = lock(&self.shared.sizes);
        sizes.retain(|s, _| changed.contains_key(s));
        let mut out: Vec<Kept> = changed
            .into_iter()
            .map(|(session, at)| {
                let bytes = match sizes.get(&session) {
                    Some(&(c, b)) if c == at => b,
                    _ => {
                        let mut b = 0u64;
                        for p in &parents {
                            match usage_of(p, OsStr::new(&session)) {
                                Ok(n) => b = b.saturating_add(n),
                                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                                Err(e) => failed.push(format!("measuring {session}: {e}")),
                            }
                        }
                        sizes.insert(session.clone(), (at, b));
                        b
                    }
                };
                Kept {
                    session,
                    changed: at,
                    bytes,
                }
            })
            .collect();
        out.sort_by(|a, b| (a.changed, &a.session).cmp(&(b.changed, &b.session)));
        out
    }

    /// Removes what is kept past `keep_failed` at `now`, then the oldest
    /// while the rest is over `max_kept_bytes`. Blocks.
    pub fn sweep(&self, now: SystemTime) -> Swept {
        let mut swept = Swept::default();
        let kept = self.kept(&mut swept.failed);
        let now_s = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let keep_s = i64::try_from(self.shared.keep.failed_for.as_secs()).unwrap_or(i64::MAX);
        let mut total: u64 = kept.iter().map(|k| k.bytes).sum();
        for k in kept {
            let why = if now_s.saturating_sub(k.changed) >= keep_s {
                Removed::Expired
            } else if total > self.shared.keep.max_bytes {
                Removed::OverCeiling
            } else {
                swept.kept += 1;
                swept.kept_bytes += k.bytes;
                continue;
            };
            match self.remove_kept(&k.session) {
                Ok(true) => {
                    total -= k.bytes;
                    tracing::info!(session = %k.session, bytes = k.bytes, reason = ?why, "kept session state removed");
                    swept.removed.push((k.session, why));
                }
                // Started again meanwhile: it is in progress, not kept.
                Ok(false) => total -= k.bytes,
                Err(e) => {
                    swept.failed.push(e.to_string());
                    swept.kept += 1;
                    swept.kept_bytes += k.bytes;
                }
            }
        }
        swept
    }

    /// Removes a kept session's trees unless it started again; others
    /// starting it meanwhile wait. Whether it was removed.
    fn remove_kept(&self, session: &str) -> io::Result<bool> {
        let token = {
            let mut c = lock(&self.shared.claims);
            if c.live.contains_key(session) {
                return Ok(false);
            }
            let t = CancellationToken::new();
            c.removing.insert(session.to_owned(), t.clone());
            t
        };
        let r = remove_trees(&self.shared.state_dir, session, &TREES);
        lock(&self.shared.claims).removing.remove(session);
        token.cancel();
        lock(&self.shared.sizes).remove(session);
        r.map(|()| true)
    }
}

#[cfg(test)]
mod tests;
