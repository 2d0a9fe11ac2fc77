//! Files beneath a directory that a sandbox controls, reached from the
//! host (as root) without ever following a path the sandbox planted.
//!
//! A [`Dir`] is a directory descriptor opened with `O_DIRECTORY |
//! O_NOFOLLOW`; every name below it is resolved by the kernel with
//! `openat2` and [`STRICT`] (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS`): a symlink anywhere on the way, or a `..`
//! leading out, fails atomically instead of being followed. Writers never
//! reuse an inode they find: a symlink or any other non-directory where a
//! directory is wanted is removed (`unlinkat`, which never follows) and a
//! fresh directory made; a file is always unlinked first and created with
//! `O_CREAT | O_EXCL`, so a hard link, FIFO or device the sandbox prepared
//! is never written through. Ownership is set with `fchown` on the new
//! descriptor or `fchownat(AT_SYMLINK_NOFOLLOW)` relative to a parent's
//! descriptor, never on a path string. What was replaced is reported to the
//! caller (who logs it with the session).
//!
//! Copies of such a tree ([`Dir::copy_tree`], in `copy.rs`) read it the
//! same way, keep sparse files sparse and stay within a [`Budget`] of bytes
//! and inodes written.
//!
//! Readers that may follow symlinks staying inside (the evaluator) use
//! [`open_how`] with their own resolve flags over the same [`Dir`].
//!
//! Everything here blocks: callers on an async runtime run it with
//! `tokio::task::spawn_blocking`.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, open, openat2, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, fchownat, linkat, symlinkat, unlinkat};

/// The resolve flags of every write: beneath the directory, no symlink
/// at all, no magic link.
pub const STRICT: ResolveFlag = ResolveFlag::RESOLVE_BENEATH
    .union(ResolveFlag::RESOLVE_NO_SYMLINKS)
    .union(ResolveFlag::RESOLVE_NO_MAGICLINKS);

/// An owner: (uid, gid).
pub type Owner = (u32, u32);

/// How many times a name the sandbox keeps replacing is retried.
const RETRIES: usize = 8;

/// How deep the tree walks go (removal, ownership, copies): a deeper tree
/// is an error, not a stack overflow.
pub const MAX_DEPTH: usize = 512;

fn too_deep(what: &str) -> io::Error {
    io::Error::other(format!("{what}: deeper than {MAX_DEPTH} directories"))
}

/// The `OpenHow` for `flags` (plus `O_CLOEXEC | O_NOCTTY`), `mode` and
/// `resolve`.
pub fn open_how(flags: OFlag, mode: Mode, resolve: ResolveFlag) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY)
        .mode(mode)
        .resolve(resolve)
}

fn err(e: Errno) -> io::Error {
    io::Error::from(e)
}

/// A symlink (`ELOOP` under [`STRICT`]) or a non-directory (`ENOTDIR`)
/// where a directory was wanted.
fn not_a_dir(e: &io::Error) -> bool {
    matches!(
        Errno::from_raw(e.raw_os_error().unwrap_or(0)),
        Errno::ELOOP | Errno::ENOTDIR
    )
}

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// A directory descriptor: the root of what is reached beneath it.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// One name, checked: a single normal component.
fn single(name: &OsStr) -> io::Result<&OsStr> {
    let mut c = Path::new(name).components();
    match (c.next(), c.next()) {
        (Some(Component::Normal(n)), None) => Ok(n),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a single file name", Path::new(name).display()),
        )),
    }
}

/// The normal components of `rel`; `..` or an absolute path is refused.
fn components(rel: &Path) -> io::Result<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: must be relative, without `..`", rel.display()),
                ));
            }
        }
    }
    Ok(out)
}

impl Dir {
    /// Opens `path` itself as a directory (`O_DIRECTORY | O_NOFOLLOW`: a
    /// symlink at `path` is refused). Its parents are the caller's: they
    /// must be directories the sandbox cannot change.
    pub fn open_root(path: &Path) -> io::Result<Self> {
        let fd = open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        Ok(Self { fd })
    }

    /// Opens the existing directory `rel` beneath this one ([`STRICT`]).
    pub fn open_dir(&self, rel: &Path) -> io::Result<Self> {
        let how = open_how(
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
            Mode::empty(),
            STRICT,
        );
        let fd = openat2(&self.fd, rel, how).map_err(err)?;
        Ok(Self { fd })
    }

