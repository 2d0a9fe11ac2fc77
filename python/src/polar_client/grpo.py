"""Group-relative advantages (GRPO) from the traces' rewards.

A ``prefix_merging`` session can yield several traces (a sub-agent's chain,
a segment after compaction) sharing the session's reward. With
``per="session"`` the group's statistics are computed over one trace per
session (its main chain's first segment), so sessions with more traces do
not weigh more; every trace then gets its session's advantage. With
``per="trace"`` every trace counts."""

from __future__ import annotations

from collections import defaultdict
from typing import Literal, Sequence

import numpy as np
import numpy.typing as npt

from .trajectories import Trace


def advantages(
    traces: Sequence[Trace], *, per: Literal["session", "trace"] = "session", eps: float = 1e-6
) -> npt.NDArray[np.float64]:
    """``(reward - mean) / (std + eps)`` within each ``group_id``, one value
    per trace in order. A trace without a reward (its sample was not
    usable: the infrastructure, the evaluator or the budget ended it) is
    left out of its group's statistics and gets 0 (no learning signal);
    [`select`] drops such traces beforehand."""
    members: dict[str | None, list[float]] = defaultdict(list)
    for t in traces:
        if t.reward is not None and (per == "trace" or (t.chain_role == "main" and t.segment == 0)):
            members[t.group_id].append(t.reward)
    out = np.zeros(len(traces), dtype=np.float64)
    for i, t in enumerate(traces):
        if t.reward is None:
            continue
        group = np.array(members.get(t.group_id) or [t.reward])
        out[i] = (t.reward - group.mean()) / (group.std() + eps)
    return out
