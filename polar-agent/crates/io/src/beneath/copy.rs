//! Copies of a tree a sandbox controls ([`Dir::copy_tree`]), bounded by a
//! [`Budget`] of bytes and inodes written to the destination.
//!
//! Regular files are copied by their data extents (`SEEK_DATA` /
//! `SEEK_HOLE`), each extent with `pread`/`pwrite` at the same offset, and
//! the file is then given its length with `ftruncate`: holes stay holes on
//! the destination, so a sparse file costs the disk what it held, not its
//! length. (`copy_file_range` between two file systems of different types
//! is refused by the kernel, and `sendfile` writes holes as zeros.)
//!
//! Every entry is charged before it is written, at what it can cost on a
//! block file system such as ext4: an inode, the data blocks its extents
//! touch (4 KiB each), an extent-tree block per 340 extents past the four an
//! inode holds, twice the directory-entry bytes of a directory (rounded up
//! to blocks: hashed directories leave their blocks partly empty), a block
//! for a symlink too long to live in its inode. What does not fit is left
//! out (a file is cut at the last chunk that fits and given the length it
//! was copied to), and so are FIFOs, sockets and devices; each is recorded
//! in the budget's [`Cut`]s (the first [`MAX_CUTS`] by path) for the caller
//! to report.

use std::ffi::OsStr;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{SFlag, fstatat};
use nix::unistd::{Whence, lseek};

use super::{Dir, MAX_DEPTH, Owner, err, kind, set_mode_and_owner, single, too_deep};

/// The block size charged for (ext4's and tmpfs's page).
pub const BLOCK: u64 = 4096;
/// How much of a file is copied at a time (and the most of the budget a
/// cut file can leave unused).
const CHUNK: u64 = 256 * 1024;
/// Extents an ext4 inode holds itself; one tree block holds 340 more.
const INLINE_EXTENTS: u64 = 4;
const EXTENTS_PER_BLOCK: u64 = 340;
/// A symlink target shorter than this lives in the inode (ext4).
const INLINE_SYMLINK: usize = 60;
/// How many cuts are kept by path (the rest are only counted).
pub const MAX_CUTS: usize = 64;

fn round_up(n: u64) -> u64 {
    n.div_ceil(BLOCK).saturating_mul(BLOCK)
}

/// Why an entry was left out of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutReason {
    /// The byte budget ran out.
    Bytes,
    /// The inode budget ran out.
    Inodes,
    /// A FIFO, socket or device: never copied.
    Special,
}

impl fmt::Display for CutReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Bytes => "no bytes left",
            Self::Inodes => "no inodes left",
            Self::Special => "not a file, directory or symlink",
        })
    }
}

/// One entry left out of a copy, or copied only in part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    /// The entry, relative to where the copy started.
    pub path: PathBuf,
    /// Why.
    pub reason: CutReason,
    /// The bytes of its length that were not copied (a file's; 0 for the
    /// rest).
    pub bytes: u64,
}

/// What a copy may still write, what it wrote, and what it left out.
#[derive(Debug)]
pub struct Budget {
    bytes_left: Option<u64>,
    inodes_left: Option<u64>,
    charged_bytes: u64,
    charged_inodes: u64,
    cuts: Vec<Cut>,
    cut_entries: u64,
}

impl Budget {
    /// No bound (the destination bounds itself, as a tmpfs does).
    pub fn unlimited() -> Self {
        Self {
            bytes_left: None,
            inodes_left: None,
            charged_bytes: 0,
            charged_inodes: 0,
            cuts: Vec::new(),
            cut_entries: 0,
        }
    }

    /// At most `bytes` (charged as above) and `inodes`.
    pub fn new(bytes: u64, inodes: u64) -> Self {
        Self {
            bytes_left: Some(bytes),
            inodes_left: Some(inodes),
            ..Self::unlimited()
        }
    }

    /// Takes `bytes` and `inodes` if both fit; else nothing is taken.
    pub fn take(&mut self, bytes: u64, inodes: u64) -> Result<(), CutReason> {
        if self.inodes_left.is_some_and(|l| l < inodes) {
            return Err(CutReason::Inodes);
        }
        if self.bytes_left.is_some_and(|l| l < bytes) {
            return Err(CutReason::Bytes);
        }
        if let Some(l) = &mut self.inodes_left {
            *l -= inodes;
        }
        if let Some(l) = &mut self.bytes_left {
            *l -= bytes;
        }
        self.charged_bytes = self.charged_bytes.saturating_add(bytes);
        self.charged_inodes = self.charged_inodes.saturating_add(inodes);
        Ok(())
    }