    /// Opens `rel` beneath this one with `how` (the caller's flags).
    pub fn open_with(&self, rel: &Path, how: OpenHow) -> Result<OwnedFd, Errno> {
        openat2(&self.fd, rel, how)
    }

    /// The directory's own metadata.
    pub fn stat(&self) -> io::Result<FileStat> {
        fstat(&self.fd).map_err(err)
    }

    /// The metadata of the entry `name` (never followed).
    pub fn stat_at(&self, name: &OsStr) -> io::Result<FileStat> {
        fstatat(&self.fd, single(name)?, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(err)
    }

    /// Sets the directory's own owner.
    pub fn chown(&self, (uid, gid): Owner) -> io::Result<()> {
        fchown(&self.fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(err)
    }

    /// Sets the directory's own mode, then its owner, whoever owns it now:
    /// taken back first, so the mode is set as its owner (the agent's unit
    /// has `CAP_CHOWN`, not `CAP_FOWNER`), then handed over.
    pub fn set_mode_and_owner(&self, mode: u32, owner: Owner) -> io::Result<()> {
        set_mode_and_owner(&self.fd, mode, owner)
    }

    /// The names in the directory (without `.` and `..`).
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        let again = self.open_dir(Path::new("."))?;
        let mut d = nix::dir::Dir::from_fd(again.fd).map_err(err)?;
        let mut out = Vec::new();
        for e in d.iter() {
            let e = e.map_err(err)?;
            let name = OsStr::from_bytes(e.file_name().to_bytes());
            if name != "." && name != ".." {
                out.push(name.to_owned());
            }
        }
        Ok(out)
    }

    /// Removes the entry `name`, whatever it is (a directory with
    /// everything in it, walked by descriptors). A missing entry is fine.
    /// Whether something was there.
    pub fn remove(&self, name: &OsStr) -> io::Result<bool> {
        self.remove_at(name, 0, STRICT)
    }

    /// [`Dir::remove`] that never leaves this directory's file system: a
    /// mount point anywhere in the tree (`RESOLVE_NO_XDEV` fails with
    /// `EXDEV`) is an error and what is on the other file system stays
    /// untouched (what was removed before it is gone).
    pub fn remove_on_this_fs(&self, name: &OsStr) -> io::Result<bool> {
        self.remove_at(name, 0, STRICT.union(ResolveFlag::RESOLVE_NO_XDEV))
    }

    fn remove_at(&self, name: &OsStr, depth: usize, resolve: ResolveFlag) -> io::Result<bool> {
        let name = single(name)?;
        if depth > MAX_DEPTH {
            return Err(too_deep("removing"));
        }
        let how = || {
            open_how(
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
                Mode::empty(),
                resolve,
            )
        };
        for _ in 0..RETRIES {
            match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) => return Ok(true),
                Err(Errno::ENOENT) => return Ok(false),
                Err(Errno::EISDIR) => {}
                Err(e) => return Err(err(e)),
            }
            match openat2(&self.fd, Path::new(name), how()).map_err(err) {
                Ok(fd) => {
                    let sub = Self { fd };
                    for n in sub.names()? {
                        sub.remove_at(&n, depth + 1, resolve)?;
                    }
                }
                // Replaced by a non-directory meanwhile: unlink again.
                Err(e) if not_a_dir(&e) => {
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(e),
            }
            match unlinkat(&self.fd, name, UnlinkatFlags::RemoveDir) {
                Ok(()) => return Ok(true),
                Err(Errno::ENOENT) => return Ok(false),
                // Refilled or replaced meanwhile: go again.
                Err(Errno::ENOTEMPTY | Errno::ENOTDIR) => {}
                Err(e) => return Err(err(e)),
            }
        }
        Err(io::Error::other(format!(
            "{}: kept changing while being removed",
            Path::new(name).display()
        )))
    }

    /// The directory `rel` beneath this one, made where missing (mode
    /// 0755, owned by `owner`). A symlink or other non-directory on the
    /// way is removed and replaced by a fresh directory; each replaced
    /// entry is pushed on `replaced` (relative to this directory).
    pub fn make_dirs(
        &self,
        rel: &Path,
        owner: Owner,
        replaced: &mut Vec<PathBuf>,
    ) -> io::Result<Self> {
        let mut cur = self.open_dir(Path::new("."))?;
        let mut at = PathBuf::new();
        for name in components(rel)? {
            at.push(name);
            cur = cur.make_dir(name, owner, &at, replaced)?;
        }
        Ok(cur)
    }

