"""The synchronous client of a rollout server (``polar rollout serve``):
tasks, events, waiting, and pausing generation on the gateway nodes around
a weight update. [`AsyncClient`] (``aio.py``) is the same API for asyncio.

Every method raises a [`PolarError`](errors.py) subclass: [`ServerUnavailable`]
when nothing answered, an [`ApiError`] subclass (by HTTP status) carrying the
server's ``code``, ``field`` and ``message`` otherwise."""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import httpx

from . import _wire, outcome
from .errors import PolarError
from .events import EventStream
from .outcome import Failures
from .types import Event, Node, Resumed, Submitted, Task

#: How long one HTTP call may take.
DEFAULT_TIMEOUT = 30.0


class Client(_wire.Settings):
    """A rollout server's trainer API.

    ``token`` is a trainer token (``rollout.tokens``; default the
    environment's ``POLAR_ROLLOUT_TOKEN``). ``gateway_token`` is the token
    gateways accept (``rollout.gateway_token``; default
    ``POLAR_GATEWAY_TOKEN``): only [`pause`] and [`resume`] need it, since
    they talk to the nodes themselves. ``ca_file`` is the PEM bundle
    ``https://`` servers and gateways are verified against (default the
    environment's ``POLAR_ROLLOUT_CA_FILE``, else the system's roots)."""

    def __init__(
        self,
        server: str,
        token: str | None = None,
        *,
        gateway_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        ca_file: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(server, token, gateway_token, timeout)
        self._http = httpx.Client(timeout=timeout, verify=_wire.verify(ca_file))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, req: _wire.Request, base: str | None = None, token: str | None = None) -> Any:
        url, headers = self._url_and_headers(req, base, token)
        try:
            reply = self._http.request(req.method, url, json=req.body, params=req.params, headers=headers)
        except httpx.HTTPError as e:
            raise _wire.transport_error(url, e) from e
        return _wire.decode(url, reply)

    # Tasks.

    def submit(self, task: Mapping[str, Any]) -> Submitted:
        """``POST /v1/tasks``: ``task`` is the request body
        (docs/ROLLOUT-API.md); ``version`` defaults to 1."""
        return Submitted.of(self._call(_wire.Request("POST", "/v1/tasks", _wire.submission(task))))

    def task(self, task_id: str) -> Task:
        """``GET /v1/tasks/{id}``: status and every sample."""
        return Task.of(self._call(_wire.Request("GET", _wire.task_path(task_id))))

    def tasks(self, status: str | None = None, limit: int | None = None) -> list[Task]:
        """``GET /v1/tasks``: the most recent tasks, without samples."""
        params = {k: str(v) for k, v in (("status", status), ("limit", limit)) if v is not None}
        body = self._call(_wire.Request("GET", "/v1/tasks", params=params))
        return [Task.of(t) for t in body["tasks"]]

    def cancel(self, task_id: str) -> Task:
        """``POST /v1/tasks/{id}/cancel``."""
        return Task.of(self._call(_wire.Request("POST", _wire.task_path(task_id, "cancel"), {})))

    def delete(self, task_id: str) -> None:
        """``DELETE /v1/tasks/{id}`` (a finished task)."""
        self._call(_wire.Request("DELETE", _wire.task_path(task_id)))

    def status(self) -> dict[str, Any]:
        """``GET /v1/status``."""
        body: dict[str, Any] = self._call(_wire.Request("GET", "/v1/status"))
        return body

    def nodes(self) -> list[Node]:
        """``GET /v1/nodes``."""
        return [Node.of(n) for n in self._call(_wire.Request("GET", "/v1/nodes"))["nodes"]]

    # Events.

    def events(self, task_id: str | None = None, after: int | None = None) -> EventStream:
        """``GET /v1/events``, connected now: iterate it for [`Event`]s,
        one per state change, until the server ends the stream; close it
        (or use ``with``). ``task_id`` keeps one task's events; ``after``
        starts after that event id. ``lagged`` notices come through with
        ``type == "lagged"``."""
        return EventStream(
            self._http,
            self.server + "/v1/events",
            _wire.event_params(task_id, after),
            _wire.headers(self._token),
            self._timeout,
        )

    def wait(self, task_id: str, timeout: float = 3600.0, *, failures: Failures = "raise") -> Task:
        """Follows the task's events until it finishes and returns it with
        its samples. Reconnects (and looks again) when the stream breaks or
        the server restarts; raises [`TaskTimeout`] after ``timeout``
        seconds. A task that ended with no usable sample raises
        [`TaskFailed`] (``failures="warn"``: warns [`UnusableSamples`]
        instead); one with fewer than requested warns (``"ignore"``:
        neither)."""
        outcome.validate(failures)
        deadline = time.monotonic() + timeout
        follow = _wire.Follow(task_id)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise follow.timed_out(timeout)
            try:
                # Connected before the first look, so no change falls between.
                with self.events(task_id=task_id) as stream:
                    # The stream is closed at the deadline, which ends a read
                    # that pings would otherwise keep alive.
                    timer = threading.Timer(remaining, stream.close)
                    timer.start()
                    try:
                        if follow.seen(self.task(task_id)):
                            return outcome.check(follow.task(), failures)
                        for ev in stream:
                            if follow.needs_look(ev) and follow.seen(self.task(task_id)):
                                return outcome.check(follow.task(), failures)
                    finally:
                        timer.cancel()
            except PolarError as e:
                if not _wire.retryable(e):
                    raise
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    # Generation around a weight update.

    def _node_urls(self, nodes: list[str] | None) -> list[tuple[str, str]]:
        _wire.need_gateway_token(self._gateway_token)
        return _wire.node_urls(nodes, None if nodes is not None else self.nodes())

    def pause(self, nodes: list[str] | None = None) -> list[str]:
        """``POST /v1/pause`` on every healthy gateway the server lists (or
        on the gateway URLs ``nodes``): prepared sessions wait in READY and
        new model calls wait; calls in flight finish. Returns the nodes
        paused; when one cannot be paused, those already paused are resumed
        and the error is raised."""
        done: list[tuple[str, str]] = []
        try:
            for node_id, url in self._node_urls(nodes):
                self._call(_wire.Request("POST", "/v1/pause", {}), base=url, token=self._gateway_token)
                done.append((node_id, url))
        except PolarError:
            # All or none: the nodes already paused go on generating.
            for _, url in done:
                try:
                    self._call(_wire.Request("POST", "/v1/resume", {}), base=url, token=self._gateway_token)
                except PolarError:
                    pass
            raise
        return [node_id for node_id, _ in done]

    def resume(self, policy_version: str | None = None, nodes: list[str] | None = None) -> list[Resumed]:
        """``POST /v1/resume`` on the same gateways; a ``policy_version``
        (the new weights') is stamped on every later call of every session
        there, and exported per token span."""
        body = _wire.resume_body(policy_version)
        out = []
        for node_id, url in self._node_urls(nodes):
            reply = self._call(_wire.Request("POST", "/v1/resume", body), base=url, token=self._gateway_token)
            out.append(Resumed(node_id, reply.get("policy_version")))
        return out

    @contextmanager
    def paused(self, policy_version: str | None = None) -> Iterator[None]:
        """Pauses generation for the block (the weight update), then
        resumes naming ``policy_version``. Resumes without a version if the
        block raised."""
        self.pause()
        try:
            yield
        except BaseException:
            self.resume()
            raise
        self.resume(policy_version)


