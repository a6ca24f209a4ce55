"""What the proxy adds, against its peers: latency and throughput direct to a fake
engine, through `onjob serve` with logging on, through the LiteLLM proxy, a bare
aiohttp passthrough (Python's floor) and a bare passthrough on Litestar + uvicorn + the
aiohttp client (onjob's stack until its hot routes left Litestar's router and aiohttp's
client: `proxy/front.py`, `proxy/lean.py`), and optionally the Portkey gateway, side by
side in one run.

Layout on a 2-core machine: the load generator (this process) on core 0; the fake
engine(s) and every proxy on core 1, so a proxy's requests/s is what one core
gives. For each concurrency (1, 16, 64), streaming and not, the same load runs
direct, then through each proxy in turn; the ratios to onjob are printed at the
end. Then onjob alone: a 50 ms engine at concurrency 16, and whether loading into
DuckDB kept up (the proxy's `/health`
counters), at the default loader priority (nice 10) and at the proxy's own (0).
Peers are installed on first use under build/peers/ (bench/proxy/peers.py).

For every run it also reads each server process's CPU time (`/proc/<pid>/stat`, all its
threads: the DuckDB loader's included, and apart as `loader_cpu_us_per_request`) and
samples its RSS every 50 ms, so each row has CPU µs per request and peak RSS under load;
the closing table puts onjob beside the aiohttp passthrough on req/s, p99 and both.
`--no-alone` skips the onjob-alone cases (a quicker side by side). `--apart` adds
`onjob serve --loader-apart` to the side by side: its one proxy-only worker answers, and
the primary, which loads DuckDB, is measured apart (`loader_cpu_us_per_request`,
`loader_rss_peak_mib`); both processes sit on the proxies' core. `--baseline DIR` adds
the `onjob serve` of another checkout (`git worktree add DIR COMMIT`) as `onjob-base`:
before and after a change in one run.

    python -m bench.proxy.proxy_overhead                         # ~5 minutes
    python -m bench.proxy.proxy_overhead --peers aiohttp litellm portkey
    python -m bench.proxy.proxy_overhead --seconds 2 --concurrency 1 16 --peers

Writes bench/results/proxy_overhead-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench import harness
from bench.harness import procs as harness_procs
from bench.proxy import loadgen, peers
from onjob.cli import admin_key
from onjob.cli.process import free_port

SYSTEM = "You are a support agent for an online shop. Be brief and polite. " * 4
USER = "My order 12345 has not arrived yet; it was due on Monday. What can you do? " * 2


HISTORY = 0  # earlier turns (a question and an answer each) every request carries: --history


def body(model: str, stream: bool) -> bytes:
    earlier = []
    for i in range(HISTORY):
        earlier += [
            {"role": "user", "content": f"Question {i}: where is my order number {i}? " * 5},
            {"role": "assistant", "content": f"Your order {i} ships tomorrow. " * 8},
        ]
    chat = {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            *earlier,
            {"role": "user", "content": USER},
        ],
        "max_tokens": 64,
        "temperature": 0.7,
        "stream": stream,
    }
    return json.dumps(chat, separators=(",", ":")).encode()


def start(
    cmd: list[str],
    port: int,
    core: int,
    env: dict | None = None,
    ready: str = "/health",
    cwd: Path | None = None,
) -> subprocess.Popen:
    """`cmd` on `core`, ready when `ready` answers 200 on `port` (`harness.procs.start`);
    its pid kept for the CPU and memory readings."""
    proc = harness_procs.start(cmd, port, core, env, ready=ready, cwd=cwd)
    PIDS[port] = proc.pid
    return proc


def fake_engine(core: int, delay_ms: float = 0) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = harness_procs.fake_engine_cmd(port, "--delay-ms", str(delay_ms))
    return start(cmd, port, core), port


def proxy(engine_port: int, db: Path, core: int, *flags: str, tree: Path | None = None, **env: str):
    """`onjob serve` on a free port; from the checkout `tree` when given (its code, not
    this one's: a baseline run side by side)."""
    port = free_port()
    cmd = [sys.executable, "-m", "onjob.cli", "serve", "--port", str(port), *flags]
    cmd += ["--engine-url", f"http://127.0.0.1:{engine_port}/v1", "--db", str(db)]
    if tree is not None:
        env = {**env, "PYTHONPATH": str(tree)}
    proc = start(cmd, port, core, env, cwd=tree)
    # `/health`'s counters and pid are the admin key's alone: as given, or the one the
    # server made beside its database.
    key = env.get("ONJOB_PROXY__ADMIN_KEY") or admin_key.read(db)
    ADMIN[port] = {"Authorization": f"Bearer {key}"} if key else {}
    if "--loader-apart" in flags:  # a worker answers (its pid in /health); the primary loads
        LOADERS[port] = proc.pid
        PIDS[port] = httpx.get(f"http://127.0.0.1:{port}/health", headers=ADMIN[port]).json()["pid"]
    return proc, port


_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _cpu_s(pid: int, loader_only: bool = False) -> float:
    """CPU seconds (user + system) of a process, or of its threads at a lower priority
    alone (onjob's DuckDB threads, `collector.loader_nice`)."""
    if not loader_only:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[16]) > 0:  # niced: the collector's DuckDB threads (loader_nice)
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def _rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE / 2**20


