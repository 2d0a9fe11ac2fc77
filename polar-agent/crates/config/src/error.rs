//! Errors of the config module: [`ConfigError`], and the [`KeyPath`] and
//! [`Location`] every error uses to say where in the file it applies.

use std::fmt;
use std::io;
use std::path::PathBuf;

pub use polar_spec::{KeyError, KeyPath, Segment};

/// A position in the TOML text, both counted from 1 (the column in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Location {
    /// Line number, from 1.
    pub line: usize,
    /// Column number in characters, from 1.
    pub column: usize,
}

impl Location {
    /// The location of byte `offset` in `source` (clamped to its end).
    pub fn of_offset(source: &str, offset: usize) -> Self {
        let mut offset = offset.min(source.len());
        while !source.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &source[..offset];
        let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        Self { line, column }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

/// Renders ` (line L, column C)` when the location is known.
struct At(Option<Location>);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(location) => write!(f, " ({location})"),
            None => Ok(()),
        }
    }
}

/// Everything that can be wrong with a config file.
///
/// Every variant that concerns a key names its [`KeyPath`]; the
/// [`Location`] is filled in when the error was found in TOML text.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file that was asked for.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: io::Error,
    },

    /// The text is not TOML (unclosed table, duplicate key, bad string, ...).
    #[error("invalid TOML at {at}: {message}")]
    Syntax {
        /// Where the parser stopped.
        at: Location,
        /// The parser's description of the problem.
        message: String,
    },

    /// A key that the schema does not know (often a typo).
    #[error("unknown field `{field}` at {table}{}{}", expected_suffix(expected), At(*at))]
    UnknownField {
        /// The unknown key as written.
        field: String,
        /// The table that holds it.
        table: KeyPath,
        /// The keys that table accepts, as the deserializer lists them.
        expected: String,
        /// Where the key is written.
        at: Option<Location>,
    },

    /// A value of the wrong type, an integer out of its type's range, an
    /// unknown enum string (`action = "modle"`) or a missing required key.
    #[error("{key}: {message}{}", At(*at))]
    Schema {
        /// The key whose value (or table) is wrong.
        key: KeyPath,
        /// The deserializer's description of the problem.
        message: String,
        /// Where the value is written.
        at: Option<Location>,
    },

    /// A well-typed value that Polar cannot accept: a bad host pattern, a
    /// port 0, a number out of range, a provider on a route that is not
    /// `model`, a duplicate route, ...
    #[error("{error}{}", At(*at))]
    Invalid {
        /// The key whose value is refused, and why, in words that name the
        /// accepted values: what every section's validator returns.
        error: KeyError,
        /// Where the value is written, when known.
        at: Option<Location>,
    },

    /// Any of the above, found in the file `path`.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<ConfigError>,
    },
}

impl From<KeyError> for ConfigError {
    fn from(error: KeyError) -> Self {
        Self::Invalid { error, at: None }
    }
}

fn expected_suffix(expected: &str) -> String {
    if expected.is_empty() {
        String::new()
    } else {
        format!(", expected {expected}")
    }
}

impl ConfigError {
    /// An [`ConfigError::Invalid`] error for `key`, without location yet.
    pub(crate) fn invalid(key: KeyPath, reason: impl Into<String>) -> Self {
        KeyError::new(key, reason).into()
    }

    /// The key path the error is about, if it is about a key.
    pub fn key(&self) -> Option<&KeyPath> {
        match self {
            Self::Read { .. } | Self::Syntax { .. } => None,
            Self::UnknownField { table, .. } => Some(table),
            Self::Schema { key, .. } => Some(key),
            Self::Invalid { error, .. } => Some(&error.key),
            Self::InFile { source, .. } => source.key(),
        }
    }

    /// The location in the TOML text, if known.
    pub fn location(&self) -> Option<Location> {
        match self {
            Self::Read { .. } => None,
            Self::Syntax { at, .. } => Some(*at),
            Self::UnknownField { at, .. } | Self::Schema { at, .. } | Self::Invalid { at, .. } => {
                *at
            }
            Self::InFile { source, .. } => source.location(),
        }
    }

    /// The error without the file it was found in.
    pub fn without_file(&self) -> &Self {
        match self {
            Self::InFile { source, .. } => source.without_file(),
            other => other,
        }
    }

    /// Sets the location of an error that has a key but no location yet.
    pub(crate) fn set_location(&mut self, location: Location) {
        match self {
            Self::UnknownField { at, .. } | Self::Schema { at, .. } | Self::Invalid { at, .. } => {
                if at.is_none() {
                    *at = Some(location);
                }
            }
            Self::InFile { source, .. } => source.set_location(location),
            Self::Read { .. } | Self::Syntax { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_path_display() {
        let path = KeyPath::root().key("route").index(2).key("host");
        assert_eq!(path.to_string(), "route[2].host");
        assert_eq!(KeyPath::root().to_string(), "top level");
        assert_eq!(KeyPath::root().key("a b").key("c").to_string(), "\"a b\".c");
        assert_eq!(path.parent(), Some(KeyPath::root().key("route").index(2)));
        assert_eq!(KeyPath::root().parent(), None);
    }

    #[test]
    fn location_of_offset() {
        let src = "a = 1\nbé = 2\n";
        assert_eq!(Location::of_offset(src, 0), Location { line: 1, column: 1 });
        assert_eq!(Location::of_offset(src, 6), Location { line: 2, column: 1 });
        // "é" is two bytes but one column.
        assert_eq!(Location::of_offset(src, 9), Location { line: 2, column: 3 });
        // Inside a multi-byte character and past the end are clamped.
        assert_eq!(Location::of_offset(src, 8), Location { line: 2, column: 2 });
        assert_eq!(
            Location::of_offset(src, 99),
            Location { line: 3, column: 1 }
        );
    }

    #[test]
    fn display_names_the_key_and_location() {
        let mut error = ConfigError::invalid(
            KeyPath::root().key("route").index(2).key("host"),
            "\"*.\" is not a valid host pattern",
        );
        assert_eq!(
            error.to_string(),
            "route[2].host: \"*.\" is not a valid host pattern"
        );
        error.set_location(Location { line: 9, column: 8 });
        assert_eq!(
            error.to_string(),
            "route[2].host: \"*.\" is not a valid host pattern (line 9, column 8)"
        );
        let in_file = ConfigError::InFile {
            path: PathBuf::from("/etc/polar.toml"),
            source: Box::new(error),
        };
        assert!(
            in_file
                .to_string()
                .starts_with("/etc/polar.toml: route[2].host: ")
        );
        assert_eq!(in_file.location(), Some(Location { line: 9, column: 8 }));
        assert_eq!(
            in_file.key().map(ToString::to_string).as_deref(),
            Some("route[2].host")
        );
    }
}
