"""polar-client: Polar's rollout API for trainers.

- [`Client`] / [`AsyncClient`]: submit tasks, follow their events, wait for
  results, pause and resume generation around a weight update;
- [`load`] / [`load_task`]: exported trajectories as [`Trace`]s (token
  arrays, loss mask, logprobs, reward, group, chain role, policy version);
- [`load_calls`]: every session's exported model calls (native requests,
  replies, token ids), the source of truth; [`rederive`]: the trajectory
  builders over them through ``polar export --from``;
- [`advantages`]: group-relative advantages;
- ``polar_client.bridges``: adapters for trainers (each imports its trainer
  only when imported itself).
"""

from .aio import AsyncClient
from .calls import Call, SessionCalls, load_calls, read_calls, rederive
from .client import Client
from .errors import (
    ApiError,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    PolarError,
    ServerUnavailable,
    StorageUnavailable,
    TaskFailed,
    TaskTimeout,
    TooLarge,
    TrajectoryError,
    Unauthorized,
    UnusableSamples,
)
from .events import AsyncEventStream, EventStream
from .grpo import advantages
from .trajectories import S3, Trace, load, load_task, read_file, select
from .types import Event, FailureGroup, Node, Resumed, SampleResult, SampleView, Submitted, Task

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncEventStream",
    "Call",
    "Client",
    "Conflict",
    "Event",
    "EventStream",
    "FailureGroup",
    "Forbidden",
    "InvalidRequest",
    "Node",
    "NotFound",
    "PolarError",
    "Resumed",
    "S3",
    "SampleResult",
    "SampleView",
    "SessionCalls",
    "ServerUnavailable",
    "StorageUnavailable",
    "Submitted",
    "Task",
    "TaskFailed",
    "TaskTimeout",
    "TooLarge",
    "Trace",
    "TrajectoryError",
    "Unauthorized",
    "UnusableSamples",
    "advantages",
    "load",
    "load_calls",
    "load_task",
    "read_calls",
    "read_file",
    "rederive",
    "select",
]
