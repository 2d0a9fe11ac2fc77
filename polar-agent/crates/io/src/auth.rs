//! Comparing secrets (bearer tokens, API keys) without leaking through
//! timing how much of a guess was right: [`subtle::ConstantTimeEq`] for
//! each comparison, and every candidate compared, with no early exit.
//! Lengths are not hidden (a token's length is not its secret).

use subtle::{Choice, ConstantTimeEq as _};

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
}
