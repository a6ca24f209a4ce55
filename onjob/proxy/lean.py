"""A lean HTTP/1.1 client to the engine: keep-alive connections, responses parsed by
httptools (uvicorn's parser), nothing else.

The proxy sends one kind of request (a POST of JSON bytes, or a GET) to a few known
engines and relays what comes back, so most of what a general client does per request
(cookie jars, header multidicts, payload registries, tracing hooks, redirects) is cost
without use. This one writes the request in one `write()` and hands the body on as it
arrives; its A/B against aiohttp's client is in docs/benchmarks.md ("One engine
client"). It follows no redirects and decompresses nothing (the engines' routes do not
redirect), and reads no proxy settings from the environment.

Errors are the proxy's (`errors.py`): no connection, or it
dropped before the answer began -> `HungUp`; no connection or no byte within
the timeouts, or a whole answer not complete within `answer_timeout` of its request ->
`UpstreamTimeout`; dropped in the middle of a body, a body that is not HTTP, or bytes
after the complete answer -> `StreamCut`; a body past `max_answer_bytes` ->
`AnswerTooLarge`. A pooled connection that the engine closed while it sat idle is
replaced once, before anything was read from it (the request is sent again on a new one).

It refuses what h11 refuses: one request has one answer, so anything the engine sends
after the answer is complete (a second response in the same packet, say) is never read
as part of any body; the connection is closed and the request fails, as a stream that
ends in the middle does. A slow drip (a byte inside every `read_timeout`) cannot hold a
whole answer open past `answer_timeout`, and no body grows past `max_answer_bytes` in
memory (a Content-Length past it is refused before a byte of the body is read).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import httptools

from .errors import (
    AnswerTooLarge,
    HungUp,
    NotConnected,
    StreamCut,
    UpstreamTimeout,
    UpstreamUnreachable,
)

_PAUSE_AT = 1 << 20  # body bytes held unread before the engine's socket stops being read


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one response at a time."""

    def __init__(self, upstream: LeanUpstream) -> None:
        self._upstream = upstream
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self._parser = httptools.HttpResponseParser(self)
        self.headers_done: asyncio.Future | None = None  # None: idle, no answer expected
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = ""
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.total = 0  # body bytes of this answer so far
        self.complete = False
        self.keep_alive = False
        self.error: Exception | None = None
        self.received = False
        self._delimited = False  # a Content-Length or chunked: the end is not the EOF
        self._interim = False  # reading a 1xx response, which precedes the answer
        self._wake: asyncio.Future | None = None
        self._paused = False

    # -- asyncio.Protocol ----------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.headers_done is None:  # nothing asked: the connection cannot be trusted
            self.closed = True
            self.transport.close()
            return
        if self.error is not None:  # refused already: nothing more of it is read
            return
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(StreamCut(f"the engine's answer is not HTTP: {exc!r}"), close=True)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._upstream._forget(self)
        if self.headers_done is None or self.complete:
            return
        if not self.headers_done.done():
            why = f"the engine closed the connection before answering ({exc!r})"
            self._fail(HungUp(f"cannot reach the engine: {why}"))
        elif not self._delimited and self.error is None:
            self.on_message_complete()  # a body that ends with the connection
        else:
            self._fail(StreamCut(f"the engine cut the answer short: {exc!r}"))

    # -- httptools callbacks -------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:  # a second answer to one request: the connection is out of step
            self._fail(
                StreamCut(
                    "the engine sent bytes after its complete answer (one request, one answer)"
                ),
                close=True,
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value.decode("latin-1")
        elif name == b"content-length":
            self._delimited = True
            most = self._upstream.max_answer_bytes
            if value.strip().isdigit() and int(value) > most:
                self._too_large(f"its Content-Length is {int(value)}")
        elif name == b"transfer-encoding":
            self._delimited = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if 100 <= self.status < 200:  # informational (100 Continue): the answer follows
            self._interim = True
            return
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.error is not None:  # the rest of a packet already refused
            return
        self.total += len(body)
        if self.total > self._upstream.max_answer_bytes:
            self._too_large(f"{self.total} bytes and counting")
            return
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _PAUSE_AT and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._notify()

    def on_message_complete(self) -> None:
        if self.error is not None:
            return
        if self._interim:  # as h11 reads it: not the answer, which comes next
            self._interim = False
            self.content_type, self._delimited = "", False
            return
        self.complete = True
        # Asked here: once this callback returns the parser has moved on to the next message.
        self.keep_alive = self._parser.should_keep_alive() and not self.closed
        self._notify()

    # -- the response's side -------------------------------------------------------

    def _fail(self, error: Exception, close: bool = False) -> None:
        if self.error is None:
            self.error = error
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_exception(self.error)
        self._notify()
        if close and not self.closed:
            self.closed = True
            self.transport.close()

    def time_out(self) -> None:
        self._fail(UpstreamTimeout("the engine did not answer in time"), close=True)

    def out_of_time(self) -> None:
        seconds = self._upstream.answer_timeout
        why = f"the engine did not complete its answer within {seconds:g} s (answer_timeout_s)"
        self._fail(UpstreamTimeout(why), close=True)

    def _too_large(self, what: str) -> None:
        most = self._upstream.max_answer_bytes
        why = f"the engine's answer is larger than {most} bytes ({what}; max_answer_bytes)"
        self._fail(AnswerTooLarge(why), close=True)

    def _notify(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def next_body(self, timeout: float, deadline: float | None = None) -> bytes | None:
        """What arrived of the body since the last call (waiting for some); None at the end.
        `deadline` (the loop's time): the whole answer's end, when sooner than `timeout`.
        One timer per wait either way, and none for an answer already in (the usual whole
        answer): the deadline adds no timer of its own to the hot path (client CPU per
        request 24.9-29.1 µs with it, 26.7-29.6 before; 4 fresh processes each, c32)."""
        while not self.body:
            if self.error is not None:  # before `complete`: what followed the end is an error
                raise self.error
            if self.complete:
                return None
            loop = asyncio.get_running_loop()
            self._wake = loop.create_future()
            if deadline is not None and deadline - loop.time() < timeout:
                timer = loop.call_at(deadline, self.out_of_time)
            else:
                timer = loop.call_later(timeout, self.time_out)  # the longest silence allowed
            try:
                await self._wake
            finally:
                timer.cancel()
                self._wake = None
        data = self.body.popleft() if len(self.body) == 1 else b"".join(self.body)
        self.body.clear()
        self.buffered = 0
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        return data


class LeanResponse:
    """Implements `upstream.UpstreamResponse`: the connection goes back to the pool once
    the body is read to its end, and is closed when the answer is dropped before."""

    def __init__(self, conn: _Connection, upstream: LeanUpstream, sent: float) -> None:
        self._conn: _Connection | None = conn
        self._upstream = upstream
        self._sent = sent  # the loop's time the request was written
        self.status = conn.status
        self.content_type = conn.content_type

    async def read(self) -> bytes:
        """The whole answer, complete within `answer_timeout` of the request."""
        parts = []
        conn = self._conn
        if conn is None:
            return b""
        timeout, deadline = self._upstream.read_timeout, self._sent + self._upstream.answer_timeout
        try:
            while (data := await conn.next_body(timeout, deadline)) is not None:
                parts.append(data)
        finally:
            await self.aclose()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        timeout = self._upstream.read_timeout
        while (data := await conn.next_body(timeout)) is not None:
            yield data
        await self.aclose()

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._upstream._give_back(conn)


class LeanUpstream:
    """Implements `upstream.Upstream` over keep-alive connections to one engine (at most
    `max_connections`; a request waits for one past that)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 600.0,
        answer_timeout: float = 900.0,
        max_answer_bytes: int = 256 << 20,
        max_connections: int = 1024,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if self._ssl else 80)
        self._prefix = parts.path
        host = parts.netloc.rsplit("@", 1)[-1]
        self._head = f"Host: {host}\r\nAccept: */*\r\nUser-Agent: onjob\r\n".encode("latin-1")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.answer_timeout = answer_timeout  # a whole answer, from its request to its end
        self.max_answer_bytes = max_answer_bytes  # a body, whole or streamed
        self._max = max_connections
        self._open = 0  # connections open or opening
        self._idle: list[_Connection] = []
        self._waiting: deque[asyncio.Future] = deque()
        self._all: set[_Connection] = set()

    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping | None = None
    ) -> LeanResponse:
        message = self._message(method, path, body, headers)
        loop = asyncio.get_running_loop()
        while True:
            conn = await self._connection()
            conn._reset()
            conn.headers_done = loop.create_future()
            conn.transport.write(message)
            sent = loop.time()
            timer = loop.call_later(self.read_timeout, conn.time_out)
            try:
                await conn.headers_done
            except UpstreamUnreachable:
                self._drop(conn)
                if conn.reused and not conn.received:
                    continue  # the engine closed it while it sat idle: once more, on a new one
                raise
            except BaseException:  # timed out, or this request was cancelled
                self._drop(conn)
                raise
            finally:
                timer.cancel()
            return LeanResponse(conn, self, sent)

    def _message(self, method: str, path: str, body: bytes | None, headers) -> bytes:
        head = f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode("latin-1") + self._head
        if headers is None:
            head += b"Content-Type: application/json\r\n"
        else:
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        if body is None:
            return head + b"\r\n"
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body

    async def _connection(self) -> _Connection:
        while True:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    conn.reused = True
                    return conn
            if self._open < self._max:
                break
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter  # a connection came back or closed
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
        self._open += 1
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self), self._host, self._port, ssl=self._ssl
                ),
                self.connect_timeout,
            )
        except BaseException as exc:
            self._open -= 1
            self._wake_one()
            if isinstance(exc, TimeoutError):
                raise UpstreamTimeout("the engine did not answer in time") from None
            if isinstance(exc, OSError):
                raise NotConnected(f"cannot reach the engine: {exc!r}") from exc
            raise
        self._all.add(conn)
        return conn

    def _give_back(self, conn: _Connection) -> None:
        """After an answer: pooled when it was read to its end and the engine keeps the
        connection alive, else closed."""
        conn.headers_done = None
        if not (conn.complete and conn.keep_alive and conn.error is None and not conn.closed):
            self._drop(conn)
        else:
            self._idle.append(conn)
            self._wake_one()

    def _drop(self, conn: _Connection) -> None:
        conn.headers_done = None
        if not conn.closed:
            conn.closed = True
            conn.transport.close()

    def _forget(self, conn: _Connection) -> None:
        """A connection closed (either side)."""
        if conn in self._all:
            self._all.discard(conn)
            self._open -= 1
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        for conn in list(self._all):
            self._drop(conn)
        self._idle.clear()