class Usage:
    """CPU time used and peak RSS of a server process over one run (RSS sampled every
    50 ms on a thread of this process, which costs it nothing), and of the process that
    loads its spool when that is another (`--loader-apart`)."""

    def __init__(self, pid: int | None, loader_pid: int | None = None) -> None:
        self.pid = pid
        self.loader_pid = loader_pid
        self.peak = self.loader_peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> Usage:
        if self.pid is not None:
            self.cpu0 = _cpu_s(self.pid)
            self.loader0 = self._loader_cpu_s()
            self.peak = _rss_mib(self.pid)
            self._thread.start()
        return self

    def _loader_cpu_s(self) -> float:
        if self.loader_pid is not None:
            return _cpu_s(self.loader_pid)
        return _cpu_s(self.pid, loader_only=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, _rss_mib(self.pid))
            if self.loader_pid is not None:
                self.loader_peak = max(self.loader_peak, _rss_mib(self.loader_pid))

    def __exit__(self, *exc) -> None:
        if self.pid is not None:
            self._stop.set()
            self._thread.join()
            self.cpu = _cpu_s(self.pid) - self.cpu0
            self.loader = self._loader_cpu_s() - self.loader0

    def add_to(self, m: dict, measured_share: float) -> None:
        """CPU per request: the run's CPU (warm-up included) over its requests (warm-up
        included, estimated from the measured rate)."""
        if self.pid is None:
            return
        requests = m["requests"] / measured_share
        m["cpu_us_per_request"] = round(self.cpu / requests * 1e6, 1) if requests else None
        if self.loader:
            m["loader_cpu_us_per_request"] = round(self.loader / requests * 1e6, 1)
        m["rss_peak_mib"] = round(self.peak, 1)
        if self.loader_pid is not None:
            m["loader_rss_peak_mib"] = round(self.loader_peak, 1)


