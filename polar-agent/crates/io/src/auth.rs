//! Comparing secrets (bearer tokens, API keys) without leaking through
//! timing how much of a guess was right: [`subtle::ConstantTimeEq`] for
//! each comparison, and every candidate compared, with no early exit.
//! Lengths are not hidden (a token's length is not its secret). Also the
//! tokens of the shipped examples that start-up refuses, and reading a
//! token from a file (a Kubernetes secret, mounted).

use std::path::Path;

use subtle::{Choice, ConstantTimeEq as _};

/// Tokens written in the shipped examples and docs: a server or gateway
/// refuses to start with one of these (or any token starting with
/// `change-me`).
pub const EXAMPLE_TOKENS: &[&str] = &[
    "trainer-secret-token",
    "node-secret-token",
    "server-secret-token",
    "callback-secret-token",
    "trainer-secret",
    "node-secret",
    "server-secret",
];

/// Whether `token` is one of the examples' (see [`EXAMPLE_TOKENS`]).
pub fn is_example_token(token: &str) -> bool {
    token.starts_with("change-me") || EXAMPLE_TOKENS.contains(&token)
}

/// Why `token` may not be configured (too short, or one of the docs'
/// examples), if it may not: the one check every server's start-up makes.
pub fn token_weakness(token: &str) -> Option<&'static str> {
    if token.len() < 8 {
        Some("a token must be at least 8 characters")
    } else if is_example_token(token) {
        Some(
            "this is an example token from the docs: generate a secret \
             (e.g. `openssl rand -hex 32`)",
        )
    } else {
        None
    }
}

/// Reads a token from a file: its content without surrounding whitespace
/// (a trailing newline is usual); an empty file is an error.
pub fn read_token_file(path: &Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    let token = text.trim();
    if token.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the file is empty",
        ));
    }
    Ok(token.to_owned())
}

/// Which candidate `given` is (the key of the matching token): every
/// candidate is compared, in constant time each.
pub fn token_owner<'a, K: ?Sized>(
    given: &str,
    candidates: impl IntoIterator<Item = (&'a K, &'a str)>,
) -> Option<&'a K> {
    let mut owner = None;
    for (key, candidate) in candidates {
        let hit = bool::from(given.as_bytes().ct_eq(candidate.as_bytes()));
        if hit && owner.is_none() {
            owner = Some(key);
        }
    }
    owner
}

/// Whether `a` and `b` are the same secret, in time that depends only on
/// their lengths.
pub fn token_eq(a: &[u8], b: &[u8]) -> bool {
    bool::from(a.ct_eq(b))
}

/// Whether `given` is one of `accepted`: every candidate is compared, in
/// constant time each, whichever matches.
pub fn token_in<'a>(given: &str, accepted: impl IntoIterator<Item = &'a str>) -> bool {
    let mut found = Choice::from(0);
    for candidate in accepted {
        found |= given.as_bytes().ct_eq(candidate.as_bytes());
    }
    bool::from(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_by_content() {
        assert!(token_eq(b"abc", b"abc"));
        assert!(!token_eq(b"abc", b"abd"));
        assert!(!token_eq(b"abc", b"abcd"));
        assert!(!token_eq(b"", b"a"));
        assert!(token_eq(b"", b""));
        let accepted = ["first", "second-token"];
        assert!(token_in("first", accepted));
        assert!(token_in("second-token", accepted));
        assert!(!token_in("second-tokem", accepted));
        assert!(!token_in("", accepted));
        assert!(!token_in("first", []));
    }

    #[test]
    fn the_owner_of_a_token_and_the_examples() {
        let nodes = [("a", "token-of-a"), ("b", "token-of-b")];
        assert_eq!(token_owner("token-of-b", nodes), Some("b"));
        assert_eq!(token_owner("token-of-c", nodes), None);
        assert!(is_example_token("change-me-node-token"));
        assert!(is_example_token("node-secret-token"));
        assert!(!is_example_token("k3J9-random-0f2a"));
        assert!(token_weakness("short").is_some_and(|w| w.contains("8 characters")));
        assert!(token_weakness("change-me-node-token").is_some_and(|w| w.contains("example")));
        assert_eq!(token_weakness("k3J9-random-0f2a"), None);
    }

    #[test]
    fn a_token_file_is_trimmed_and_must_not_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "s3cret-value\n").unwrap();
        assert_eq!(read_token_file(&p).unwrap(), "s3cret-value");
        std::fs::write(&p, " \n").unwrap();
        assert!(read_token_file(&p).is_err());
    }
}
