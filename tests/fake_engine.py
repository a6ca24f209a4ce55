"""Scripted engines for fault tests, at the HTTP boundary only.

`scripted(handler)` is an `HttpxUpstream` (the proxy's `Upstream` interface over any
`httpx.AsyncClient`, here a `MockTransport`); `RawEngine` is a real socket server that
answers `/health` and `/models` and then misbehaves on purpose (goes silent, cuts a
stream), for the lean client's own error paths.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator, Callable, Mapping

import httpx

from onjob.proxy.errors import StreamCut, UpstreamTimeout, UpstreamUnreachable

MODELS = {"object": "list", "data": [{"id": "fake", "object": "model", "parent": None}]}


def completion(
    content: str = "hello there", *, token_ids=(7, 8, 9), n: int = 1, model: str = "fake"
) -> dict:
    """A chat completion as the engine sends it with logprobs and return_token_ids on."""
    logprobs = {"content": [{"token": "t", "logprob": -0.5 * (i + 1)} for i in range(3)]}
    return {
        "id": "chatcmpl-engine",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": content},
                "logprobs": logprobs,
                "token_ids": list(token_ids),
                "finish_reason": "stop",
            }
            for i in range(n)
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3 * n, "total_tokens": 5 + 3 * n},
        "prompt_token_ids": [1, 2, 3, 4, 5],
    }


def chunk(content: str | None = None, *, finish: str | None = None, usage: dict | None = None):
    choices = []
    if usage is None:
        choices = [
            {
                "index": 0,
                "delta": {"content": content} if content is not None else {},
                # vLLM names every sampled token, the last one (EOS) too: "" when it has no text.
                "logprobs": {"content": [{"token": content or "", "logprob": -0.25}]},
                "token_ids": [42],
                "finish_reason": finish,
            }
        ]
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake"}
    body["choices"] = choices
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class _HttpxResponse:
    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self.status = resp.status_code
        self.content_type = resp.headers.get("Content-Type", "")

    async def read(self) -> bytes:
        try:
            return await self._resp.aread()
        except httpx.HTTPError as exc:
            raise _translate(exc, mid_body=True) from exc
        finally:
            await self._resp.aclose()

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise _translate(exc, mid_body=True) from exc

    async def aclose(self) -> None:
        await self._resp.aclose()


def _translate(exc: httpx.HTTPError, *, mid_body: bool) -> Exception:
    """httpx's errors as the proxy's, as the lean client raises them."""
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout("the engine did not answer in time")
    if mid_body and isinstance(exc, httpx.TransportError):
        return StreamCut(f"the engine cut the answer short: {exc!r}")
    if isinstance(exc, httpx.TransportError):
        return UpstreamUnreachable(f"cannot reach the engine: {exc!r}")
    return exc


class HttpxUpstream:
    """The proxy's `Upstream` over a caller's `httpx.AsyncClient` (its base_url is the
    engine's, e.g. .../v1): the tests' engines at the HTTP boundary."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.base_url = str(client.base_url).rstrip("/")

    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping | None = None
    ) -> _HttpxResponse:
        req = self.client.build_request(
            method,
            self.base_url + path,
            content=body,
            headers=headers or {"Content-Type": "application/json"},
        )
        try:
            resp = await self.client.send(req, stream=True)
        except httpx.HTTPError as exc:
            raise _translate(exc, mid_body=False) from exc
        return _HttpxResponse(resp)

    async def aclose(self) -> None:
        await self.client.aclose()


def scripted(chat: Callable[[httpx.Request], httpx.Response]) -> HttpxUpstream:
    """An upstream whose `/chat/completions` answers come from `chat(request)`."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json=MODELS)
        return chat(request)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://engine/v1")
    return HttpxUpstream(client)


class RawEngine:
    """A socket server on a free port. `behaviour(conn, request_bytes)` answers chat requests."""

    def __init__(self, behaviour: Callable[[socket.socket, bytes], None]) -> None:
        self.behaviour = behaviour
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
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
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                first_line = head.split(b"\r\n")[0]
                if head.startswith(b"GET") and b"/health" in first_line:  # the server's checks
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    continue
                if head.startswith(b"GET") and b"/models" in first_line:
                    payload = json.dumps(MODELS).encode()
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                        + payload
                    )
                    continue
                self.behaviour(conn, body)
                return

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


def send_chunked_head(conn: socket.socket) -> None:
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )


def send_chunk(conn: socket.socket, data: bytes) -> None:
    conn.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n")