def health(port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/health", headers=ADMIN[port]).json()["collector"]


PIDS: dict[int, int] = {}  # port -> the pid of the server listening on it
ADMIN: dict[int, dict] = {}  # port -> the header with its server's admin key (`proxy`)
LOADERS: dict[int, int] = {}  # port -> the pid loading its spool, where that is another


def load(
    port: int, model: str, stream: bool, c: int, args, stagger: float = 0.0, headers=None
) -> dict:
    path = "/v1/chat/completions"
    raw = loadgen.request_bytes("127.0.0.1", port, path, body(model, stream), headers=headers)
    with Usage(PIDS.get(port), LOADERS.get(port)) as usage:
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
    m = result.summary()
    usage.add_to(m, args.seconds / (args.seconds + args.warmup))
    return m


def line(name: str, m: dict, direct: dict | None = None) -> str:
    text = f"{name:<8} p50 {m['p50_ms']:8.3f} p99 {m['p99_ms']:8.3f} ms {m['rps']:8.1f}/s"
    if direct is not None:
        text += (
            f"  added p50 {m['p50_ms'] - direct['p50_ms']:+8.3f}"
            f" p99 {m['p99_ms'] - direct['p99_ms']:+8.3f} ms"
        )
    if m.get("cpu_us_per_request") is not None:
        text += f"  cpu {m['cpu_us_per_request']:6.1f} µs/req"
        if m.get("loader_cpu_us_per_request"):
            text += f" (loader {m['loader_cpu_us_per_request']:.1f})"
        text += f"  rss {m['rss_peak_mib']:6.1f} MiB"
        if m.get("loader_rss_peak_mib") is not None:
            text += f" (loader process: {m['loader_rss_peak_mib']:.1f} MiB, cpu not included)"
    return text + (f"  ERRORS {m['errors']}" if m["errors"] else "")


def side_by_side(targets: dict[str, tuple[int, str, dict]], stream: bool, c: int, args) -> dict:
    """The same load direct to the engine, then through each proxy (name -> port, model
    name, extra headers): added latency against the direct run, ratios against onjob."""
    engine_port = targets.pop("direct")[0]
    print(f"-- stream={stream} concurrency={c}", flush=True)
    direct = load(engine_port, "fake", stream, c, args)
    print("   " + line("direct", direct), flush=True)
    row = {"stream": stream, "concurrency": c, "direct": direct}
    for name, (port, model, headers) in targets.items():
        m = load(port, model, stream, c, args, headers=headers)
        m["added_p50_ms"] = round(m["p50_ms"] - direct["p50_ms"], 3)
        m["added_p99_ms"] = round(m["p99_ms"] - direct["p99_ms"], 3)
        row[name] = m
        print("   " + line(name, m, direct), flush=True)
    onjob = row["onjob"]
    row["onjob_vs"] = {
        name: {
            "rps_ratio": round(onjob["rps"] / row[name]["rps"], 2) if row[name]["rps"] else None,
            "added_p99_ratio": _ratio(onjob["added_p99_ms"], row[name]["added_p99_ms"]),
        }
        for name in targets
        if name != "onjob"
    }
    return row


def _ratio(a: float, b: float) -> float | None:
    """onjob's added p99 as a fraction of a peer's (a floor of 0.01 ms: added latency
    at a noise-level of zero or below would make the ratio meaningless)."""
    return round(max(a, 0.01) / max(b, 0.01), 3)


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
    print(f"{label:<10} stream={stream!s:<5} c={c:<3} " + line("onjob", through, direct))
    return row


def hot_path(rows: list[dict]) -> list[dict]:
    """Issue 19's item 8 in one table: onjob against the aiohttp passthrough at each
    concurrency, streamed and not (req/s ratio, p99 ratio, CPU µs per request, peak RSS
    under load)."""
    out = []
    names = ("onjob", "onjob-apart", "onjob-base", "onjob-base-apart")
    for r, name in ((r, n) for r in rows for n in names):
        if "aiohttp" not in r or name not in r:
            continue
        o, a = r[name], r["aiohttp"]
        out.append(
            {
                "onjob": name,
                "stream": r["stream"],
                "concurrency": r["concurrency"],
                "onjob_rps": o["rps"],
                "aiohttp_rps": a["rps"],
                "rps_share": round(o["rps"] / a["rps"], 3) if a["rps"] else None,
                "onjob_p99_ms": o["p99_ms"],
                "aiohttp_p99_ms": a["p99_ms"],
                "p99_ratio": round(o["p99_ms"] / a["p99_ms"], 2) if a["p99_ms"] else None,
                "onjob_cpu_us_per_request": o.get("cpu_us_per_request"),
                "onjob_loader_cpu_us_per_request": o.get("loader_cpu_us_per_request"),
                "aiohttp_cpu_us_per_request": a.get("cpu_us_per_request"),
                "onjob_rss_peak_mib": o.get("rss_peak_mib"),
                "onjob_loader_rss_peak_mib": o.get("loader_rss_peak_mib"),
                "aiohttp_rss_peak_mib": a.get("rss_peak_mib"),
            }
        )
    if out:
        print(
            "\nonjob against the aiohttp passthrough (issue 19 item 8: rps share >= 0.6, "
            "p99 ratio <= 2 at c64, onjob peak RSS <= 200 MiB)"
        )
        print(
            f"{'onjob':<12}{'stream':<7}{'c':>4}{'onjob/s':>10}{'aiohttp/s':>11}{'share':>7}"
            f"{'p99 onjob':>11}{'aiohttp':>9}{'ratio':>7}{'cpu µs onjob':>14}{'aiohttp':>9}"
            f"{'rss MiB onjob':>15}{'aiohttp':>9}"
        )
        for h in out:
            print(
                f"{h['onjob']:<12}{h['stream']!s:<7}{h['concurrency']:>4}{h['onjob_rps']:>10.0f}"
                f"{h['aiohttp_rps']:>11.0f}{h['rps_share']!s:>7}{h['onjob_p99_ms']:>11.2f}"
                f"{h['aiohttp_p99_ms']:>9.2f}{h['p99_ratio']!s:>7}"
                f"{h['onjob_cpu_us_per_request']!s:>14}{h['aiohttp_cpu_us_per_request']!s:>9}"
                f"{h['onjob_rss_peak_mib']!s:>15}{h['aiohttp_rss_peak_mib']!s:>9}"
            )
    return out


def summary(rows: list[dict]) -> None:
    names = [k for k in rows[0]["onjob_vs"]] if rows else []
    if not names:
        return
    print("\nonjob (logging on) against each peer: requests/s ratio, added p99 ratio")
    print(f"{'stream':<7}{'c':>4}  " + "  ".join(f"{n + ' rps×':>14}{'p99':>8}" for n in names))
    for r in rows:
        cells = "  ".join(
            f"{r['onjob_vs'][n]['rps_ratio']!s:>14}{r['onjob_vs'][n]['added_p99_ratio']!s:>8}"
            for n in names
        )
        print(f"{r['stream']!s:<7}{r['concurrency']:>4}  {cells}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument(
        "--peers",
        nargs="*",
        choices=peers.NAMES,
        default=["aiohttp", "litestar", "litellm"],
        help="proxies to measure beside onjob (default: aiohttp litestar litellm; portkey "
        "needs npm)",
    )
    parser.add_argument(
        "--no-alone", action="store_true", help="skip the onjob-alone cases after the side by side"
    )
    parser.add_argument(
        "--apart",
        action="store_true",
        help="add `onjob serve --loader-apart` (a proxy-only worker answers, the primary "
        "loads) to the side by side",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="earlier turns each request carries (an agent's conversation: 20 makes 42 "
        "messages; default 0: a system prompt and one question)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of another commit (`git worktree add DIR COMMIT`): its `onjob serve` "
        "runs side by side as onjob-base (and onjob-base-apart with --apart)",
    )
    parser.add_argument(
        "--baseline-env",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="settings of the baseline's servers, e.g. ONJOB_PROXY__UPSTREAM_CLIENT=aiohttp",
    )
    args = harness.parse(parser)
    global HISTORY
    HISTORY = args.history
    cores = sorted(os.sched_getaffinity(0))
    load_core, server_core = cores[0], cores[-1]
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="onjob-bench-"))
    rows, cases, logging_rows = [], [], []
    try:
        engine, engine_port = fake_engine(server_core)
        procs.append(engine)
        fast_proxy, fast_port = proxy(engine_port, tmp / "fast.duckdb", server_core)
        procs.append(fast_proxy)
        targets = {"direct": (engine_port, "fake", {}), "onjob": (fast_port, "agent", {})}
        if args.apart:
            apart, apart_port = proxy(
                engine_port, tmp / "apart.duckdb", server_core, "--loader-apart"
            )
            procs.append(apart)
            targets["onjob-apart"] = (apart_port, "agent", {})
        if args.baseline is not None:
            base_env = dict(kv.split("=", 1) for kv in args.baseline_env)
            variants = [("onjob-base", ())] + (
                [("onjob-base-apart", ("--loader-apart",))] if args.apart else []
            )
            for name, flags in variants:
                p, port = proxy(
                    engine_port, tmp / f"{name}.duckdb", server_core, *flags,
                    tree=args.baseline.resolve(), **base_env,
                )  # fmt: skip
                procs.append(p)
                targets[name] = (port, "agent", {})
        for name in args.peers:
            port = free_port()
            p = peers.peer(name, port, engine_port, tmp)
            procs.append(start(p.cmd, port, server_core, p.env, ready=p.health))
            targets[name] = (port, p.model, p.headers)
        if not args.no_alone:
            alone_ports = others(engine_port, tmp, server_core, procs)
        os.sched_setaffinity(0, {load_core})
        print(f"load generator on core {load_core}; engines and proxies on core {server_core}")

        for stream in (False, True):
            for c in args.concurrency:
                before = health(fast_port)
                rows.append(side_by_side(dict(targets), stream, c, args))
                after = health(fast_port)
                if c == max(args.concurrency):
                    logging_rows.append(
                        {"loader_nice": 10, **drain(fast_port, before, after, stream)}
                    )
        if not args.no_alone:
            alone(engine_port, *alone_ports, args, cases, logging_rows)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)

    summary(rows)
    item8 = hot_path(rows)
    missed = streamed_check(item8)
    result = {
        "layout": {"load_core": load_core, "server_core": server_core},
        "seconds": args.seconds,
        "warmup": args.warmup,
        "history": args.history,
        "baseline": str(args.baseline) if args.baseline else None,
        "baseline_env": args.baseline_env,
        "peers": {
            "litellm": peers.LITELLM_VERSION,
            "portkey": peers.PORTKEY_VERSION,
            "aiohttp": "bench/proxy/passthrough.py",
        },
        "side_by_side": rows,
        "onjob_vs_aiohttp": item8,
        "streamed_missed": missed,
        "onjob_cases": cases,
        "logging": logging_rows,
    }
    harness.save("proxy_overhead", result, args.out)
    return 1 if missed else 0


