"""Requests/s through `onjob serve --workers 2` against `--workers 1`, side by side in one run.

One fake engine (onjob/testing/fake_upstream.py, canned answers at once), then `onjob serve`
with one process, then with two answering on the same port (the primary, which also
loads the spool into DuckDB, and one proxy-only worker). For each, the same closed-loop
load (bench/proxy/loadgen.py in this process, bench/proxy/proxy_overhead.py's request) at each
concurrency, not streamed then streamed. Nothing is pinned: on a 2-core machine the
load generator and the fake engine share the cores with the proxies, so the gain a
second worker can show is bounded by what they leave free. After each server stops,
every exchange it answered must be in its DuckDB file (the workers' included).

    .venv/bin/python -m bench.scale.workers                      # ~1 minute
    .venv/bin/python -m bench.scale.workers --seconds 10 --concurrency 64

Writes bench/results/workers-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import httpx

from bench import harness
from bench.harness.procs import fake_engine_cmd
from bench.proxy import proxy_overhead
from onjob.cli.process import free_port


def wait_ready(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def measure(workers: int, engine: str, args, tmp: Path) -> dict:
    port = free_port()
    db = tmp / f"workers-{workers}.duckdb"
    cmd = [sys.executable, "-m", "onjob.cli", "serve", "--port", str(port)]
    cmd += ["--engine-url", engine, "--db", str(db), "--workers", str(workers)]
    env = {**os.environ, "ONJOB_LOOP__INTERVAL_S": "0"}
    server = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    out: dict = {"workers": workers, "points": []}
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", server)
        time.sleep(1.0 if workers > 1 else 0.0)  # the workers start after the primary
        for stream in (False, True):
            for c in args.concurrency:
                summary = proxy_overhead.load(port, "agent", stream, c, args, stagger=0.2)
                point = {"stream": stream, "concurrency": c, **summary}
                out["points"].append(point)
                print(
                    f"workers {workers} {'stream' if stream else 'whole '} c{c:<3} "
                    f"{point['rps']:8.1f}/s p50 {point['p50_ms']:7.2f} p99 {point['p99_ms']:7.2f}"
                    f" ms errors {point['errors']}",
                    flush=True,
                )
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)
    con = duckdb.connect(str(db), read_only=True)
    out["exchanges_in_duckdb"] = con.execute("SELECT count(*) FROM exchanges").fetchone()[0]
    con.close()
    spool = db.with_name(db.name + ".spool")
    out["spool_left"] = [p.name for p in spool.glob("*") if p.suffix in (".part", ".jsonl")]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--warmup", type=float, default=1)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64])
    args = harness.parse(parser)
    engine_port = free_port()
    engine = subprocess.Popen(fake_engine_cmd(engine_port))
    load_before = os.getloadavg()
    try:
        wait_ready(f"http://127.0.0.1:{engine_port}/v1/models", engine)
        with tempfile.TemporaryDirectory() as tmp:
            runs = [
                measure(n, f"http://127.0.0.1:{engine_port}/v1", args, Path(tmp)) for n in (1, 2)
            ]
    finally:
        engine.terminate()
        engine.wait()
    ratios = []
    for one, two in zip(runs[0]["points"], runs[1]["points"], strict=True):
        ratio = two["rps"] / one["rps"] if one["rps"] else float("nan")
        ratios.append({"stream": one["stream"], "concurrency": one["concurrency"], "ratio": ratio})
        mode = "stream" if one["stream"] else "whole "
        print(f"2 workers / 1, {mode} c{one['concurrency']}: {ratio:.2f}x")
    for run in runs:
        print(
            f"workers {run['workers']}: {run['exchanges_in_duckdb']} exchanges in DuckDB, "
            f"spool left: {run['spool_left'] or 'none'}"
        )
    harness.save(
        "workers",
        {
            "args": vars(args),
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "runs": runs,
            "ratios": ratios,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
