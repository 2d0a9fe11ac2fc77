"""The asyncio client: [`Client`](client.py)'s API with ``async`` methods,
on ``httpx.AsyncClient``. It never blocks the event loop."""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Mapping

import httpx

from . import _wire, outcome
from .client import DEFAULT_TIMEOUT
from .errors import PolarError
from .events import AsyncEventStream
from .outcome import Failures
from .types import Node, Resumed, Submitted, Task


class AsyncClient(_wire.Settings):
    """A rollout server's trainer API, for asyncio. Same arguments and
    errors as [`Client`]."""

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
        self._http = httpx.AsyncClient(timeout=timeout, verify=_wire.verify(ca_file))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, req: _wire.Request, base: str | None = None, token: str | None = None) -> Any:
        url, headers = self._url_and_headers(req, base, token)
        try:
            reply = await self._http.request(req.method, url, json=req.body, params=req.params, headers=headers)
        except httpx.HTTPError as e:
            raise _wire.transport_error(url, e) from e
        return _wire.decode(url, reply)

    async def submit(self, task: Mapping[str, Any]) -> Submitted:
        """See [`Client.submit`]."""
        return Submitted.of(await self._call(_wire.Request("POST", "/v1/tasks", _wire.submission(task))))

    async def task(self, task_id: str) -> Task:
        """See [`Client.task`]."""
        return Task.of(await self._call(_wire.Request("GET", _wire.task_path(task_id))))

    async def tasks(self, status: str | None = None, limit: int | None = None) -> list[Task]:
        """See [`Client.tasks`]."""
        params = {k: str(v) for k, v in (("status", status), ("limit", limit)) if v is not None}
        body = await self._call(_wire.Request("GET", "/v1/tasks", params=params))
        return [Task.of(t) for t in body["tasks"]]

    async def cancel(self, task_id: str) -> Task:
        """See [`Client.cancel`]."""
        return Task.of(await self._call(_wire.Request("POST", _wire.task_path(task_id, "cancel"), {})))

    async def delete(self, task_id: str) -> None:
        """See [`Client.delete`]."""
        await self._call(_wire.Request("DELETE", _wire.task_path(task_id)))

    async def status(self) -> dict[str, Any]:
        """See [`Client.status`]."""
        body: dict[str, Any] = await self._call(_wire.Request("GET", "/v1/status"))
        return body

    async def nodes(self) -> list[Node]:
        """See [`Client.nodes`]."""
        return [Node.of(n) for n in (await self._call(_wire.Request("GET", "/v1/nodes")))["nodes"]]

    async def events(self, task_id: str | None = None, after: int | None = None) -> AsyncEventStream:
        """See [`Client.events`]: ``async for`` over the stream returned."""
        return await AsyncEventStream.open(
            self._http,
            self.server + "/v1/events",
            _wire.event_params(task_id, after),
            _wire.headers(self._token),
            self._timeout,
        )

    async def wait(self, task_id: str, timeout: float = 3600.0, *, failures: Failures = "raise") -> Task:
        """See [`Client.wait`]."""
        outcome.validate(failures)
        follow = _wire.Follow(task_id)
        try:
            task = await asyncio.wait_for(self._follow(follow), timeout)
        except asyncio.TimeoutError:
            raise follow.timed_out(timeout) from None
        return outcome.check(task, failures, stacklevel=2)

    async def _follow(self, follow: _wire.Follow) -> Task:
        while True:
            try:
                async with await self.events(task_id=follow.task_id) as stream:
                    if follow.seen(await self.task(follow.task_id)):
                        return follow.task()
                    async for ev in stream:
                        if follow.needs_look(ev) and follow.seen(await self.task(follow.task_id)):
                            return follow.task()
            except PolarError as e:
                if not _wire.retryable(e):
                    raise
            await asyncio.sleep(0.2)

    async def _node_urls(self, nodes: list[str] | None) -> list[tuple[str, str]]:
        _wire.need_gateway_token(self._gateway_token)
        return _wire.node_urls(nodes, None if nodes is not None else await self.nodes())

    async def pause(self, nodes: list[str] | None = None) -> list[str]:
        """See [`Client.pause`]."""
        done: list[tuple[str, str]] = []
        try:
            for node_id, url in await self._node_urls(nodes):
                await self._call(_wire.Request("POST", "/v1/pause", {}), base=url, token=self._gateway_token)
                done.append((node_id, url))
        except PolarError:
            # All or none: the nodes already paused go on generating.
            for _, url in done:
                try:
                    await self._call(_wire.Request("POST", "/v1/resume", {}), base=url, token=self._gateway_token)
                except PolarError:
                    pass
            raise
        return [node_id for node_id, _ in done]

    async def resume(self, policy_version: str | None = None, nodes: list[str] | None = None) -> list[Resumed]:
        """See [`Client.resume`]."""
        body = _wire.resume_body(policy_version)
        out = []
        for node_id, url in await self._node_urls(nodes):
            reply = await self._call(_wire.Request("POST", "/v1/resume", body), base=url, token=self._gateway_token)
            out.append(Resumed(node_id, reply.get("policy_version")))
        return out

    @asynccontextmanager
    async def paused(self, policy_version: str | None = None) -> AsyncIterator[None]:
        """See [`Client.paused`]."""
        await self.pause()
        try:
            yield
        except BaseException:
            await self.resume()
            raise
        await self.resume(policy_version)