    /// The bytes and inodes charged so far (an upper bound of what the
    /// destination's file system took).
    pub fn charged(&self) -> (u64, u64) {
        (self.charged_bytes, self.charged_inodes)
    }

    /// The first [`MAX_CUTS`] entries left out, in walk order.
    pub fn cuts(&self) -> &[Cut] {
        &self.cuts
    }

    /// How many entries were left out (or cut short) in all.
    pub fn cut_entries(&self) -> u64 {
        self.cut_entries
    }

    fn cut(&mut self, path: &Path, reason: CutReason, bytes: u64) {
        self.cut_entries += 1;
        if self.cuts.len() < MAX_CUTS {
            self.cuts.push(Cut {
                path: path.to_owned(),
                reason,
                bytes,
            });
        }
    }

    /// What a directory holding `names` is charged: an inode and twice its
    /// entries' bytes (ext4: 8 bytes and the name rounded up to 4, with `.`
    /// and `..`), rounded up to blocks.
    pub fn dir_cost(names: &[impl AsRef<OsStr>]) -> u64 {
        let entries: u64 = names
            .iter()
            .map(|n| 8 + (n.as_ref().len() as u64).div_ceil(4) * 4)
            .sum();
        round_up(2 * (24 + entries))
    }
}

impl Dir {
    /// Copies everything beneath `self` into `dest` (which exists): files
    /// (their data, holes kept, and mode bits, without set-id bits),
    /// directories and symlinks (as links); FIFOs, sockets and devices are
    /// left out. Each copy is owned by `owner`, or by its source's owner
    /// when `None`. Both sides are walked by descriptors with
    /// [`super::STRICT`], so a hostile source is read without being
    /// followed, and what `dest` held in the way is replaced (pushed on
    /// `replaced`). Returns the data bytes copied.
    pub fn copy_tree(
        &self,
        dest: &Dir,
        owner: Option<Owner>,
        at: &Path,
        replaced: &mut Vec<PathBuf>,
    ) -> io::Result<u64> {
        self.copy_tree_within(dest, owner, at, replaced, &mut Budget::unlimited())
    }

    /// [`Dir::copy_tree`] within `budget` (see the module doc).
    pub fn copy_tree_within(
        &self,
        dest: &Dir,
        owner: Option<Owner>,
        at: &Path,
        replaced: &mut Vec<PathBuf>,
        budget: &mut Budget,
    ) -> io::Result<u64> {
        if at.components().count() > MAX_DEPTH {
            return Err(too_deep("copying"));
        }
        let mut bytes = 0;
        for name in self.names()? {
            bytes += self.copy_entry_within(
                &name,
                dest,
                &name,
                owner,
                &at.join(&name),
                replaced,
                budget,
            )?;
        }
        Ok(bytes)
    }

    /// Copies the entry `name` of `self` to `dest_name` in `dest` (see
    /// [`Dir::copy_tree`]). Returns the data bytes copied.
    pub fn copy_entry(
        &self,
        name: &OsStr,
        dest: &Dir,
        dest_name: &OsStr,
        owner: Option<Owner>,
        at: &Path,
        replaced: &mut Vec<PathBuf>,
    ) -> io::Result<u64> {
        let mut budget = Budget::unlimited();
        self.copy_entry_within(name, dest, dest_name, owner, at, replaced, &mut budget)
    }

