//! [`KeyPath`]: where in a TOML or JSON document a value is, shown as
//! `route[2].host`; every spec and configuration error names one.

use std::fmt;

/// One step of a [`KeyPath`]: a table key or an array index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Segment {
    /// A key inside a table (`proxy`, `max_body_bytes`).
    Key(String),
    /// A position inside an array (`route[2]`).
    Index(usize),
}

/// The path of a key inside the TOML document, shown as `route[2].host`.
///
/// The empty path is the top level of the document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct KeyPath(Vec<Segment>);

impl KeyPath {
    /// The top level of the document.
    pub fn root() -> Self {
        Self(Vec::new())
    }

    /// This path extended by the key `key`.
    #[must_use]
    pub fn key(&self, key: &str) -> Self {
        let mut segments = self.0.clone();
        segments.push(Segment::Key(key.to_owned()));
        Self(segments)
    }

    /// This path extended by the array index `index`.
    #[must_use]
    pub fn index(&self, index: usize) -> Self {
        let mut segments = self.0.clone();
        segments.push(Segment::Index(index));
        Self(segments)
    }

    /// The path of the table or array that holds this key, `None` at the top level.
    pub fn parent(&self) -> Option<Self> {
        let (_, rest) = self.0.split_last()?;
        Some(Self(rest.to_vec()))
    }

    /// The segments from the top level down.
    pub fn segments(&self) -> &[Segment] {
        &self.0
    }

    /// Whether this is the top level of the document.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// A path of the given segments.
    pub fn from_segments(segments: Vec<Segment>) -> Self {
        Self(segments)
    }
}

/// Whether `key` can be written bare in TOML (otherwise it is shown quoted).
fn is_bare_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("top level");
        }
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(key) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    if is_bare_key(key) {
                        f.write_str(key)?;
                    } else {
                        write!(f, "{key:?}")?;
                    }
                }
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}