# Issue 68's targets for streamed answers, the path agents use: a share of the aiohttp
# passthrough's requests/s at c16 and c64, and onjob's CPU per request at c64.
STREAMED_SHARE = 0.75
STREAMED_CPU_US_C64 = 350


def streamed_check(item8: list[dict]) -> list[str]:
    """Streamed c16 and c64 beside whole, against issue 68's targets; what missed is
    printed loudly (and the bench exits 1), so a regression shows in the stop that makes it."""
    rows = [h for h in item8 if h["onjob"] == "onjob" and h["concurrency"] in (16, 64)]
    if not rows:
        return []
    print(
        f"\nstreamed against whole (issue 68: streamed share >= {STREAMED_SHARE} at c16 and "
        f"c64, CPU per streamed request at c64 <= {STREAMED_CPU_US_C64} µs)"
    )
    print(f"{'c':>4}{'whole share':>13}{'cpu µs':>8}{'streamed share':>16}{'cpu µs':>8}")
    missed = []
    for c in sorted({h["concurrency"] for h in rows}):
        by = {h["stream"]: h for h in rows if h["concurrency"] == c}
        whole, streamed = by.get(False), by.get(True)
        if streamed is None:
            continue
        cells = [
            f"{c:>4}",
            f"{whole['rps_share'] if whole else '-'!s:>13}",
            f"{whole['onjob_cpu_us_per_request'] if whole else '-'!s:>8}",
            f"{streamed['rps_share']!s:>16}",
            f"{streamed['onjob_cpu_us_per_request']!s:>8}",
        ]
        print("".join(cells))
        share, cpu = streamed["rps_share"], streamed["onjob_cpu_us_per_request"]
        if share is not None and share < STREAMED_SHARE:
            missed.append(f"streamed c{c}: {share} of the aiohttp floor (target {STREAMED_SHARE})")
        if c == 64 and cpu is not None and cpu > STREAMED_CPU_US_C64:
            target = STREAMED_CPU_US_C64
            missed.append(f"streamed c64: {cpu} µs of CPU per request (target {target})")
    for line in missed:
        print(f"MISSED: {line}")
    return missed


