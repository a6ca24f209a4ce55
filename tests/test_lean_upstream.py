"""The lean HTTP/1.1 client to the engine (`proxy/lean.py`) against raw sockets: it keeps
connections alive, replaces one the engine closed while idle, reads every way a body can
end, and turns each fault into the proxy's error (the proxy's own fault tests run it too)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from onjob.proxy.errors import (
    AnswerTooLarge,
    EngineUnavailable,
    HungUp,
    StreamCut,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from onjob.proxy.lean import LeanUpstream
from onjob.proxy.pool import Pool, Replica

ANSWER = b'{"ok":true}'


class Server:
    """Accepts connections; `answer(conn, n)` answers the n-th request (0-based) of the
    server's life, and returns False to close the connection after it."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.accepted = 0
        self.requests = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                buffer = buffer[length:]
                n, self.requests = self.requests, self.requests + 1
                if self.answer(conn, n) is False:
                    return

    def close(self) -> None:
        self.sock.close()


def whole(conn, n):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
    conn.sendall(b"Content-Length: %d\r\n\r\n" % len(ANSWER) + ANSWER)


def run(server: Server, *steps, **kwargs):
    async def go():
        upstream = LeanUpstream(server.url, **kwargs)
        try:
            return [await step(upstream) for step in steps]
        finally:
            await upstream.aclose()

    try:
        return asyncio.run(go())
    finally:
        server.close()


async def post(upstream: LeanUpstream) -> tuple[int, str, bytes]:
    resp = await upstream.request("POST", "/chat/completions", b"{}")
    return resp.status, resp.content_type, await resp.read()


def test_connections_are_kept_alive():
    server = Server(whole)
    answers = run(server, *[post] * 20)
    assert answers == [(200, "application/json", ANSWER)] * 20
    assert server.accepted == 1


def test_a_connection_the_engine_closed_while_idle_is_replaced():
    # The engine answers as if it kept the connection, then closes it (its keep-alive
    # timeout): the next request is sent again on a new connection.
    server = Server(lambda conn, n: whole(conn, n) or False)

    async def later(upstream):
        await asyncio.sleep(0.1)  # the close has arrived
        return await post(upstream)

    async def at_once(upstream):  # before the close is seen: written into a dying socket
        return await post(upstream)

    answers = run(server, post, later, at_once)
    assert [a[2] for a in answers] == [ANSWER] * 3
    assert server.requests == 3


def test_bodies_that_end_with_the_connection_or_in_chunks():
    def answer(conn, n):
        if n == 0:  # no length: the body ends with the connection
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil ")
            conn.sendall(b"the end")
            return False
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in (b"data: a\n\n", b"data: b\n\n"):
            conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        conn.sendall(b"0\r\n\r\n")

    async def streamed(upstream):
        resp = await upstream.request("POST", "/chat/completions", b"{}")
        parts = [part async for part in resp.chunks()]
        await resp.aclose()
        return b"".join(parts)

    server = Server(answer)
    assert run(server, post, streamed) == [
        (200, "text/plain", b"until the end"),
        b"data: a\n\ndata: b\n\n",
    ]


@pytest.mark.parametrize(
    ("answer", "error", "words"),
    [
        (lambda conn, n: False, HungUp, "before answering"),
        (lambda conn, n: conn.sendall(b"garbage\r\n\r\n") or False, StreamCut, "not HTTP"),
        (
            lambda conn, n: (
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf") or False
            ),
            StreamCut,
            "cut",
        ),
        (lambda conn, n: threading.Event().wait(2), UpstreamTimeout, "in time"),
    ],
    ids=["closed", "garbage", "cut", "silent"],
)
def test_faults_are_the_proxys_errors(answer, error, words):
    with pytest.raises(error, match=words):
        run(Server(answer), post, read_timeout=0.3)


def test_an_engine_that_hangs_up_before_answering_is_a_503_to_retry_not_a_bad_gateway():
    # A killed engine's listening socket may still accept while the process is torn down,
    # then reset what it accepted: a checked pool tells the client to come back, as it
    # does when the connection is refused, and checks the engine now.
    server = Server(lambda conn, n: False)

    async def go():
        replica = Replica(server.url, LeanUpstream(server.url), control=httpx.AsyncClient())
        pool = Pool([replica])
        try:
            await pool.send("/chat/completions", b"{}", "m", whole=True)
        except EngineUnavailable as exc:
            return exc, str(replica.state)
        finally:
            await pool.aclose()
            server.close()
        raise AssertionError("answered")

    exc, state = asyncio.run(go())
    assert (exc.status, exc.retry_after_s, state) == (503, 2, "down")
    assert "No engine answers" in exc.message and "before answering" in exc.message


