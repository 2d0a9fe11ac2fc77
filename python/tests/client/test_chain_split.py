"""What a one-sequence-per-sample bridge says about the chain it hands over
(``polar_client.bridges.common``), on traces shaped like exported rows."""

from __future__ import annotations

import numpy as np

import polar_client as pc
from polar_client.bridges.common import chain_split, pick


def trace(trace_id: str, *, session: str = "t-s0", chain: int = 0, segment: int = 0, role: str = "main",
          labels: tuple[str, ...] = (), generated: int = 3) -> pc.Trace:
    return pc.Trace(
        trace_id=trace_id, session_id=session, task_id="t", group_id="g", attempt=1, chain_role=role,
        policy_version=None, weight_version=None, status="completed", labels=labels, trace_index=0,
        chain=chain, segment=segment, finish_reason="stop", reward=1.0,
        prompt_ids=np.arange(4, dtype=np.int64), response_ids=np.arange(generated + 2, dtype=np.int64),
        loss_mask=np.array([1] * generated + [0, 0], dtype=np.uint8), logprobs=None,
        trace_metadata={}, trajectory_metadata={},
    )


def test_a_whole_main_chain_is_one_segment() -> None:
    # A title call (its own chain, `side`) and the main chain in one trace.
    chosen, others = pick([trace("side", chain=0, role="side"), trace("main", chain=1)])
    assert chosen.trace_id == "main"
    split = chain_split(chosen, others)
    assert split.whole and split.segments == 1 and split.untrained_tokens == 0


def test_segments_after_breaks_are_counted_with_their_generated_tokens() -> None:
    traces = [
        trace("m0", chain=1, segment=0),
        trace("m1", chain=1, segment=1, generated=5),
        trace("m2", chain=1, segment=2, generated=7),
        # Not the main chain's: a sub-agent, another session, a thrown-away retry.
        trace("sub", chain=2, role="sub_agent", generated=11),
        trace("other", chain=1, session="t-s1", generated=13),
        trace("retry", chain=1, segment=3, labels=("superseded_retry",), generated=17),
    ]
    chosen, others = pick(traces)
    assert chosen.trace_id == "m0"
    split = chain_split(chosen, others)
    assert not split.whole
    assert (split.segments, split.untrained_tokens) == (3, 12)
