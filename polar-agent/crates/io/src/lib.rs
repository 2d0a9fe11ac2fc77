//! Plumbing shared by Polar's servers and clients: response bodies
//! ([`body`]), the one place background tasks are spawned ([`tasks`]), and
//! an error with its causes on one line ([`chain`]).
//!
//! This crate sits below every other Polar crate that does I/O and depends
//! on no Polar crate.

pub mod body;
pub mod tasks;

/// An error with its causes, one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let s_text = s.to_string();
        if !msg.contains(&s_text) {
            msg.push_str(": ");
            msg.push_str(&s_text);
        }
        src = s.source();
    }
    msg
}
