"""What the bridges share, without any trainer: the instruction of a chat
prompt, and the trace a one-sequence-per-sample trainer trains on."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import PolarError
from ..trajectories import Trace


def instruction_of(raw_prompt: Any) -> str:
    """The text of the last user message of a chat prompt."""
    for message in reversed(list(raw_prompt)):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        parts = [p.get("text", "") for p in content or () if isinstance(p, Mapping) and p.get("type") == "text"]
        return "\n".join(parts)
    raise PolarError("raw_prompt has no user message to send as the task's instruction")


def pick(traces: list[Trace]) -> tuple[Trace, list[Trace]]:
    """The trace a trainer taking one sequence per sample trains on (the
    main chain's first segment, else the first trace), and the others."""
    if not traces:
        raise PolarError("the session exported no trace")
    main = [t for t in traces if t.chain_role == "main" and t.segment == 0]
    chosen = main[0] if main else traces[0]
    return chosen, [t for t in traces if t is not chosen]
