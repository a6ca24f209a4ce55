"""The hot routes served as bare ASGI, in front of Litestar.

Litestar's machinery per request (its exception middleware, router, signature model,
response objects, an anyio task group per stream) costs as much CPU as uvicorn and the
aiohttp client together: a bare relay on Litestar spends ~237 µs per request on these
machines, the same relay as a bare ASGI app on uvicorn ~118 (`bench/proxy/proxy_overhead.py`
and its `litestar` peer). So `ProxyApp` takes `POST` to the few paths that carry the
traffic (chat, legacy completions, the Responses API) as uvicorn hands them over, calls
the same handler functions Litestar routes to, and sends what they return. Everything
else (other methods, other paths, a path with a trailing slash) goes through Litestar as
before, and what these routes answer does not change: the body limit (413), errors in
OpenAI's shape through the app's own exception handlers, a stream stopped (and its
exchange logged as 499) when the client hangs up; and the same door (`auth.Doors.api`,
which Litestar's routes take as a guard) before the handler runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from inspect import getmro
from typing import Any, NamedTuple

import msgspec
from litestar import Litestar, Response
from litestar.exceptions import ClientException, InternalServerException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.response import Stream
from litestar.types import Receive, Scope, Send

from .auth import SCOPE_KEY, Doors

Handler = Callable[[Any], Awaitable[Response | Stream]]


class Last(bytes):
    """A stream's last bytes: sent with the response's end, in one write (the chunked
    body's terminator beside them) instead of two."""


class Headers:
    """The request's headers as the handlers read them: `get` by any case of the name (the
    first of repeated ones, as Litestar's), decoded only when asked."""

    __slots__ = ("_by_name", "_raw")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw  # names lower-case, as ASGI servers hand them over
        self._by_name: dict[bytes, bytes] | None = None

    def get(self, name: str, default: str | None = None) -> str | None:
        # A request's ~6 lookups (the door's, the handler's) against one dict made at the
        # first: ~0.2 µs each, where a scan of the openai client's 15 headers took ~2.
        by_name = self._by_name
        if by_name is None:
            by_name = self._by_name = dict(reversed(self._raw))  # the first of repeated ones
        value = by_name.get(name.lower().encode("latin-1"))
        return default if value is None else value.decode("latin-1")

    def items(self) -> list[tuple[str, str]]:
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self._raw]


class URL(NamedTuple):
    path: str
    query: str


class BareRequest:
    """What the hot handlers use of a request (its headers, `await body()` with Litestar's
    limits and errors; and, to forward it to the primary, its method and URL)."""

    __slots__ = ("_body", "_limit", "_receive", "_scope", "headers")

    def __init__(self, scope: Scope, receive: Receive, limit: int) -> None:
        self._scope = scope
        self.headers = Headers(scope["headers"])
        self._receive = receive
        self._limit = limit
        self._body: bytes | None = None

    @property
    def scope(self) -> Scope:
        return self._scope

    @property
    def method(self) -> str:
        return self._scope["method"]

    @property
    def url(self) -> URL:
        return URL(self._scope["path"], self._scope.get("query_string", b"").decode("latin-1"))

    async def body(self) -> bytes:
        if self._body is None:
            self._body = await self._read()
        return self._body

    async def _read(self) -> bytes:
        announced = self.headers.get("content-length")
        if announced is not None:
            try:
                length = int(announced)
            except ValueError:
                raise ClientException(f"Invalid content-length: {announced!r}") from None
            if length > self._limit:
                raise RequestEntityTooLarge
        chunks: list[bytes] = []
        total = 0
        while True:
            event = await self._receive()
            if event["type"] == "http.request":
                body = event.get("body", b"")
                if body:
                    total += len(body)
                    if total > self._limit:
                        raise RequestEntityTooLarge
                    chunks.append(body)
                if not event.get("more_body", False):
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            elif event["type"] == "http.disconnect":
                raise InternalServerException("client disconnected prematurely")


