"""What the proxy adds: latency and throughput, direct to a fake engine vs through
`onjob serve` with logging on, side by side in one run.

Layout on a 2-core machine: the load generator (this process) on core 0; the fake
engine(s) and the proxy on core 1, so the proxy's requests/s is what one core gives.
For each concurrency (1, 16, 64), streaming and not, the same load runs direct then
through the proxy; then a 50 ms engine at concurrency 16, the httpx client for
comparison, and whether loading into DuckDB kept up (the proxy's `/health`
counters), at the default loader priority (nice 10) and at the proxy's own (0).

    python bench/proxy_overhead.py            # ~2 minutes
    python bench/proxy_overhead.py --seconds 2 --concurrency 1 16

Writes bench/results/proxy_overhead-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
import loadgen

from onjob.deploy.process import free_port

HERE = Path(__file__).parent
SYSTEM = "You are a support agent for an online shop. Be brief and polite. " * 4
USER = "My order 12345 has not arrived yet; it was due on Monday. What can you do? " * 2


def body(model: str, stream: bool) -> bytes:
    chat = {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
        "max_tokens": 64,
        "temperature": 0.7,
        "stream": stream,
    }
    return json.dumps(chat, separators=(",", ":")).encode()


def start(cmd: list[str], port: int, core: int, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd} exited: {proc.stderr.read().decode()}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except httpx.TransportError:
            time.sleep(0.1)
    raise TimeoutError(cmd)


def fake_engine(core: int, delay_ms: float = 0) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(port)]
    return start([*cmd, "--delay-ms", str(delay_ms)], port, core), port


def proxy(engine_port: int, db: Path, core: int, **env: str):
    port = free_port()
    cmd = [sys.executable, "-m", "onjob.deploy.cli", "serve", "--port", str(port)]
    cmd += ["--engine-url", f"http://127.0.0.1:{engine_port}/v1", "--db", str(db)]
    return start(cmd, port, core, env), port


def health(port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/health").json()["collector"]


def load(port: int, model: str, stream: bool, c: int, args, stagger: float = 0.0) -> dict:
    raw = loadgen.request_bytes("127.0.0.1", port, "/v1/chat/completions", body(model, stream))
    result = asyncio.run(
        loadgen.run(
            "127.0.0.1",
            port,
            raw,
            concurrency=c,
            seconds=args.seconds,
            warmup=args.warmup,
            stagger=stagger,
        )
    )
    return result.summary()


def compare(
    label: str, engine: int, proxied: int, stream: bool, c: int, args, stagger: float = 0.0
) -> dict:
    direct = load(engine, "fake", stream, c, args, stagger)
    through = load(proxied, "agent", stream, c, args, stagger)
    row = {
        "case": label,
        "stream": stream,
        "concurrency": c,
        "direct": direct,
        "proxy": through,
        "added_p50_ms": round(through["p50_ms"] - direct["p50_ms"], 3),
        "added_p99_ms": round(through["p99_ms"] - direct["p99_ms"], 3),
    }
    print(
        f"{label:<10} stream={stream!s:<5} c={c:<3} "
        f"direct p50 {direct['p50_ms']:7.3f} p99 {direct['p99_ms']:7.3f} {direct['rps']:8.1f}/s | "
        f"proxy p50 {through['p50_ms']:7.3f} p99 {through['p99_ms']:7.3f} {through['rps']:8.1f}/s"
        f" | added p50 {row['added_p50_ms']:+.3f} p99 {row['added_p99_ms']:+.3f} ms"
        + (f"  ERRORS {errors}" if (errors := through["errors"] + direct["errors"]) else ""),
        flush=True,
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    load_core, server_core = cores[0], cores[-1]
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="onjob-bench-"))
    rows, logging_rows = [], []
    try:
        engine, engine_port = fake_engine(server_core)
        slow, slow_port = fake_engine(server_core, delay_ms=50)
        procs += [engine, slow]
        fast_proxy, fast_port = proxy(engine_port, tmp / "fast.duckdb", server_core)
        slow_proxy, slow_proxy_port = proxy(slow_port, tmp / "slow.duckdb", server_core)
        httpx_proxy, httpx_port = proxy(
            engine_port, tmp / "httpx.duckdb", server_core, ONJOB_PROXY__UPSTREAM_CLIENT="httpx"
        )
        eager_proxy, eager_port = proxy(
            engine_port, tmp / "eager.duckdb", server_core, ONJOB_COLLECTOR__LOADER_NICE="0"
        )
        procs += [fast_proxy, slow_proxy, httpx_proxy, eager_proxy]
        os.sched_setaffinity(0, {load_core})
        print(f"load generator on core {load_core}; engines and proxies on core {server_core}")

        for stream in (False, True):
            for c in args.concurrency:
                before = health(fast_port)
                rows.append(compare("fast", engine_port, fast_port, stream, c, args))
                after = health(fast_port)
                if c == max(args.concurrency):
                    logging_rows.append(
                        {"loader_nice": 10, **drain(fast_port, before, after, stream)}
                    )
        # Connections spread over one 50 ms period, as independent agents would be; then
        # all 16 in lockstep (every request arrives in a burst of 16), the worst case.
        for stream in (False, True):
            rows.append(compare("50ms", slow_port, slow_proxy_port, stream, 16, args, 0.05))
        rows.append(compare("50ms-burst", slow_port, slow_proxy_port, False, 16, args))
        c = max(args.concurrency)
        before = health(eager_port)
        row = compare("nice0", engine_port, eager_port, False, c, args)
        row["note"] = "collector.loader_nice = 0: loading at the proxy's own priority"
        rows.append(row)
        logging_rows.append(
            {"loader_nice": 0, **drain(eager_port, before, health(eager_port), False)}
        )
        httpx_row = compare("httpx", engine_port, httpx_port, False, c, args)
        httpx_row["note"] = "same proxy with proxy.upstream_client = httpx"
        rows.append(httpx_row)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)

    result = {
        "bench": "proxy_overhead",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "layout": {"load_core": load_core, "server_core": server_core},
        "seconds": args.seconds,
        "warmup": args.warmup,
        "rows": rows,
        "logging": logging_rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"proxy_overhead-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


def drain(port: int, before: dict, after: dict, stream: bool) -> dict:
    """Did DuckDB loading keep up with the proxy at full rate? Backlog at the end of the
    run, and how long the loader then took to catch up."""
    spooled = after["spooled"] - before["spooled"]
    behind = after["spooled"] - after["loaded"]
    started = time.perf_counter()
    while health(port)["loaded"] < after["spooled"]:
        time.sleep(0.05)
    row = {
        "stream": stream,
        "exchanges_logged_in_run": spooled,
        "not_yet_in_duckdb_at_end": behind,
        "drained_in_s": round(time.perf_counter() - started, 3),
    }
    print(f"logging    stream={stream!s:<5} {row}", flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
