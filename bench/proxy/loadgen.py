"""A closed-loop HTTP/1.1 load generator with exact percentiles.

`concurrency` keep-alive connections each send a request, read the whole answer
(Content-Length or chunked; a stream counts only once its `[DONE]` arrived), and
send the next. Every latency is kept and percentiles are exact (nearest rank),
unlike wrk 4.1's, which adds synthetic tail samples for fast targets. Its own cost
is a few tens of microseconds per request on a bare asyncio stream.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass


@dataclass
class Result:
    requests: int
    errors: int
    seconds: float
    latencies_ms: list[float]

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return float("nan")
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "rps": round(self.requests / self.seconds, 1),
            "p50_ms": round(self.percentile(50), 3),
            "p90_ms": round(self.percentile(90), 3),
            "p99_ms": round(self.percentile(99), 3),
        }


def request_bytes(
    host: str, port: int, path: str, body: bytes, api_key: str = "bench", headers=None
) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {api_key}\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    at = lower.find(b"content-length:")
    if at >= 0:
        length = int(lower[at + 15 : lower.find(b"\r\n", at)])
        return status, await reader.readexactly(length)
    last = b""
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return status, last
        data = await reader.readexactly(size + 2)
        last = data[:-2] or last


async def run(
    host: str,
    port: int,
    raw: bytes,
    *,
    concurrency: int,
    seconds: float,
    warmup: float,
    stagger: float = 0.0,
) -> Result:
    """`stagger` spreads the connections' first requests over that many seconds: with a
    constant-latency target, connections that start together stay in lockstep and
    every request arrives in a burst of `concurrency`."""
    start = time.perf_counter()
    measure_from = start + warmup
    stop = measure_from + seconds
    latencies: list[float] = []
    counts = {"requests": 0, "errors": 0}
    streamed = b'"stream":true' in raw

    async def connection(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        await asyncio.sleep(stagger * i / concurrency)
        try:
            while (now := time.perf_counter()) < stop:
                writer.write(raw)
                status, tail = await _read_answer(reader)
                done = time.perf_counter()
                ok = status == 200 and (not streamed or b"[DONE]" in tail)
                if now >= measure_from:
                    counts["requests"] += 1
                    if ok:
                        latencies.append((done - now) * 1000)
                    else:
                        counts["errors"] += 1
        finally:
            writer.close()

    await asyncio.gather(*(connection(i) for i in range(concurrency)))
    return Result(counts["requests"], counts["errors"], seconds, latencies)