class ProxyApp(Litestar):
    """Litestar, with `hot` (path -> handler function) answered before its router for
    `POST`, behind `doors`' check of the OpenAI routes. `handlers` are the app's exception
    handlers (by class, most specific first along the exception's MRO, as Litestar picks
    them)."""

    __slots__ = ("_doors", "_handlers", "_hot", "_limit")

    def __init__(
        self,
        *,
        hot: Mapping[str, Handler],
        doors: Doors,
        request_max_body_size: int,
        exception_handlers: Mapping[type[Exception], Callable],
        **kwargs: Any,
    ) -> None:
        super().__init__(
            request_max_body_size=request_max_body_size,
            exception_handlers=dict(exception_handlers),
            **kwargs,
        )
        self._hot = dict(hot)
        self._doors = doors
        self._limit = request_max_body_size
        self._handlers = dict(exception_handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # type: ignore[override]
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self._hot.get(scope["path"])
            if handler is not None:
                await self._serve(handler, scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _serve(self, handler: Handler, scope: Scope, receive: Receive, send: Send) -> None:
        request = BareRequest(scope, receive, self._limit)
        try:
            self._doors.same_site(request.headers, host=False)
            scope[SCOPE_KEY] = self._doors.api(request.headers)
            response = await handler(request)
        except Exception as exc:
            response = self._error(exc)
        if isinstance(response, Stream):
            await _stream(response, receive, send)
        else:
            await _whole(response, send)

    def _error(self, exc: Exception) -> Response:
        for cls in getmro(type(exc)):
            answer = self._handlers.get(cls)
            if answer is not None:
                return answer(None, exc)
        raise exc


def _head(response: Response, media_type: Any, charset: str | None = None) -> list:
    """The response's headers as Litestar encodes them: its own, then the content type
    (with a charset for text) unless given."""
    headers = [
        (k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in response.headers.items()
    ]
    if not any(k == b"content-type" for k, _ in headers):
        media_type = getattr(media_type, "value", media_type) or "application/json"
        if charset and media_type.startswith("text/"):
            media_type += f"; charset={charset}"
        headers.append((b"content-type", media_type.encode("latin-1")))
    return headers


async def _whole(response: Response, send: Send) -> None:
    content = response.content
    body = content if type(content) is bytes else msgspec.json.encode(content)
    headers = _head(response, response.media_type, response.encoding)
    headers.append((b"content-length", str(len(body)).encode()))
    status = response.status_code or 200
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _stream(response: Stream, receive: Receive, send: Send) -> None:
    """Relay the stream; a client that hangs up cancels it where it waits (the upstream
    read or a send), as Litestar's stream does, and the iterator is closed here."""
    headers = _head(response, response.media_type, response.encoding)
    status = response.status_code or 200
    await send({"type": "http.response.start", "status": status, "headers": headers})
    task = asyncio.current_task()
    state = {"done": False, "hung_up": False}

    def listen() -> asyncio.Future:
        waiting = asyncio.ensure_future(receive())
        waiting.add_done_callback(heard)
        return waiting

    def heard(waiting: asyncio.Future) -> None:
        nonlocal listening
        if waiting.cancelled() or waiting.exception() is not None or state["done"]:
            return
        if waiting.result()["type"] == "http.disconnect":
            state["hung_up"] = True
            task.cancel()
        else:
            listening = listen()

    listening = listen()
    iterator = response.iterator
    try:
        async for chunk in iterator:
            if type(chunk) is Last:
                state["done"] = True
                await send({"type": "http.response.body", "body": chunk, "more_body": False})
                break
            if type(chunk) is not bytes:
                chunk = chunk.encode(response.encoding)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        else:
            state["done"] = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not state["hung_up"]:
            raise
        task.uncancel()
    finally:
        state["done"] = True
        listening.cancel()
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
