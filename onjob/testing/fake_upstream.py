"""A fast fake engine for proxy benchmarks: canned OpenAI answers, no model.

A bare asyncio protocol (uvloop when installed), so its own cost per request is
small next to the proxy's. Answers carry what the proxy asks the engine for
(logprobs, token ids, usage), 20 tokens each; `--delay-ms` holds every answer back
that long (a slow model). Run alone: `python -m onjob.testing.fake_upstream --port 9001`.
"""

from __future__ import annotations

import argparse
import asyncio
import json

TOKENS = 20


def _completion() -> bytes:
    content = [{"token": " w", "logprob": -0.5, "bytes": [32, 119], "top_logprobs": []}]
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " w" * TOKENS},
                "logprobs": {"content": content * TOKENS},
                "token_ids": list(range(1000, 1000 + TOKENS)),
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": TOKENS, "total_tokens": 140},
        "prompt_token_ids": list(range(120)),
    }
    return json.dumps(body, separators=(",", ":")).encode()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _stream() -> bytes:
    head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake"}
    events = [
        {
            **head,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            "prompt_token_ids": list(range(120)),
        }
    ]
    for i in range(TOKENS):
        events.append(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": " w"},
                        "logprobs": {"content": [{"token": " w", "logprob": -0.5}]},
                        "token_ids": [1000 + i],
                        "finish_reason": "stop" if i == TOKENS - 1 else None,
                    }
                ],
            }
        )
    usage = {"prompt_tokens": 120, "completion_tokens": TOKENS, "total_tokens": 140}
    events.append({**head, "choices": [], "usage": usage})
    sse = [b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events]
    sse.append(b"data: [DONE]\n\n")
    return b"".join(_chunk(e) for e in sse) + b"0\r\n\r\n"


MODELS = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode()
COMPLETION = _completion()
ANSWERS = {
    "models": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(MODELS)}\r\n\r\n".encode()
    + MODELS,
    "complete": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(COMPLETION)}\r\n\r\n".encode()
    + COMPLETION,
    "stream": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n" + _stream(),
}


class _Engine(asyncio.Protocol):
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.buffer = b""
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[: end + 2].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 : head.find(b"\r\n", at)]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            if head.startswith(b"get"):
                answer = ANSWERS["models"]
            else:
                answer = ANSWERS["stream" if b'"stream":true' in body else "complete"]
            if self.delay:
                asyncio.get_running_loop().call_later(self.delay, self._send, answer)
            else:
                self.transport.write(answer)

    def _send(self, answer: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(answer)


async def serve(port: int, delay_ms: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Engine(delay_ms / 1000), "127.0.0.1", port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.port, args.delay_ms))


if __name__ == "__main__":
    main()
