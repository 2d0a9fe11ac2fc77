"""What the bridges share, without any trainer: the instruction of a chat
prompt, the trace a one-sequence-per-sample trainer trains on, and what of
its chain such a trainer does not see."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class ChainSplit:
    """How much of the picked trace's chain the picked trace holds. With
    token-faithful serving (docs/CONSUMERS.md) a main chain is one segment
    (compaction aside) and ``segments`` is 1; on the server-rendered path a
    real model's template can split it into one segment per call, and a
    trainer taking one sequence per sample then trains on the first only."""

    segments: int
    """Segments of the chain (the picked one included; retries the harness
    threw away are not segments)."""
    untrained_tokens: int
    """Generated tokens (``loss_mask`` 1s) of the chain's other segments."""

    @property
    def whole(self) -> bool:
        return self.segments == 1


def chain_split(chosen: Trace, others: list[Trace]) -> ChainSplit:
    """The [`ChainSplit`] of ``chosen`` among its session's ``others``."""
    rest = [
        t
        for t in others
        if t.session_id == chosen.session_id
        and t.chain == chosen.chain
        and t.chain_role == chosen.chain_role
        and "superseded_retry" not in t.labels
    ]
    return ChainSplit(1 + len(rest), sum(int(t.loss_mask.sum()) for t in rest))
