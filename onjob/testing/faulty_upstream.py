"""A fake engine that misbehaves on a seeded schedule: the reliability tests' and benches' engine.

It speaks what the proxy needs of vLLM: `GET /v1/models` lists the base model `fake` and
LoRA adapters (`canary-a` unless `--adapters` says otherwise, each with `parent`), `GET
/health`, and `POST /v1/chat/completions`, whose answers carry logprobs, token ids and
the usage event only when the request asks for them, and name the model asked for. Each
chat request draws its fate from a seeded RNG, at `--fault-rate` for the base model and
`--adapter-fault-rate` for adapters (make the canary fail more, and the proxy's fallback
to live gets exercised); a faulty request gets one of, weighted by `--mix`:

    error  HTTP 500: an OpenAI-shaped JSON body, or a plain-text one (every other time)
    stall  silence for `--stall-s` (set it past the proxy's read timeout): before the
           answer's head, or for a stream, half-way through its events
    drop   the connection closed (or reset) with no answer
    cut    the connection closed half-way through the answer (a stream without [DONE],
           half a JSON body)

`GET /stats` gives the fates drawn so far per model. The proxy-overhead bench's engine is
`onjob.testing.fake_upstream` (fast, never faulty); this one spends a coroutine per connection.

    python -m onjob.testing.faulty_upstream --port 9001 --fault-rate 0.2 --adapter-fault-rate 0.6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from urllib.request import urlopen

from ..protocol import JsonObject

BASE = "fake"
FATES = ("error", "stall", "drop", "cut")
TOKENS = 20


def _http(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
STREAM_END = b"0\r\n\r\n"


class Answers:
    """A request's normal answer, shaped by what it asked for."""

    def __init__(self, request: dict) -> None:
        self.model = request["model"]
        self.logprobs = bool(request.get("logprobs"))
        self.token_ids = bool(request.get("return_token_ids"))
        self.usage = bool((request.get("stream_options") or {}).get("include_usage"))

    def completion(self) -> bytes:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": " w" * TOKENS},
            "logprobs": {"content": [{"token": " w", "logprob": -0.5}] * TOKENS}
            if self.logprobs
            else None,
            "finish_reason": "stop",
        }
        body = {
            "id": "chatcmpl-faulty",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": {"prompt_tokens": 12, "completion_tokens": TOKENS, "total_tokens": 32},
        }
        if self.token_ids:
            choice["token_ids"] = list(range(1000, 1000 + TOKENS))
            body["prompt_token_ids"] = list(range(12))
        return json.dumps(body, separators=(",", ":")).encode()

    def events(self) -> list[bytes]:
        """The stream's SSE events, each a transfer chunk, [DONE] last."""
        head = {
            "id": "chatcmpl-faulty",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
        }
        first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        if self.token_ids:
            first["prompt_token_ids"] = list(range(12))
        events = [first]
        for i in range(TOKENS):
            choice = {
                "index": 0,
                "delta": {"content": " w"},
                "finish_reason": "stop" if i == TOKENS - 1 else None,
            }
            if self.logprobs:
                choice["logprobs"] = {"content": [{"token": " w", "logprob": -0.5}]}
            if self.token_ids:
                choice["token_ids"] = [1000 + i]
            events.append({**head, "choices": [choice]})
        if self.usage:
            usage = {"prompt_tokens": 12, "completion_tokens": TOKENS, "total_tokens": 32}
            events.append({**head, "choices": [], "usage": usage})
        sse = [b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events]
        return [_chunk(e) for e in [*sse, b"data: [DONE]\n\n"]]