    fn make_dir(
        &self,
        name: &OsStr,
        owner: Owner,
        at: &Path,
        replaced: &mut Vec<PathBuf>,
    ) -> io::Result<Self> {
        for _ in 0..RETRIES {
            match self.open_dir(Path::new(name)) {
                Ok(d) => return Ok(d),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let made = match mkdirat(&self.fd, name, Mode::from_bits_truncate(0o755)) {
                        Ok(()) => true,
                        Err(Errno::EEXIST) => false,
                        Err(e) => return Err(err(e)),
                    };
                    if let Ok(d) = self.open_dir(Path::new(name)) {
                        if made {
                            d.chown(owner)?;
                        }
                        return Ok(d);
                    }
                }
                // A symlink (ELOOP) or a file (ENOTDIR) where a directory
                // is wanted.
                Err(e) if not_a_dir(&e) => {
                    self.remove(name)?;
                    replaced.push(at.to_owned());
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other(format!(
            "{}: kept changing while being made",
            at.display()
        )))
    }

    /// Clears `name` for a new entry: whatever is there is removed. Pushes
    /// `at` on `replaced` when what was there is not a plain file of ours
    /// (a symlink, a directory, a FIFO, a device, a hard-linked file).
    fn clear(&self, name: &OsStr, at: &Path, replaced: &mut Vec<PathBuf>) -> io::Result<()> {
        let planted = match fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => kind(&st) != SFlag::S_IFREG || st.st_nlink > 1,
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(err(e)),
        };
        self.remove(name)?;
        if planted {
            replaced.push(at.to_owned());
        }
        Ok(())
    }

    /// Creates the file `name` fresh (whatever was there removed first,
    /// then `O_CREAT | O_EXCL`), with `mode`, owned by `owner`; returns it
    /// open for writing. `at` names it in `replaced`.
    pub fn create_file(
        &self,
        name: &OsStr,
        mode: u32,
        owner: Owner,
        at: &Path,
        replaced: &mut Vec<PathBuf>,
    ) -> io::Result<File> {
        let name = single(name)?;
        let how = open_how(
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW,
            Mode::from_bits_truncate(mode & 0o777),
            STRICT,
        );
        for _ in 0..RETRIES {
            self.clear(name, at, replaced)?;
            match openat2(&self.fd, Path::new(name), how) {
                Ok(fd) => {
                    let (uid, gid) = owner;
                    fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(err)?;
                    return Ok(File::from(fd));
                }
                // Planted again between the unlink and the create.
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(err(e)),
            }
        }
        Err(io::Error::other(format!(
            "{}: kept changing while being created",
            at.display()
        )))
    }

