"""Soak: `onjob serve` at a steady request rate for minutes; does its memory stay flat?

The fast fake engine (onjob/testing/fake_upstream.py, `--engine-delay-ms` per answer) behind
`onjob serve`; requests leave at a fixed rate whatever the answers' latency (an open
loop), a third of them streamed, and three in ten continue an earlier conversation
(found by its messages, so the stitcher does its work). Every `--sample-s` seconds the
server's RSS (psutil, else /proc/<pid>/status) and its `/health` counters are printed.
At the end: RSS at the start (after `--warmup-s`) and at the end, its max and its slope
(least squares, MB/min), requests and errors, and whether every answered exchange is in
DuckDB (after a clean stop, read-only).

The stitcher's index is an LRU that grows until `collector.stitch_capacity` (200,000
conversations by default) by design; `--stitch-capacity` (2,000 here) fills it within the
warm-up so the slope shows growth beyond it. `--stitch-capacity 0` keeps the default.

    python -m bench.proxy.soak                 # 10 minutes at 75 requests/s
    python -m bench.proxy.soak --minutes 1 --rate 50

Writes bench/results/soak-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from pathlib import Path
from urllib.request import urlopen

import aiohttp

from bench import harness
from bench.harness.procs import fake_engine_cmd
from onjob.cli.process import ServerProcess, free_port
from onjob.testing import faults


def rss_mb(pid: int) -> float:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss / 2**20
    except ImportError:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS in /proc") from None


def slope_per_min(samples: list[dict]) -> float:
    """Least-squares slope of RSS (MB) over time, per minute."""
    ts = [s["t"] for s in samples]
    if len(set(ts)) < 2:
        return 0.0
    return 60 * statistics.linear_regression(ts, [s["rss_mb"] for s in samples]).slope


def fake_engine(delay_ms: float) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = fake_engine_cmd(port, "--delay-ms", str(delay_ms))
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError("fake engine not ready")


class Traffic:
    """Requests at a steady rate; conversations continue with their last reply."""

    def __init__(self, base: str, args: argparse.Namespace) -> None:
        self.base, self.args = base, args
        self.rng = random.Random(args.seed)
        self.answers: list[str] = []  # exchange ids of the answers received
        self.outcomes: Counter = Counter()
        self.open: deque[list[dict]] = deque(maxlen=200)  # conversations that may continue
        self.late = 0  # requests not sent on time: the client fell behind its own schedule
        self.in_flight = 0

    async def run(self, seconds: float) -> None:
        interval = 1 / self.args.rate
        connector = aiohttp.TCPConnector(limit=self.args.max_in_flight)
        timeout = aiohttp.ClientTimeout(total=60)
        tasks = set()
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            start = next_at = time.monotonic()
            for n in range(int(seconds * self.args.rate)):
                if (wait := next_at - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                elif wait < -interval:
                    self.late += 1
                next_at = start + (n + 1) * interval
                task = asyncio.create_task(self.one(session, n))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)

    async def one(self, session: aiohttp.ClientSession, n: int) -> None:
        if self.open and self.rng.random() < 0.3:
            messages = self.open.popleft()
            messages.append({"role": "user", "content": f"and then? ({n})"})
        else:
            system = {"role": "system", "content": "You are a support agent. Be brief."}
            messages = [system, {"role": "user", "content": f"order {n} is late"}]
        stream = self.rng.random() < self.args.stream_share
        self.in_flight += 1
        answer = await faults.chat(
            session,
            self.base,
            stream=stream,
            trajectory=f"soak-{n}",
            messages=messages,
            explicit=False,
        )
        self.in_flight -= 1
        self.outcomes[f"{answer.kind} {answer.status}"] += 1
        if answer.kind == "ok":
            self.answers.append(answer.exchange_id)
            if len(messages) < 9:
                self.open.append([*messages, {"role": "assistant", "content": answer.reply}])


ADMIN = "soak-admin"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}  # `/health`'s counters are its alone


async def soak(base: str, pid: int, args: argparse.Namespace) -> tuple[Traffic, list[dict]]:
    traffic = Traffic(base, args)
    samples: list[dict] = []
    start = time.monotonic()
    running = asyncio.create_task(traffic.run(args.minutes * 60))
    async with aiohttp.ClientSession() as session:
        while True:
            done = running.done()
            async with session.get(f"{base}/health", headers=AS_ADMIN) as resp:
                collector = (await resp.json())["collector"]
            sample = {
                "t": round(time.monotonic() - start, 1),
                "rss_mb": round(rss_mb(pid), 1),
                "requests": sum(traffic.outcomes.values()),
                "errors": sum(n for k, n in traffic.outcomes.items() if not k.startswith("ok")),
                "in_flight": traffic.in_flight,
                **collector,
            }
            samples.append(sample)
            print(
                f"t={sample['t']:6.0f}s  rss {sample['rss_mb']:7.1f} MB  requests "
                f"{sample['requests']:7d}  errors {sample['errors']}  in flight "
                f"{sample['in_flight']:3d}  spooled {collector['spooled']} loaded "
                f"{collector['loaded']}",
                flush=True,
            )
            if done:
                break
            await asyncio.wait({running}, timeout=args.sample_s)
    await running
    return traffic, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=75.0, help="requests per second")
    parser.add_argument("--stream-share", type=float, default=1 / 3)
    parser.add_argument("--sample-s", type=float, default=5.0, help="RSS sampled this often")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="at most a quarter of it")
    parser.add_argument("--engine-delay-ms", type=float, default=20.0)
    parser.add_argument("--stitch-capacity", type=int, default=2000, help="0: the default")
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = harness.parse(parser)
    warmup = min(args.warmup_s, args.minutes * 60 / 4)
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__ADMIN_KEY": ADMIN}
    if args.stitch_capacity:
        env["ONJOB_COLLECTOR__STITCH_CAPACITY"] = str(args.stitch_capacity)
    with tempfile.TemporaryDirectory(prefix="onjob-soak-") as tmp:
        db = Path(tmp) / "onjob.duckdb"
        engine, port = fake_engine(args.engine_delay_ms)
        try:
            log = Path(tmp) / "serve.log"
            url = f"http://127.0.0.1:{port}/v1"
            server = ServerProcess(["--engine-url", url, "--db", str(db)], env=env, log=log)
            with server:
                print(
                    f"server pid {server.proc.pid}; {args.rate:g} requests/s for "
                    f"{args.minutes:g} min (warm-up {warmup:g} s)",
                    flush=True,
                )
                traffic, samples = asyncio.run(soak(server.base, server.proc.pid, args))
            problems = faults.server_problems(log)
        finally:
            engine.terminate()
            engine.wait(timeout=10)
        stored = faults.exchanges(db)
    missing = [i for i in traffic.answers if i not in stored]
    measured = [s for s in samples if s["t"] >= warmup] or samples[-1:]
    requests = sum(traffic.outcomes.values())
    summary = {
        "rss_start_mb": measured[0]["rss_mb"],
        "rss_end_mb": measured[-1]["rss_mb"],
        "rss_max_mb": max(s["rss_mb"] for s in measured),
        "rss_slope_mb_per_min": round(slope_per_min(measured), 3),
        "measured_from_s": measured[0]["t"],
        "requests": requests,
        "rate_per_s": round(requests / samples[-1]["t"], 1),
        "errors": requests - traffic.outcomes["ok 200"],
        "outcomes": dict(traffic.outcomes),
        "late_sends": traffic.late,
        "answered": len(traffic.answers),
        "answered_in_duckdb": len(traffic.answers) - len(missing),
        "missing_from_duckdb": missing[:20],
        "exchanges_in_duckdb": len(stored),
        "server_log_problems": problems[:20],
    }
    print(
        f"RSS {summary['rss_start_mb']} MB at {summary['measured_from_s']:g} s -> "
        f"{summary['rss_end_mb']} MB at the end (max {summary['rss_max_mb']}, slope "
        f"{summary['rss_slope_mb_per_min']:+} MB/min); {requests} requests "
        f"({summary['rate_per_s']}/s), {summary['errors']} errors, {traffic.late} late sends; "
        f"{summary['answered_in_duckdb']}/{summary['answered']} answered exchanges in DuckDB"
    )
    fields = {"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary}
    harness.save("soak", {**fields, "samples": samples}, args.out)
    return 0 if not missing and not summary["errors"] and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