def test_no_engine_is_unreachable():
    sock = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    sock.close()

    async def go():
        upstream = LeanUpstream(url)
        try:
            await post(upstream)
        finally:
            await upstream.aclose()

    with pytest.raises(UpstreamUnreachable, match="cannot reach"):
        asyncio.run(go())


def test_requests_past_max_connections_wait_for_one():
    server = Server(whole)

    async def many(upstream):
        return await asyncio.gather(*(post(upstream) for _ in range(10)))

    (answers,) = run(server, many, max_connections=2)
    assert [a[2] for a in answers] == [ANSWER] * 10
    assert server.accepted <= 2


# -- What h11 refuses (issue 34): bytes past the answer, a drip, a body too large --------


def test_a_second_response_after_a_complete_one_is_refused_not_appended():
    # Two answers to one request in one packet: the connection is out of step with its
    # requests. The first answer is not returned with the second's bytes on its end, the
    # request fails, and the next request gets a connection of its own.
    second = b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nsmuggle"

    def answer(conn, n):
        if n == 0:
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(ANSWER) + ANSWER + second)
        else:
            whole(conn, n)

    async def refused(upstream):
        with pytest.raises(StreamCut, match="after its complete answer") as caught:
            await post(upstream)
        return caught.value.status

    server = Server(answer)
    assert run(server, refused, post) == [502, (200, "application/json", ANSWER)]
    assert server.accepted == 2  # the out-of-step connection was not used again


def test_an_informational_response_before_the_answer_is_not_the_answer():
    def answer(conn, n):  # 100 Continue, as h11 reads it: the answer follows
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        whole(conn, n)

    server = Server(answer)
    assert run(server, post, post) == [(200, "application/json", ANSWER)] * 2
    assert server.accepted == 1


def test_a_second_response_while_a_stream_is_read_is_refused():
    def answer(conn, n):
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        conn.sendall(b"9\r\ndata: a\n\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nX")

    async def streamed(upstream):
        resp = await upstream.request("POST", "/chat/completions", b"{}")
        parts = []
        with pytest.raises(StreamCut, match="after its complete answer"):
            async for part in resp.chunks():
                parts.append(part)
        await resp.aclose()
        return b"".join(parts)

    assert run(Server(answer), streamed) == [b"data: a\n\n"]  # nothing of the second


def test_a_whole_answer_dripped_slowly_times_out_at_the_answer_deadline():
    # A byte every 0.1 s never trips the 0.3 s silence timeout; the whole answer's deadline
    # (0.6 s from the request) ends it.
    def answer(conn, n):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):
            time.sleep(0.1)
            try:
                conn.sendall(b"x")
            except OSError:
                return False
        return False

    async def timed(upstream):
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout, match=r"within 0\.6 s") as caught:
            await post(upstream)
        return caught.value.status, time.monotonic() - started

    ((status, took),) = run(Server(answer), timed, read_timeout=0.3, answer_timeout=0.6)
    assert status == 504 and 0.5 < took < 3


def test_a_stream_is_not_bound_by_the_whole_answer_deadline():
    def answer(conn, n):
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(6):
            time.sleep(0.1)
            conn.sendall(b"1\r\nx\r\n")
        conn.sendall(b"0\r\n\r\n")

    async def streamed(upstream):
        resp = await upstream.request("POST", "/chat/completions", b"{}")
        parts = [part async for part in resp.chunks()]
        await resp.aclose()
        return b"".join(parts)

    assert run(Server(answer), streamed, read_timeout=0.5, answer_timeout=0.3) == [b"x" * 6]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_past_max_answer_bytes_is_refused(framing):
    size = 1 << 20

    def answer(conn, n):
        try:
            if framing == "content-length":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
                conn.sendall(b"x" * size)
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for _ in range(size // 4096):
                    conn.sendall(b"1000\r\n" + b"x" * 4096 + b"\r\n")
                conn.sendall(b"0\r\n\r\n")
        except OSError:  # the client closed the connection on it
            pass
        return False

    async def refused(upstream):
        with pytest.raises(AnswerTooLarge, match="larger than 65536 bytes") as caught:
            await post(upstream)
        return caught.value.status

    assert run(Server(answer), refused, max_answer_bytes=65536) == [502]


def test_an_answer_within_max_answer_bytes_is_whole():
    assert run(Server(whole), post, max_answer_bytes=len(ANSWER)) == [
        (200, "application/json", ANSWER)
    ]
