//! The frames of the capture journal (`journal`): one per line
//! written to a session's log, saying which file, where, and what bytes.
//!
//! Layout (integers little-endian):
//!
//! ```text
//! magic    4 bytes  "PCJ1"
//! len      u32      length of the body
//! crc      u32      CRC-32 (IEEE) of the body
//! body     file key: inode u64, birth time u64 (ns since the epoch, 0 if
//!          the file system keeps none); offset u64 (where the line starts
//!          in the log); session id length u8, session id; the line's bytes
//! ```
//!
//! The journal is the agent's own file, but a line's bytes come from what
//! a sandbox sent, and a power loss or a crash tears or garbles the
//! journal's tail: the reader ([`FrameReader`]) treats every byte as
//! hostile. It never panics and never allocates more than the input
//! holds (a length is read through `Read::take`); it stops at the first
//! frame that is cut short, has a wrong magic, a length over
//! [`MAX_FRAME`], a wrong checksum or a malformed body, and says where
//! ([`FrameEnd`]). Zeros from where a header would start to the input's
//! end are not a frame: they are the space the journal wrote ahead of its
//! frames, and end them cleanly (bytes after such zeros are a torn tail:
//! a later page of the last round's written before a power loss, an
//! earlier one not).
//! Nothing after a bad frame is trusted: a journal is written in order,
//! so what follows a torn frame was never durable.

use std::io::{self, Read};

use polar_ids::SessionId;

/// A frame's first bytes.
pub const MAGIC: [u8; 4] = *b"PCJ1";
/// The longest body a frame may have (a line of 1 GiB is not a record).
pub const MAX_FRAME: u32 = 1 << 30;
/// Bytes before the body.
pub const HEADER: usize = 12;
/// Bytes of the body before the session id.
const FIXED: usize = 8 + 8 + 8 + 1;

/// Which file a frame's line was written to: the log's inode and birth
/// time, so that a log replaced at the same path (a session's earlier
/// attempt moved away) is not mistaken for the one the frame wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileKey {
    /// `st_ino`.
    pub ino: u64,
    /// Birth time in nanoseconds since the epoch; 0 where unknown.
    pub birth: u64,
}

impl FileKey {
    /// The key of an open file. Blocking.
    pub fn of(file: &std::fs::File) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = file.metadata()?;
        let birth = meta
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Ok(Self {
            ino: meta.ino(),
            birth,
        })
    }
}

/// One frame: `line` was written at byte `offset` of `session`'s log,
/// the file `key`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The session whose log it is.
    pub session: SessionId,
    /// The log file.
    pub key: FileKey,
    /// Where the line starts in the log.
    pub offset: u64,
    /// The bytes written (a line, with its newline).
    pub line: Vec<u8>,
}