class Engine:
    def __init__(self, args: argparse.Namespace) -> None:
        self.adapters = args.adapters
        self.rates = {
            BASE: args.fault_rate,
            **dict.fromkeys(args.adapters, args.adapter_fault_rate),
        }
        self.mix = [args.mix.get(f, 0.0) for f in FATES]
        self.stall_s = args.stall_s
        self.delay = args.delay_ms / 1000
        self.token_delay = args.token_delay_ms / 1000
        self.rng = random.Random(args.seed)
        self.stats: dict[str, Counter] = defaultdict(Counter)
        models = [{"id": BASE, "object": "model", "parent": None}]
        models += [{"id": a, "object": "model", "parent": BASE} for a in args.adapters]
        self.models = json.dumps({"object": "list", "data": models}).encode()

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, target, _ = head[0].split(" ", 2)
                length = next(
                    (
                        int(h.split(":", 1)[1])
                        for h in head
                        if h.lower().startswith("content-length:")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                if not await self.answer(method, target.split("?")[0], body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the proxy went away (as it does after a timeout)
        finally:
            writer.close()

    async def answer(self, method: str, path: str, body: bytes, writer) -> bool:
        """Answer one request; False when the connection is to be closed."""
        if method == "GET" and path == "/health":
            writer.write(_http("200 OK", b'{"status":"ok"}'))
        elif method == "GET" and path == "/v1/models":
            writer.write(_http("200 OK", self.models))
        elif method == "GET" and path == "/stats":
            writer.write(_http("200 OK", json.dumps(self.stats).encode()))
        elif method == "POST" and path == "/v1/chat/completions":
            return await self.chat(json.loads(body), writer)
        else:
            writer.write(_http("404 Not Found", b'{"error":{"message":"no such route"}}'))
        await writer.drain()
        return True

    def fate(self, model: str) -> str:
        if self.rng.random() < self.rates[model]:
            return self.rng.choices(FATES, self.mix)[0]
        return "ok"

    async def chat(self, request: dict, writer) -> bool:
        model = request.get("model")
        if model not in self.rates:  # as vLLM answers a model it does not serve
            error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError"}
            writer.write(
                _http("404 Not Found", json.dumps({"error": {**error, "code": 404}}).encode())
            )
            await writer.drain()
            return True
        fate = self.fate(model)
        self.stats[model][fate] += 1
        stream = bool(request.get("stream"))
        answers = Answers(request)
        if fate == "error":
            if self.stats[model]["error"] % 2:
                error = {"message": "injected fault", "type": "InternalServerError", "code": 500}
                writer.write(
                    _http("500 Internal Server Error", json.dumps({"error": error}).encode())
                )
            else:
                writer.write(
                    _http("500 Internal Server Error", b"Internal Server Error", "text/plain")
                )
            await writer.drain()
            return True
        if fate == "drop":
            if self.rng.random() < 0.5:
                writer.transport.abort()  # a reset rather than a clean close
            return False
        stall_mid = fate == "stall" and stream and self.rng.random() < 0.5
        if fate == "stall" and not stall_mid:
            await asyncio.sleep(self.stall_s)
        if not stream:
            await asyncio.sleep(self.delay)
            body = answers.completion()
            data = _http("200 OK", body)
            writer.write(data[: len(data) - len(body) // 2] if fate == "cut" else data)
            await writer.drain()
            return fate != "cut"
        events = answers.events()
        writer.write(STREAM_HEAD)
        for i, event in enumerate(events):
            if i == len(events) // 2 and fate == "cut":
                await writer.drain()
                return False
            if i == len(events) // 2 and stall_mid:
                await asyncio.sleep(self.stall_s)
            await asyncio.sleep(self.token_delay)
            writer.write(event)
            await writer.drain()
        writer.write(STREAM_END)
        await writer.drain()
        return True


async def serve(args: argparse.Namespace) -> None:
    engine = Engine(args)
    server = await asyncio.start_server(engine.connection, "127.0.0.1", args.port, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def _mix(text: str) -> Mapping[str, float]:
    mix = {}
    for part in text.split(","):
        name, _, weight = part.partition("=")
        if name not in FATES:
            raise argparse.ArgumentTypeError(f"{name!r} is not one of {', '.join(FATES)}")
        mix[name] = float(weight or 1)
    return mix


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--adapters", nargs="*", default=["canary-a"], help="LoRA names it serves")
    p.add_argument("--fault-rate", type=float, default=0.1, help="share of base-model requests")
    p.add_argument("--adapter-fault-rate", type=float, default=0.5, help="share for adapters")
    p.add_argument("--mix", type=_mix, default=_mix("error,stall,drop,cut"), help="fate=weight,...")
    p.add_argument("--stall-s", type=float, default=5.0, help="how long a stall lasts")
    p.add_argument("--delay-ms", type=float, default=10.0, help="before a whole answer")
    p.add_argument("--token-delay-ms", type=float, default=2.0, help="between streamed events")
    p.add_argument("--seed", type=int, default=0)
    return p


class FaultyEngine:
    """This script as a child process: `start()` returns once `/health` answers; `kill()`
    is SIGKILL, and `start()` again brings it back on the same port."""

    def __init__(self, port: int, args: list[str] = ()) -> None:
        self.port = port
        self.args = [str(a) for a in args]
        self.proc: subprocess.Popen | None = None
        # stderr to a file, never a pipe nobody reads (a full pipe would block the engine)
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as this object)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 30) -> FaultyEngine:
        cmd = [
            sys.executable,
            "-m",
            "onjob.testing.faulty_upstream",
            "--port",
            str(self.port),
            *self.args,
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.seek(0)
                raise RuntimeError(f"faulty engine exited: {self._log.read().decode()[-2000:]}")
            try:
                urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("faulty engine not ready")

    def stats(self) -> JsonObject:
        with urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=5) as resp:
            return json.load(resp)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def __enter__(self) -> FaultyEngine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    args = parser().parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
