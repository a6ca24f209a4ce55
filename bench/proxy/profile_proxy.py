"""Where the proxy's CPU goes under load: `onjob serve` (logging on) under cProfile, a
fast fake engine, the load generator at one concurrency, streamed or not; prints the
functions with the most time of their own and the hot path's cumulative times.

Layout as `bench/proxy/proxy_overhead.py`: the load generator on one core, the engine and the
proxy on the other. cProfile slows every Python call, so the shares matter, not the
rates. The clock is the event loop thread's own CPU time (`time.thread_time`), so a busy
machine's other processes and the DuckDB loader's threads do not count.

    python -m bench.proxy.profile_proxy --stream --concurrency 64 --seconds 5
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench import harness
from bench.proxy import proxy_overhead as po
from onjob.cli.process import free_port

# The server with a profiler that SIGUSR1 starts and SIGUSR2 stops and writes: only the
# measured load is in the profile, not the start-up's imports.
_PROFILED = """
import cProfile, runpy, signal, sys, time
sys.argv = {argv!r}
profile = cProfile.Profile(time.thread_time)
signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
signal.signal(signal.SIGUSR2, lambda *_: (profile.disable(), profile.dump_stats({out!r})))
runpy.run_module("onjob.cli", run_name="__main__")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--top", type=int, default=30)
    args = harness.parse(parser, out=False)
    cores = sorted(os.sched_getaffinity(0))
    load_core, server_core = cores[0], cores[-1]
    tmp = Path(tempfile.mkdtemp(prefix="onjob-profile-"))
    out = tmp / "proxy.prof"
    engine, engine_port = po.fake_engine(server_core)
    port = free_port()
    argv = ["onjob", "serve", "--port", str(port)]
    argv += [
        "--engine-url",
        f"http://127.0.0.1:{engine_port}/v1",
        "--db",
        str(tmp / "onjob.duckdb"),
    ]
    cmd = [sys.executable, "-c", _PROFILED.format(argv=argv, out=str(out))]
    proxy = po.start(cmd, port, server_core)
    try:
        os.sched_setaffinity(0, {load_core})
        proxy.send_signal(signal.SIGUSR1)
        m = po.load(port, "agent", args.stream, args.concurrency, args)
        proxy.send_signal(signal.SIGUSR2)
        print(po.line("onjob", m), flush=True)
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # written whole
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=60)
        engine.terminate()
        engine.wait(timeout=30)
    report(pstats.Stats(str(out)), args.top)
    print(f"profile: {out}")
    return 0


def report(stats: pstats.Stats, top: int) -> None:
    """The functions called about once per request or more (requests in flight when the
    profile starts or stops count in part), as a share of the front's time
    (`ProxyApp.__call__`: the whole request), by cumulative and by own time."""
    rows = stats.stats  # (file, line, name) -> (primitive calls, calls, own s, cumulative s, _)
    front = [k for k in rows if k[0].endswith("proxy/front.py") and k[2] == "__call__"]
    if not front:
        print("no request reached the front")
        return
    requests, total = rows[front[0]][1], rows[front[0]][3]
    print(f"\n{requests} requests, {total * 1e6 / requests:.0f} µs of loop-thread CPU each")
    per_request = [(k, v) for k, v in rows.items() if v[1] >= 0.9 * requests]
    for title, index in (("cumulative", 3), ("own", 2)):
        print(f"\nby {title} time (share of the front's):")
        for (file, line, name), v in sorted(per_request, key=lambda kv: -kv[1][index])[:top]:
            where = f"{'/'.join(Path(file).parts[-2:])}:{line}({name})"
            print(f"  {v[index] / total:6.1%}  {v[1] / requests:6.1f}/req  {where}")


if __name__ == "__main__":
    sys.exit(main())
