//! [`KeyPath`]: where in a TOML or JSON document a value is, shown as
//! `route[2].host`; [`KeyError`]: a value refused at its key, the one error
//! every validator of Polar's configuration files and task specs returns
//! (each file's own error type wraps it, adding what only the file knows:
//! its path, a line and column).

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

    /// `rest` below this path.
    #[must_use]
    pub fn join(&self, rest: &KeyPath) -> Self {
        let mut segments = self.0.clone();
        segments.extend(rest.0.iter().cloned());
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

/// A value refused at its key, shown as `{key}: {reason}`: what every
/// validator of a configuration file or a task spec returns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct KeyError {
    /// Where the value is (`gateway.policy.upload_roots[1]`).
    pub key: KeyPath,
    /// What is wrong, in words that name the accepted values.
    pub reason: String,
}

impl KeyError {
    /// The error `reason` at `key`.
    pub fn new(key: KeyPath, reason: impl Into<String>) -> Self {
        Self {
            key,
            reason: reason.into(),
        }
    }

    /// The error of a table's validator, its key put below `table` (the
    /// table's place in the file).
    #[must_use]
    pub fn under(self, table: &KeyPath) -> Self {
        Self {
            key: table.join(&self.key),
            reason: self.reason,
        }
    }
}

impl KeyPath {
    /// The path of dotted keys `a.b.c` (no indices, no quoting): the
    /// top-level tables and keys code names as text.
    pub fn dotted(text: &str) -> Self {
        Self(
            text.split('.')
                .filter(|k| !k.is_empty())
                .map(|k| Segment::Key(k.to_owned()))
                .collect(),
        )
    }
}
