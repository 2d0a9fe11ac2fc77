//! Whether a call's request kept an earlier call's history, read from the
//! messages the harness sent (not their token rendering): how a prompt the
//! template re-rendered differently is told apart from a compaction or a
//! history the harness rewrote.

use polar_chat::{Message, Role};

use crate::calls::Call;

/// Whether `r`'s request offers the tools `b`'s did and holds every message
/// of `b`'s request, in order, followed by an assistant turn (`b`'s reply
/// as the harness wrote it back): the harness kept `b`'s conversation whole and went on with it,
/// so a token divergence between the two is the template's re-rendering,
/// never a compaction or an edit. Messages are compared by what a template
/// renders of them (role, text, reasoning text, tool calls, the tool call
/// answered, the tool's name); fields kept from the harness's message that no template
/// reads (`extra`: cache markers that move to the latest message) are left
/// out.
pub(super) fn keeps_history(r: &Call<'_>, b: &Call<'_>) -> bool {
    let (rm, bm) = (&r.record.request.messages, &b.record.request.messages);
    !bm.is_empty()
        && r.record.request.tools == b.record.request.tools
        && rm.len() > bm.len()
        && rm.iter().zip(bm).all(|(x, y)| same_message(x, y))
        && rm[bm.len()].role == Role::Assistant
}

/// Whether `r` and `b` share a message beyond the system prompt (compared
/// as [`keeps_history`] does: a cache marker that moved to the latest
/// message does not make two requests different conversations).
pub(super) fn same_conversation(r: &Call<'_>, b: &Call<'_>) -> bool {
    let (rm, bm) = (&r.record.request.messages, &b.record.request.messages);
    let shared = rm
        .iter()
        .zip(bm)
        .take_while(|(x, y)| same_message(x, y))
        .count();
    let system = usize::from(
        rm.first()
            .is_some_and(|m| matches!(m.role, Role::System | Role::Developer)),
    );
    shared > system
}

/// Whether two messages render the same (see [`keeps_history`]).
fn same_message(x: &Message, y: &Message) -> bool {
    x.role == y.role
        && x.joined_text() == y.joined_text()
        && x.reasoning.as_ref().map(|r| &r.text) == y.reasoning.as_ref().map(|r| &r.text)
        && x.tool_calls == y.tool_calls
        && x.tool_call_id == y.tool_call_id
        && x.name == y.name
        && x.is_error == y.is_error
}