/// The frame of `line` written at `offset` of `session`'s log `key`,
/// without the line itself: the header and the body's fields before the
/// line, its checksum computed over the line too. The journal writes it
/// and then the line, so a long line is not copied into a frame.
pub fn encode_prefix(session: &SessionId, key: FileKey, offset: u64, line: &[u8]) -> Vec<u8> {
    let id = session.as_str().as_bytes();
    let body_len = FIXED + id.len() + line.len();
    let mut out = Vec::with_capacity(HEADER + FIXED + id.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&u32::try_from(body_len).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&key.ino.to_le_bytes());
    out.extend_from_slice(&key.birth.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    // A session id is 1 to 64 bytes (`SessionId`).
    out.push(u8::try_from(id.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(id);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[HEADER..]);
    crc.update(line);
    out[8..12].copy_from_slice(&crc.finalize().to_le_bytes());
    out
}

/// The whole frame: [`encode_prefix`] and the line.
pub fn encode(session: &SessionId, key: FileKey, offset: u64, line: &[u8]) -> Vec<u8> {
    let mut out = encode_prefix(session, key, offset, line);
    out.extend_from_slice(line);
    out
}

/// Where and why reading frames stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameEnd {
    /// The input ended between frames, or only zeros follow the last one
    /// (the space a segment was filled ahead with, `journal`).
    Clean,
    /// The frame at `offset` is cut short, or not a frame (`why`):
    /// everything from it on is ignored.
    Bad {
        /// Its byte offset.
        offset: u64,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// Reads frames from a journal, one at a time (see the module doc).
#[derive(Debug)]
pub struct FrameReader<R> {
    input: R,
    offset: u64,
    end: Option<FrameEnd>,
}

impl<R: Read> FrameReader<R> {
    /// A reader of `input`, from its start.
    pub fn new(input: R) -> Self {
        Self {
            input,
            offset: 0,
            end: None,
        }
    }

    /// Why reading stopped, once [`Iterator::next`] returned `None`.
    pub fn end(&self) -> Option<&FrameEnd> {
        self.end.as_ref()
    }

    /// The byte offset after the last good frame.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn read_frame(&mut self) -> io::Result<Result<Option<Frame>, &'static str>> {
        let mut header = [0u8; HEADER];
        let got = read_full(&mut self.input, &mut header)?;
        if header[..got].iter().all(|b| *b == 0) {
            return Ok(if zeros_to_the_end(&mut self.input)? {
                Ok(None)
            } else {
                Err("bytes after zeros")
            });
        }
        if got < HEADER {
            return Ok(Err("torn header"));
        }
        if header[..4] != MAGIC {
            return Ok(Err("no frame magic"));
        }
        let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let crc = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        if len > MAX_FRAME {
            return Ok(Err("frame longer than the limit"));
        }
        let mut body = Vec::new();
        (&mut self.input)
            .take(u64::from(len))
            .read_to_end(&mut body)?;
        if body.len() < len as usize {
            return Ok(Err("torn body"));
        }
        if crc32fast::hash(&body) != crc {
            return Ok(Err("checksum mismatch"));
        }
        Ok(decode_body(&body).map(Some))
    }
}

impl<R: Read> Iterator for FrameReader<R> {
    type Item = Frame;

    fn next(&mut self) -> Option<Frame> {
        if self.end.is_some() {
            return None;
        }
        let offset = self.offset;
        let stop = |why| FrameEnd::Bad { offset, why };
        match self.read_frame() {
            Ok(Ok(Some(frame))) => {
                self.offset +=
                    (HEADER + FIXED + frame.session.as_str().len() + frame.line.len()) as u64;
                Some(frame)
            }
            Ok(Ok(None)) => {
                self.end = Some(FrameEnd::Clean);
                None
            }
            Ok(Err(why)) => {
                self.end = Some(stop(why));
                None
            }
            Err(_) => {
                self.end = Some(stop("read error"));
                None
            }
        }
    }
}

/// Whether the rest of the input is zeros (read to its end, or to the
/// first byte that is not).
fn zeros_to_the_end(input: &mut impl Read) -> io::Result<bool> {
    let mut buf = [0u8; 8192];
    loop {
        match read_full(input, &mut buf)? {
            0 => return Ok(true),
            n if buf[..n].iter().any(|b| *b != 0) => return Ok(false),
            _ => {}
        }
    }
}

/// Reads until `buf` is full or the input ends; the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn u64_at(body: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&body[at..at + 8]);
    u64::from_le_bytes(b)
}

/// A frame's body, checked.
fn decode_body(body: &[u8]) -> Result<Frame, &'static str> {
    if body.len() < FIXED {
        return Err("body shorter than its fixed fields");
    }
    let key = FileKey {
        ino: u64_at(body, 0),
        birth: u64_at(body, 8),
    };
    let offset = u64_at(body, 16);
    let id_len = usize::from(body[24]);
    let Some(id) = body.get(FIXED..FIXED + id_len) else {
        return Err("session id past the body's end");
    };
    let session = std::str::from_utf8(id)
        .ok()
        .and_then(|s| s.parse::<SessionId>().ok())
        .ok_or("not a session id")?;
    Ok(Frame {
        session,
        key,
        offset,
        line: body[FIXED + id_len..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(bytes: &[u8]) -> (Vec<Frame>, FrameEnd) {
        let mut r = FrameReader::new(bytes);
        let frames: Vec<_> = r.by_ref().collect();
        (frames, r.end().cloned().unwrap())
    }

    fn sample() -> (Frame, Vec<u8>) {
        let f = Frame {
            session: "s-1".parse().unwrap(),
            key: FileKey { ino: 7, birth: 9 },
            offset: 42,
            line: b"{\"x\":1}\n".to_vec(),
        };
        let bytes = encode(&f.session, f.key, f.offset, &f.line);
        (f, bytes)
    }

    #[test]
    fn frames_read_back_in_order() {
        let (f, bytes) = sample();
        let two = [bytes.clone(), bytes.clone()].concat();
        let (got, end) = frames(&two);
        assert_eq!(got, vec![f.clone(), f]);
        assert_eq!(end, FrameEnd::Clean);
    }

    #[test]
    fn a_torn_or_garbled_tail_is_cut_where_it_starts() {
        let (f, bytes) = sample();
        let at = bytes.len() as u64;
        for cut in 1..bytes.len() {
            let input = [bytes.clone(), bytes[..cut].to_vec()].concat();
            let (got, end) = frames(&input);
            assert_eq!(got, vec![f.clone()], "cut at {cut}");
            assert!(matches!(end, FrameEnd::Bad { offset, .. } if offset == at));
        }
        for flip in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[flip] ^= 0x40;
            let (got, end) = frames(&[bad, bytes.clone()].concat());
            assert!(got.is_empty(), "flip at {flip}");
            assert!(matches!(end, FrameEnd::Bad { offset: 0, .. }));
        }
    }

    #[test]
    fn zeros_after_the_frames_end_them_cleanly() {
        let (f, bytes) = sample();
        for zeros in [1, HEADER - 1, HEADER, 4096] {
            let input = [bytes.clone(), vec![0; zeros]].concat();
            let (got, end) = frames(&input);
            assert_eq!(got, vec![f.clone()], "{zeros} zeros");
            assert_eq!(end, FrameEnd::Clean);
        }
        // A header that is not all zeros is read as one.
        let at = bytes.len() as u64;
        let mut input = [bytes.clone(), vec![0; HEADER]].concat();
        input[bytes.len() + HEADER - 1] = 1;
        let (_, end) = frames(&input);
        assert_eq!(
            end,
            FrameEnd::Bad {
                offset: at,
                why: "no frame magic"
            }
        );
        // Bytes after zeros (a later page written, an earlier one not):
        // torn where the zeros begin.
        for gap in [HEADER, 8192, 20_000] {
            let mut input = [bytes.clone(), vec![0; gap], bytes.clone()].concat();
            let (got, end) = frames(&input);
            assert_eq!(got, vec![f.clone()], "gap {gap}");
            assert_eq!(
                end,
                FrameEnd::Bad {
                    offset: at,
                    why: "bytes after zeros"
                }
            );
            input.truncate(bytes.len() + gap + 1);
            assert!(matches!(frames(&input).1, FrameEnd::Bad { .. }));
        }
    }

    #[test]
    fn an_oversized_length_is_refused_without_allocating_it() {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        let (got, end) = frames(&bytes);
        assert!(got.is_empty());
        assert_eq!(
            end,
            FrameEnd::Bad {
                offset: 0,
                why: "frame longer than the limit"
            }
        );
    }

    #[test]
    fn a_body_naming_no_valid_session_is_refused() {
        let (_, mut bytes) = sample();
        // "s-1" -> "../": same length, a fresh checksum.
        let id_at = HEADER + FIXED;
        bytes[id_at..id_at + 3].copy_from_slice(b"../");
        let crc = crc32fast::hash(&bytes[HEADER..]);
        bytes[8..12].copy_from_slice(&crc.to_le_bytes());
        let (got, end) = frames(&bytes);
        assert!(got.is_empty());
        assert_eq!(
            end,
            FrameEnd::Bad {
                offset: 0,
                why: "not a session id"
            }
        );
    }
}
