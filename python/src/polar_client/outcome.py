"""What a finished task's unusable samples mean to a trainer loop (only a
usable sample, status ``completed``, has a reward): a task that ended with
none raises [`TaskFailed`] (``failures="raise"``, the default) or warns
[`UnusableSamples`] (``"warn"``); a ``partial`` one (some usable, fewer
than requested) warns unless ``"ignore"``. [`Client.wait`] and
[`load_task`] apply it; the message groups the failures by reason."""

from __future__ import annotations

import warnings
from typing import Literal

from .errors import TaskFailed, UnusableSamples
from .types import Task

Failures = Literal["raise", "warn", "ignore"]
"""How a finished task without enough usable samples is reported."""

_MODES = ("raise", "warn", "ignore")


def summary(task: Task) -> str:
    """``task t ended failed: 0 of 4 requested samples usable`` and one line
    per group of failures."""
    head = f"task {task.task_id} ended {task.status}: {task.usable} of {task.requested} requested samples usable"
    if task.reason:
        head += f" ({task.reason})"
    return "\n".join([head, *(f"  {g}" for g in task.failures)])


def validate(failures: str) -> None:
    """Raises ``ValueError`` for an unknown mode (before any wait)."""
    if failures not in _MODES:
        raise ValueError(f"failures={failures!r}: must be one of {', '.join(map(repr, _MODES))}")


def check(task: Task, failures: Failures, stacklevel: int = 3) -> Task:
    """``task``, after raising or warning as ``failures`` says when it is
    finished short of usable samples."""
    validate(failures)
    if failures == "ignore" or not task.finished:
        return task
    if task.status == "failed":
        if failures == "raise":
            raise TaskFailed(summary(task), task)
        warnings.warn(summary(task), UnusableSamples, stacklevel=stacklevel)
    elif task.status == "partial":
        warnings.warn(summary(task), UnusableSamples, stacklevel=stacklevel)
    return task