    /// [`Dir::copy_entry`] within `budget`.
    #[expect(clippy::too_many_arguments, reason = "copy_entry's and the budget")]
    pub fn copy_entry_within(
        &self,
        name: &OsStr,
        dest: &Dir,
        dest_name: &OsStr,
        owner: Option<Owner>,
        at: &Path,
        replaced: &mut Vec<PathBuf>,
        budget: &mut Budget,
    ) -> io::Result<u64> {
        let st = match fstatat(&self.fd, single(name)?, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Ok(0),
            Err(e) => return Err(err(e)),
        };
        let to = owner.unwrap_or((st.st_uid, st.st_gid));
        let mode = st.st_mode & 0o1777;
        match kind(&st) {
            SFlag::S_IFDIR => {
                let src = self.open_dir(Path::new(name))?;
                let names = src.names()?;
                if let Err(why) = budget.take(Budget::dir_cost(&names), 1) {
                    budget.cut(at, why, 0);
                    return Ok(0);
                }
                let d = dest.make_dir(single(dest_name)?, to, at, replaced)?;
                d.set_mode_and_owner(mode, to)?;
                src.copy_tree_within(&d, owner, at, replaced, budget)
            }
            SFlag::S_IFLNK => {
                let target = self.read_link(name)?;
                let len = target.as_os_str().len();
                let cost = if len < INLINE_SYMLINK { 0 } else { BLOCK };
                if let Err(why) = budget.take(cost, 1) {
                    budget.cut(at, why, 0);
                    return Ok(0);
                }
                dest.symlink(&target, dest_name, to, at, replaced)?;
                Ok(0)
            }
            SFlag::S_IFREG => {
                let Some(src) = self.open_file(name)? else {
                    return Ok(0);
                };
                if let Err(why) = budget.take(0, 1) {
                    budget.cut(at, why, st.st_size.max(0) as u64);
                    return Ok(0);
                }
                let out = dest.create_file(dest_name, mode, to, at, replaced)?;
                let n = copy_sparse(&src, &out, at, budget)?;
                set_mode_and_owner(&out, mode, to)?;
                Ok(n)
            }
            _ => {
                budget.cut(at, CutReason::Special, 0);
                Ok(0)
            }
        }
    }
}

