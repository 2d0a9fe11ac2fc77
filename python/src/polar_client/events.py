"""``GET /v1/events`` streams, sync and asyncio: connected when made (so a
caller can look at a task after connecting and miss no change), iterated
for [`Event`]s, closed by ``close`` or a ``with`` block. The SSE framing is
httpx-sse's."""

from __future__ import annotations

from contextlib import AsyncExitStack, ExitStack
from typing import AsyncIterator, Iterator, Mapping

import httpx
from httpx_sse import SSEError, aconnect_sse, connect_sse

from . import _wire
from .types import Event

#: The longest a read of the stream blocks (the server pings every 15 s).
STREAM_READ = 20.0


def _timeout(connect: float) -> httpx.Timeout:
    return httpx.Timeout(connect, read=STREAM_READ)


class EventStream:
    """A connected event stream (sync)."""

    def __init__(
        self, http: httpx.Client, url: str, params: Mapping[str, str], headers: Mapping[str, str], connect: float
    ) -> None:
        self._url = url
        self._closed = False
        self._stack = ExitStack()
        try:
            source = self._stack.enter_context(
                connect_sse(http, "GET", url, params=params, headers=dict(headers), timeout=_timeout(connect))
            )
            if not source.response.is_success:
                source.response.read()
                _wire.decode(url, source.response)
            self._frames = source.iter_sse()
        except httpx.HTTPError as e:
            self._stack.close()
            raise _wire.transport_error(url, e) from e
        except BaseException:
            self._stack.close()
            raise

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        while True:
            try:
                sse = next(self._frames)
            except StopIteration:
                raise
            except Exception as e:
                if self._closed:
                    # Closed from another thread (a wait's deadline).
                    raise StopIteration from e
                if isinstance(e, (httpx.HTTPError, SSEError)):
                    raise _wire.transport_error(self._url, _as_http(e)) from e
                raise
            ev = _wire.event_of(sse.event, sse.data, sse.id)
            if ev is not None:
                return ev

    def close(self) -> None:
        """Ends the stream; a read in progress in another thread ends too."""
        self._closed = True
        self._stack.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEventStream:
    """A connected event stream (asyncio); made by [`AsyncEventStream.open`]."""

    def __init__(self, url: str, stack: AsyncExitStack, frames: AsyncIterator[object]) -> None:
        self._url = url
        self._stack = stack
        self._frames = frames

    @classmethod
    async def open(
        cls, http: httpx.AsyncClient, url: str, params: Mapping[str, str], headers: Mapping[str, str], connect: float
    ) -> AsyncEventStream:
        stack = AsyncExitStack()
        try:
            source = await stack.enter_async_context(
                aconnect_sse(http, "GET", url, params=params, headers=dict(headers), timeout=_timeout(connect))
            )
            if not source.response.is_success:
                await source.response.aread()
                _wire.decode(url, source.response)
            return cls(url, stack, source.aiter_sse())
        except httpx.HTTPError as e:
            await stack.aclose()
            raise _wire.transport_error(url, e) from e
        except BaseException:
            await stack.aclose()
            raise

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> Event:
        from httpx_sse import ServerSentEvent

        while True:
            try:
                sse = await self._frames.__anext__()
            except (httpx.HTTPError, SSEError) as e:
                raise _wire.transport_error(self._url, _as_http(e)) from e
            assert isinstance(sse, ServerSentEvent)
            ev = _wire.event_of(sse.event, sse.data, sse.id)
            if ev is not None:
                return ev

    async def aclose(self) -> None:
        await self._stack.aclose()

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _as_http(e: Exception) -> httpx.HTTPError:
    return e if isinstance(e, httpx.HTTPError) else httpx.TransportError(str(e))