    /// Makes the symlink `name -> target` fresh, owned by `owner`.
    pub fn symlink(
        &self,
        target: &Path,
        name: &OsStr,
        owner: Owner,
        at: &Path,
        replaced: &mut Vec<PathBuf>,
    ) -> io::Result<()> {
        let name = single(name)?;
        for _ in 0..RETRIES {
            self.clear(name, at, replaced)?;
            match symlinkat(target, &self.fd, name) {
                Ok(()) => {
                    let (uid, gid) = owner;
                    return fchownat(
                        &self.fd,
                        name,
                        Some(Uid::from_raw(uid)),
                        Some(Gid::from_raw(gid)),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .map_err(err);
                }
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(err(e)),
            }
        }
        Err(io::Error::other(format!(
            "{}: kept changing while being linked",
            at.display()
        )))
    }

    /// Links the regular file `name` of this directory into `to` as
    /// `to_name` (a hard link: the same inode, its owner and mode; both
    /// directories on one file system). `linkat` without
    /// `AT_SYMLINK_FOLLOW` links a symlink itself, so `name` is checked to
    /// be a regular file first and the link made only then; whatever was
    /// at `to_name` is removed first (pushed on `replaced` as `at` when it
    /// was not a plain file).
    pub fn link_into(
        &self,
        name: &OsStr,
        to: &Dir,
        to_name: &OsStr,
        at: &Path,
        replaced: &mut Vec<PathBuf>,
    ) -> io::Result<()> {
        let (name, to_name) = (single(name)?, single(to_name)?);
        let st = fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(err)?;
        if kind(&st) != SFlag::S_IFREG {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file", Path::new(name).display()),
            ));
        }
        for _ in 0..RETRIES {
            to.clear(to_name, at, replaced)?;
            match linkat(&self.fd, name, &to.fd, to_name, AtFlags::empty()) {
                Ok(()) => return Ok(()),
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(err(e)),
            }
        }
        Err(io::Error::other(format!(
            "{}: kept changing while being linked",
            at.display()
        )))
    }

    /// Opens the regular file `name` for reading ([`STRICT`], non-blocking
    /// so that a FIFO does not wait); `None` when it is not a regular file.
    pub fn open_file(&self, name: &OsStr) -> io::Result<Option<File>> {
        let how = open_how(
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
            Mode::empty(),
            STRICT,
        );
        let fd = match openat2(&self.fd, Path::new(single(name)?), how) {
            Ok(fd) => fd,
            Err(Errno::ELOOP | Errno::ENXIO) => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        let st = fstat(&fd).map_err(err)?;
        if kind(&st) != SFlag::S_IFREG {
            return Ok(None);
        }
        Ok(Some(File::from(fd)))
    }

    /// Where the symlink `name` points.
    pub fn read_link(&self, name: &OsStr) -> io::Result<PathBuf> {
        readlinkat(&self.fd, single(name)?)
            .map(PathBuf::from)
            .map_err(err)
    }

    /// Sets the owner of everything beneath this directory, and of itself,
    /// to `owner`, walking by descriptors: a symlink is changed itself,
    /// never followed; a directory renamed meanwhile is either reached
    /// through its descriptor or not at all. Entries already owned so are
    /// left alone, and so are non-directories with more than one link (a
    /// hard link to a file that is not the sandbox's is never handed to
    /// it). Returns the hard-linked entries skipped (relative paths).
    pub fn chown_tree(&self, owner: Owner) -> io::Result<Vec<PathBuf>> {
        let mut skipped = Vec::new();
        let st = self.stat()?;
        if (st.st_uid, st.st_gid) != owner {
            self.chown(owner)?;
        }
        self.chown_below(owner, Path::new(""), &mut skipped)?;
        Ok(skipped)
    }

    fn chown_below(&self, owner: Owner, at: &Path, skipped: &mut Vec<PathBuf>) -> io::Result<()> {
        let (uid, gid) = owner;
        if at.components().count() > MAX_DEPTH {
            return Err(too_deep("changing owners"));
        }
        for name in self.names()? {
            let here = at.join(&name);
            let st = match fstatat(&self.fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(err(e)),
            };
            if kind(&st) == SFlag::S_IFDIR {
                match self.open_dir(Path::new(&name)) {
                    Ok(sub) => {
                        let st = sub.stat()?;
                        if (st.st_uid, st.st_gid) != owner {
                            sub.chown(owner)?;
                        }
                        sub.chown_below(owner, &here, skipped)?;
                    }
                    // Gone or replaced meanwhile: not ours to follow.
                    Err(e) if e.kind() == io::ErrorKind::NotFound || not_a_dir(&e) => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            if (st.st_uid, st.st_gid) == owner {
                continue;
            }
            if st.st_nlink > 1 {
                skipped.push(here);
                continue;
            }
            match fchownat(
                &self.fd,
                name.as_os_str(),
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(err(e)),
            }
        }
        Ok(())
    }
}

/// Sets mode bits on an open descriptor (the umask does not apply).
fn fchmod(fd: &impl AsFd, mode: u32) -> io::Result<()> {
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode)).map_err(err)
}

/// Sets `mode` and then `owner` on an open descriptor that may belong to
/// someone else already: taken back first, so the mode is set as its owner
/// (a process with `CAP_CHOWN` but not `CAP_FOWNER`, such as the agent
/// under its systemd unit, may not change the mode of a file it does not
/// own), then handed over.
fn set_mode_and_owner(fd: &impl AsFd, mode: u32, (uid, gid): Owner) -> io::Result<()> {
    fchown(
        fd,
        Some(nix::unistd::geteuid()),
        Some(nix::unistd::getegid()),
    )
    .map_err(err)?;
    fchmod(fd, mode)?;
    fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(err)
}

mod copy;
pub use copy::{BLOCK, Budget, Cut, CutReason, MAX_CUTS};

#[cfg(test)]
mod tests;