/// The next data extent of `f` at or after `off`, below `size`:
/// `(start, end)`.
fn next_extent(f: &File, off: u64, size: u64) -> io::Result<Option<(u64, u64)>> {
    let at = |o: u64| i64::try_from(o).map_err(|_| io::Error::other("offset past i64"));
    let data = match lseek(f, at(off)?, Whence::SeekData) {
        Ok(d) => d as u64,
        Err(Errno::ENXIO) => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    if data >= size {
        return Ok(None);
    }
    let hole = lseek(f, at(data)?, Whence::SeekHole).map_err(err)? as u64;
    Ok(Some((data, hole.min(size))))
}

/// Copies the data extents of `src` into the new file `dst` at the same
/// offsets, within `budget`, and sets `dst`'s length: `src`'s, or where
/// the copy stopped when the budget ran out (recorded as a cut of `at`).
/// Returns the data bytes copied.
fn copy_sparse(src: &File, dst: &File, at: &Path, budget: &mut Budget) -> io::Result<u64> {
    let size = src.metadata()?.len();
    let mut buf = vec![0u8; CHUNK as usize];
    let (mut off, mut copied, mut charged_to, mut extents) = (0u64, 0u64, 0u64, 0u64);
    let mut stopped = None;
    'extents: while let Some((start, end)) = next_extent(src, off, size)? {
        extents += 1;
        let tree_block =
            extents > INLINE_EXTENTS && (extents - INLINE_EXTENTS) % EXTENTS_PER_BLOCK == 1;
        if tree_block && let Err(why) = budget.take(BLOCK, 0) {
            stopped = Some((start, why));
            break;
        }
        let mut pos = start;
        while pos < end {
            let n = (end - pos).min(CHUNK);
            let from = (pos / BLOCK * BLOCK).max(charged_to);
            let to = round_up(pos + n);
            if let Err(why) = budget.take(to.saturating_sub(from), 0) {
                stopped = Some((pos, why));
                break 'extents;
            }
            charged_to = charged_to.max(to);
            let chunk = &mut buf[..n as usize];
            let got = src.read_at(chunk, pos)?;
            if got == 0 {
                // Shrunk meanwhile: the length read at the start stands.
                break 'extents;
            }
            dst.write_all_at(&chunk[..got], pos)?;
            pos += got as u64;
            copied += got as u64;
        }
        off = end;
    }
    match stopped {
        Some((at_offset, why)) => {
            dst.set_len(at_offset)?;
            budget.cut(at, why, size - at_offset);
        }
        None => dst.set_len(size)?,
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::MetadataExt as _;

    fn dirs() -> (tempfile::TempDir, Dir, Dir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
        fs::create_dir(&src).unwrap();
        fs::create_dir(&dst).unwrap();
        let (s, d) = (Dir::open_root(&src).unwrap(), Dir::open_root(&dst).unwrap());
        (tmp, s, d, src)
    }

    fn copy(src: &Dir, dst: &Dir, budget: &mut Budget) -> u64 {
        src.copy_tree_within(dst, None, Path::new(""), &mut Vec::new(), budget)
            .unwrap()
    }

    /// Disk bytes a file takes.
    fn used(p: &Path) -> u64 {
        fs::metadata(p).unwrap().blocks() * 512
    }

    #[test]
    fn a_sparse_file_keeps_its_holes_and_its_length() {
        let (tmp, s, d, src) = dirs();
        let f = File::create(src.join("sparse")).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"middle", 1 << 30).unwrap();
        f.set_len(1 << 40).unwrap();
        let mut budget = Budget::new(1 << 20, 100);
        // The data extents, block by block: the two blocks written.
        let n = copy(&s, &d, &mut budget);
        assert!((10..=2 * BLOCK).contains(&n), "{n}");
        let out = tmp.path().join("dst/sparse");
        assert_eq!(fs::metadata(&out).unwrap().len(), 1 << 40);
        assert!(used(&out) <= 64 * 1024, "{} bytes on disk", used(&out));
        let o = File::open(&out).unwrap();
        let mut b = [0u8; 6];
        o.read_exact_at(&mut b, 1 << 30).unwrap();
        assert_eq!(&b, b"middle");
        assert!(budget.cuts().is_empty());
        assert_eq!(budget.charged(), (2 * BLOCK, 1));
    }

    #[test]
    fn a_file_past_the_budget_is_cut_and_recorded() {
        let (tmp, s, d, src) = dirs();
        fs::write(src.join("big"), vec![7u8; 4 << 20]).unwrap();
        fs::write(src.join("small"), b"x").unwrap();
        let mut budget = Budget::new(1 << 20, 100);
        copy(&s, &d, &mut budget);
        let big = tmp.path().join("dst/big");
        let len = fs::metadata(&big).unwrap().len();
        assert!(len <= 1 << 20 && len > 0, "{len}");
        assert!(used(&big) <= 1 << 20);
        let cut = budget
            .cuts()
            .iter()
            .find(|c| c.path == Path::new("big"))
            .unwrap();
        assert_eq!((cut.reason, cut.bytes), (CutReason::Bytes, (4 << 20) - len));
        assert!(budget.charged().0 <= 1 << 20);
    }

    #[test]
    fn entries_past_the_inode_budget_and_special_files_are_left_out() {
        let (tmp, s, d, src) = dirs();
        for i in 0..50 {
            fs::write(src.join(format!("f{i:02}")), b"").unwrap();
        }
        nix::unistd::mkfifo(
            &src.join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let mut budget = Budget::new(1 << 30, 10);
        copy(&s, &d, &mut budget);
        assert_eq!(fs::read_dir(tmp.path().join("dst")).unwrap().count(), 10);
        assert_eq!(budget.cut_entries(), 41);
        assert!(budget.cuts().iter().any(|c| c.reason == CutReason::Special));
        assert_eq!(
            budget
                .cuts()
                .iter()
                .filter(|c| c.reason == CutReason::Inodes)
                .count(),
            40
        );
        assert_eq!(budget.charged().1, 10);
    }

    #[test]
    fn directories_are_charged_before_they_are_made() {
        let (tmp, s, d, src) = dirs();
        for i in 0..20 {
            fs::create_dir(src.join(format!("d{i}"))).unwrap();
        }
        let mut budget = Budget::new(5 * BLOCK, 1000);
        copy(&s, &d, &mut budget);
        assert_eq!(fs::read_dir(tmp.path().join("dst")).unwrap().count(), 5);
        assert_eq!(budget.cut_entries(), 15);
        assert!(budget.cuts().len() <= MAX_CUTS);
    }

    #[test]
    fn costs_round_up_to_blocks() {
        let none: [&str; 0] = [];
        assert_eq!(Budget::dir_cost(&none), BLOCK);
        let many: Vec<String> = (0..1000).map(|i| format!("file-{i:04}")).collect();
        // 1000 entries of 20 bytes, twice: 40,048 bytes, 10 blocks.
        assert_eq!(Budget::dir_cost(&many), 10 * BLOCK);
        let mut b = Budget::new(10, 1);
        assert_eq!(b.take(11, 0), Err(CutReason::Bytes));
        assert_eq!(b.take(1, 2), Err(CutReason::Inodes));
        assert_eq!(b.take(10, 1), Ok(()));
        assert_eq!(b.charged(), (10, 1));
        assert!(Budget::unlimited().take(u64::MAX, u64::MAX).is_ok());
    }
}
