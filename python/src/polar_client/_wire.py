"""What the sync and asyncio clients share: the requests they make, how a
reply becomes a view or an exception, and how an SSE frame becomes an
[`Event`]. No I/O here."""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import quote

import httpx

from .errors import PolarError, ServerUnavailable, TaskTimeout, from_reply
from .types import FINISHED, Event, Node, Task

API_VERSION = 1
TOKEN_ENV = "POLAR_ROLLOUT_TOKEN"
GATEWAY_TOKEN_ENV = "POLAR_GATEWAY_TOKEN"
CA_FILE_ENV = "POLAR_ROLLOUT_CA_FILE"


@dataclass(frozen=True)
class Request:
    """One API call."""

    method: str
    path: str
    body: Mapping[str, Any] | None = None
    params: Mapping[str, str] | None = None


class Settings:
    """What both clients are made with (see [`Client`])."""

    def __init__(self, server: str, token: str | None, gateway_token: str | None, timeout: float) -> None:
        self.server = server.rstrip("/")
        self._token = token_or_env(token, TOKEN_ENV)
        self._gateway_token = token_or_env(gateway_token, GATEWAY_TOKEN_ENV)
        self._timeout = timeout

    def _url_and_headers(self, req: Request, base: str | None, token: str | None) -> tuple[str, dict[str, str]]:
        """A call's URL, and its headers: the trainer token for the server,
        ``token`` for another ``base`` (a gateway)."""
        url = (base or self.server).rstrip("/") + req.path
        return url, headers(token if base else self._token)


def verify(ca_file: str | os.PathLike[str] | None) -> ssl.SSLContext | bool:
    """How ``https://`` servers (and gateways) are verified: against
    ``ca_file`` (a PEM bundle; default the environment's
    ``POLAR_ROLLOUT_CA_FILE``, as `polar submit` reads it, e.g. the cluster
    CA of a Slurm job), else the system's roots."""
    path = ca_file if ca_file is not None else (os.environ.get(CA_FILE_ENV, "").strip() or None)
    if path is None:
        return True
    try:
        return ssl.create_default_context(cafile=os.fspath(path))
    except (OSError, ssl.SSLError) as e:
        raise PolarError(f"{CA_FILE_ENV} / ca_file {path}: {e}") from e


def token_or_env(token: str | None, env: str) -> str | None:
    """``token``, else the environment's ``env``, else ``None``."""
    if token is not None:
        return token
    value = os.environ.get(env, "").strip()
    return value or None


def headers(token: str | None) -> dict[str, str]:
    out = {"accept": "application/json"}
    if token is not None:
        out["authorization"] = f"Bearer {token}"
    return out


def task_path(task_id: str, *rest: str) -> str:
    """``/v1/tasks/{id}/...`` with the id percent-encoded."""
    return "/".join(["/v1/tasks", quote(task_id, safe="")] + list(rest))


def submission(task: Mapping[str, Any]) -> dict[str, Any]:
    """A task request body, with ``version`` 1 unless it names one."""
    if "task_id" not in task:
        raise PolarError("a task needs a task_id")
    body = dict(task)
    body.setdefault("version", API_VERSION)
    return body


def decode(url: str, reply: httpx.Response) -> Any:
    """The JSON of a successful reply; an [`ApiError`] subclass otherwise."""
    if reply.is_success:
        try:
            return reply.json()
        except ValueError as e:
            raise ServerUnavailable(url, f"reply is not JSON: {e}") from e
    raise from_reply(reply.status_code, reply.content)


def transport_error(url: str, e: httpx.HTTPError) -> ServerUnavailable:
    return ServerUnavailable(url, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def event_of(sse_event: str, data: str, sse_id: str) -> Event | None:
    """The rollout event of one SSE frame; ``None`` for frames that are not
    one (``lagged`` notices are returned with type ``lagged``)."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    if sse_event == "lagged":
        last = int(sse_id) if sse_id.isdigit() else 0
        return Event(id=last, type="lagged", data=value)
    if "type" not in value or "id" not in value:
        return None
    return Event(id=int(value["id"]), type=str(value["type"]), data=value)


def resume_body(policy_version: str | None) -> dict[str, str]:
    if policy_version is None:
        return {}
    if not 1 <= len(policy_version.encode()) <= 256:
        raise PolarError("policy_version: must be 1 to 256 bytes")
    return {"policy_version": policy_version}


def event_params(task_id: str | None, after: int | None) -> dict[str, str]:
    return {k: str(v) for k, v in (("task_id", task_id), ("after", after)) if v is not None}




def retryable(e: PolarError) -> bool:
    """A broken stream or a restarting server: worth reconnecting."""
    from .errors import StorageUnavailable

    return isinstance(e, (ServerUnavailable, StorageUnavailable))


class Follow:
    """The state of a wait for a task (sync and asyncio alike): the task's
    last view. Each (re)connection is followed by a fresh look, and events
    only call for more looks, so a reconnection needs no event id (ids
    start again from 1 when the server restarts)."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.last: Task | None = None

    def seen(self, task: Task) -> bool:
        """Records a view; whether the task is finished."""
        self.last = task
        return task.finished

    def task(self) -> Task:
        assert self.last is not None
        return self.last

    @staticmethod
    def needs_look(ev: Event) -> bool:
        """Whether ``ev`` calls for a fresh view: the task finished, or
        events were missed."""
        return ev.type == "lagged" or (ev.type == "task" and ev.data.get("status") in FINISHED)

    def timed_out(self, seconds: float) -> TaskTimeout:
        return TaskTimeout(self.task_id, seconds, None if self.last is None else dict(self.last.raw))


def need_gateway_token(token: str | None) -> None:
    if token is None:
        raise PolarError(
            "pausing or resuming generation needs the gateway token "
            "(gateway_token=..., or POLAR_GATEWAY_TOKEN)"
        )


def node_urls(explicit: list[str] | None, listed: list[Node] | None) -> list[tuple[str, str]]:
    """``(name, base URL)`` of the gateways to pause or resume: the URLs
    given, else every node the server lists that is not unhealthy."""
    if explicit is not None:
        return [(u, u) for u in explicit]
    return [(n.node_id, n.address) for n in listed or [] if n.health != "unhealthy"]