def others(engine_port: int, tmp: Path, core: int, procs: list) -> tuple[int, ...]:
    """The proxies for the onjob-alone cases: a 50 ms engine and its proxy, the loader at
    nice 0."""
    slow, slow_port = fake_engine(core, delay_ms=50)
    procs.append(slow)
    slow_proxy, slow_proxy_port = proxy(slow_port, tmp / "slow.duckdb", core)
    procs.append(slow_proxy)
    eager_proxy, eager_port = proxy(
        engine_port, tmp / "eager.duckdb", core, ONJOB_COLLECTOR__LOADER_NICE="0"
    )
    procs.append(eager_proxy)
    return slow_port, slow_proxy_port, eager_port


def alone(
    engine_port: int,
    slow_port: int,
    slow_proxy_port: int,
    eager_port: int,
    args,
    cases: list,
    logging_rows: list,
) -> None:
    print("\nonjob alone:")
    # Connections spread over one 50 ms period, as independent agents would be; then
    # all 16 in lockstep (every request arrives in a burst of 16), the worst case.
    for stream in (False, True):
        cases.append(compare("50ms", slow_port, slow_proxy_port, stream, 16, args, 0.05))
    cases.append(compare("50ms-burst", slow_port, slow_proxy_port, False, 16, args))
    c = max(args.concurrency)
    before = health(eager_port)
    row = compare("nice0", engine_port, eager_port, False, c, args)
    row["note"] = "collector.loader_nice = 0: loading at the proxy's own priority"
    cases.append(row)
    logging_rows.append({"loader_nice": 0, **drain(eager_port, before, health(eager_port), False)})


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
