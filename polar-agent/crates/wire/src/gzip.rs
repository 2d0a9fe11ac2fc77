//! Request bodies sent `content-encoding: gzip` (Claude Code compresses
//! some), inflated in 64 KiB steps into a sink that may refuse to grow:
//! a small body that inflates to gigabytes (a "gzip bomb") is stopped at
//! the sink's limit, never held whole. Concatenated gzip members are read
//! as one body (RFC 1952 allows several).

use std::io::Read;

/// Bytes inflated per step.
const STEP: usize = 64 * 1024;

/// Why a body could not be inflated.
#[derive(Debug, thiserror::Error)]
pub enum InflateError<E> {
    /// The bytes are not gzip, or are cut or corrupt.
    #[error("the gzip-encoded body is corrupt: {0}")]
    Corrupt(std::io::Error),
    /// The sink refused to grow past its limit.
    #[error("the body inflates past the limit")]
    TooLarge,
    /// The sink failed.
    #[error(transparent)]
    Sink(E),
}

/// Inflates `raw` into `push`, one step at a time: `push` answers `Ok(true)`
/// to go on, `Ok(false)` when the step would pass its limit (the body is
/// then [`InflateError::TooLarge`]), or its own error.
pub fn inflate<E>(
    raw: &[u8],
    mut push: impl FnMut(&[u8]) -> Result<bool, E>,
) -> Result<(), InflateError<E>> {
    let mut reader = flate2::read::MultiGzDecoder::new(raw);
    let mut chunk = vec![0u8; STEP];
    loop {
        let n = reader.read(&mut chunk).map_err(InflateError::Corrupt)?;
        if n == 0 {
            return Ok(());
        }
        match push(&chunk[..n]) {
            Ok(true) => {}
            Ok(false) => return Err(InflateError::TooLarge),
            Err(e) => return Err(InflateError::Sink(e)),
        }
    }
}

/// Inflates `raw` whole, refusing more than `limit` bytes of output.
pub fn inflate_limited(raw: &[u8], limit: usize) -> Result<Vec<u8>, InflateError<()>> {
    let mut out = Vec::new();
    inflate(raw, |step| {
        if out.len().saturating_add(step.len()) > limit {
            return Ok(false);
        }
        out.extend_from_slice(step);
        Ok(true)
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn inflates_members_and_stops_at_the_limit() {
        let two = [gz(b"hello "), gz(b"world")].concat();
        assert_eq!(inflate_limited(&two, 11).unwrap(), b"hello world");
        assert!(matches!(
            inflate_limited(&two, 10),
            Err(InflateError::TooLarge)
        ));
        let bomb = gz(&vec![0; 16 << 20]);
        assert!(matches!(
            inflate_limited(&bomb, 1 << 20),
            Err(InflateError::TooLarge)
        ));
        assert!(matches!(
            inflate_limited(b"nope", 100),
            Err(InflateError::Corrupt(_))
        ));
        let cut = gz(b"hello");
        assert!(matches!(
            inflate_limited(&cut[..cut.len() - 3], 100),
            Err(InflateError::Corrupt(_))
        ));
        let e = inflate(&gz(b"x"), |_| Err::<bool, _>("full")).unwrap_err();
        assert!(matches!(e, InflateError::Sink("full")));
    }
}
