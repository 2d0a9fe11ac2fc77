"""The client's exceptions: one per kind of failure, each carrying what the
server said (its `error.code`, `error.field` and `error.message`, see
docs/ROLLOUT-API.md "Errors") or why no server answered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import Task


class PolarError(Exception):
    """Anything this package raises on purpose."""


class ServerUnavailable(PolarError):
    """No answer: the server is down, unreachable, or did not answer in
    time. ``url`` is what was asked, ``reason`` the transport's error."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


class ApiError(PolarError):
    """The server answered with an error status. ``status`` is the HTTP
    status, ``code``, ``field`` and ``message`` the reply's ``error``
    object (``code`` is ``"http"`` and ``message`` the body's start when the
    body was not Polar's error shape)."""

    def __init__(
        self, status: int, code: str, message: str, field: str | None = None
    ) -> None:
        text = f"{status} {code}: {message}"
        super().__init__(text)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


class InvalidRequest(ApiError):
    """400 ``invalid_request``: a body or parameter is wrong; ``field``
    names it."""


class Unauthorized(ApiError):
    """401: a missing or wrong bearer token; the message names the token
    the endpoint needs and what the one given is."""


class Forbidden(ApiError):
    """403: a token used for what it does not serve."""


class NotFound(ApiError):
    """404: unknown task, node, session or route."""


class Conflict(ApiError):
    """409: ``duplicate_task``, ``task_not_finished``, ``stale_attempt``,
    ``wrong_instance``."""


class TooLarge(ApiError):
    """413: the body is over the server's limit."""


class StorageUnavailable(ApiError):
    """503 ``storage``: the server's database did not commit; nothing
    changed, retry."""


class TaskTimeout(PolarError):
    """A wait for a task ended before the task finished. ``task`` is its
    last known view (a ``dict``: the ``GET /v1/tasks/{id}`` body)."""

    def __init__(self, task_id: str, seconds: float, task: dict[str, Any] | None) -> None:
        super().__init__(f"task {task_id} not finished after {seconds:g} s")
        self.task_id = task_id
        self.task = task


class TaskFailed(PolarError):
    """A finished task has no usable sample: every one failed, timed out or
    was ended by the infrastructure. The message groups why; ``task`` is
    the task's view (``task.failures``)."""

    def __init__(self, message: str, task: Task) -> None:
        super().__init__(message)
        self.task = task


class UnusableSamples(UserWarning):
    """A finished task has fewer usable samples than it asks for (or none,
    with ``failures="warn"``): the message groups why."""


class TrajectoryError(PolarError):
    """Exported trajectories that cannot be read: missing, not Parquet, of
    another export schema version, or rows that break the schema's
    invariants."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    503: StorageUnavailable,
}


def from_reply(status: int, body: bytes) -> ApiError:
    """The exception for an error reply: its class by status, its fields
    from Polar's ``{"error": {code, field, message}}`` body."""
    import json

    code, field, message = "http", None, body[:500].decode("utf-8", "replace").strip()
    try:
        detail = json.loads(body)["error"]
        code = str(detail["code"])
        message = str(detail["message"])
        raw_field = detail.get("field")
        field = None if raw_field is None else str(raw_field)
    except (ValueError, KeyError, TypeError):
        pass
    cls = _BY_STATUS.get(status, ApiError)
    if status == 503 and code != "storage":
        cls = ApiError
    return cls(status, code, message or f"HTTP {status}", field)
