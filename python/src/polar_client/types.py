"""The rollout API's replies as typed, read-only views (docs/ROLLOUT-API.md).

Each view keeps the JSON it was made from in ``raw``: version 1 replies may
gain fields, which stay reachable there."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

TaskStatus = Literal["queued", "running", "completed", "partial", "cancelled", "failed"]
SessionState = Literal["pending", "dispatched", "running", "done", "failed", "cancelled"]
SampleStatus = Literal["completed", "timeout", "error", "cancelled"]

FINISHED: frozenset[str] = frozenset({"completed", "partial", "cancelled", "failed"})


@dataclass(frozen=True)
class SampleResult:
    """What a gateway reported for a finished session."""

    status: SampleStatus
    reward: float | None
    trajectory_uri: str | None
    prompt_tokens: int
    response_tokens: int
    calls: int
    error: str | None
    stats: Mapping[str, Any] | None

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> SampleResult:
        tokens = raw.get("tokens") or {}
        return cls(
            status=raw["status"],
            reward=None if raw.get("reward") is None else float(raw["reward"]),
            trajectory_uri=raw.get("trajectory_uri"),
            prompt_tokens=int(tokens.get("prompt", 0)),
            response_tokens=int(tokens.get("response", 0)),
            calls=int(tokens.get("calls", 0)),
            error=raw.get("error"),
            stats=raw.get("stats"),
        )


@dataclass(frozen=True)
class SampleView:
    """One sample (session) of a task."""

    sample_index: int
    session_id: str
    state: SessionState
    attempts: int
    retries: int
    node: str | None
    result: SampleResult | None
    """Set when ``state == "done"``."""
    error: str | None
    """Why, when ``state`` is ``failed`` or ``cancelled``."""
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> SampleView:
        result = raw.get("result")
        return cls(
            sample_index=int(raw["sample_index"]),
            session_id=str(raw["session_id"]),
            state=raw["state"],
            attempts=int(raw.get("attempts", 0)),
            retries=int(raw.get("retries", 0)),
            node=raw.get("node"),
            result=None if result is None else SampleResult.of(result),
            error=raw.get("error", raw.get("reason")),
            raw=raw,
        )


@dataclass(frozen=True)
class FailureGroup:
    """Samples of a task that ended unusable for one reason."""

    status: str
    """A result's status (``error``, ``timeout``), or ``failed`` when the
    server could not get the samples run."""
    error: str
    count: int
    samples: tuple[int, ...]

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> FailureGroup:
        return cls(
            status=str(raw["status"]),
            error=str(raw["error"]),
            count=int(raw["count"]),
            samples=tuple(int(i) for i in raw.get("samples") or ()),
        )

    def __str__(self) -> str:
        shown = ", ".join(str(i) for i in self.samples[:10])
        more = f", ... {len(self.samples) - 10} more" if len(self.samples) > 10 else ""
        noun = "sample" if self.count == 1 else "samples"
        return f"{self.count} {noun} {self.status}: {self.error} ({noun} {shown}{more})"


@dataclass(frozen=True)
class Task:
    """A task's status, and its samples when asked for one task. Only a
    usable sample (status ``completed``) has a reward; ``status`` is
    ``partial`` when the task ended with fewer usable samples than
    ``requested``, ``failed`` with none (``failures`` says why)."""

    task_id: str
    status: TaskStatus
    group_id: str
    policy_version: str | None
    num_samples: int
    requested: int
    """Usable samples the task asks for (``early_stop_after`` or ``num_samples``)."""
    counts: Mapping[str, int]
    reason: str | None
    mean_reward: float | None
    """Over the usable samples."""
    failures: tuple[FailureGroup, ...]
    """Why the unusable samples ended, grouped, most frequent first."""
    samples: tuple[SampleView, ...]
    raw: Mapping[str, Any] = field(repr=False)

    @property
    def finished(self) -> bool:
        """Whether every session is over."""
        return self.status in FINISHED

    @property
    def usable(self) -> int:
        """Samples done with status ``completed``."""
        return int(self.counts.get("usable", 0))

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Task:
        return cls(
            task_id=str(raw["task_id"]),
            status=raw["status"],
            group_id=str(raw.get("group_id", raw["task_id"])),
            policy_version=raw.get("policy_version"),
            num_samples=int(raw["num_samples"]),
            requested=int(raw.get("requested", raw["num_samples"])),
            counts=dict(raw.get("counts") or {}),
            reason=raw.get("reason"),
            mean_reward=None if raw.get("mean_reward") is None else float(raw["mean_reward"]),
            failures=tuple(FailureGroup.of(g) for g in raw.get("failures") or ()),
            samples=tuple(SampleView.of(s) for s in raw.get("samples") or ()),
            raw=raw,
        )


@dataclass(frozen=True)
class Submitted:
    """The reply to a submission."""

    task_id: str
    status: TaskStatus
    session_ids: tuple[str, ...]

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Submitted:
        return cls(
            task_id=str(raw["task_id"]),
            status=raw["status"],
            session_ids=tuple(str(s) for s in raw["session_ids"]),
        )


@dataclass(frozen=True)
class Event:
    """One frame of ``GET /v1/events``: ``type`` is ``task``, ``session``,
    ``calls`` or ``node``; ``data`` is its JSON (``task_id``, ``status``,
    ``counts`` for a task; ``session_id``, ``task_id``, ``sample_index``,
    ``state`` and the state's fields for a session; ``session_id``,
    ``task_id``, ``sample_index``, ``attempt`` and ``calls``, the model
    calls of a running session that just ended, for calls; ``node_id``,
    ``health`` for a node)."""

    id: int
    type: str
    data: Mapping[str, Any] = field(repr=False)

    @property
    def task_id(self) -> str | None:
        value = self.data.get("task_id")
        return None if value is None else str(value)


@dataclass(frozen=True)
class Node:
    """A gateway node as the server lists it."""

    node_id: str
    address: str
    health: str
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Node:
        return cls(
            node_id=str(raw["node_id"]),
            address=str(raw["address"]),
            health=str(raw["health"]),
            raw=raw,
        )


@dataclass(frozen=True)
class Resumed:
    """What one node answered to a resume."""

    node_id: str
    policy_version: str | None
