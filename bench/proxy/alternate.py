"""Two `onjob serve`s, A and B, measured in alternated rounds against one fake engine:
the medians of their CPU per request and requests/s. This machine's speed drifts by 10%
and more over minutes (a shared VM), so one run of each, one after the other, can read
a change of a few percent either way; alternating A and B (A B, B A, A B, ...) spreads
the drift over both. A and B are checkouts (`git worktree add DIR COMMIT`) or this tree,
each with settings of its own (`--env-b NAME=VALUE`, say the same code with another
`collector.flush_interval_s`).

    .venv/bin/python -m bench.proxy.alternate --a /tmp/base --rounds 6
    .venv/bin/python -m bench.proxy.alternate --env-b ONJOB_COLLECTOR__FLUSH_INTERVAL_S=1

Layout as `proxy_overhead`: the load generator on one core, the engine and both servers
on the other (the one not under load idles). Streamed at c64 unless told otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from bench import harness
from bench.proxy import proxy_overhead as po

ROOT = Path(__file__).resolve().parents[2]


def _env(pairs: list[str]) -> dict[str, str]:
    return dict(p.split("=", 1) for p in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, default=ROOT, help="A's checkout (default: this one)")
    parser.add_argument("--b", type=Path, default=ROOT, help="B's checkout (default: this one)")
    parser.add_argument("--env-a", nargs="*", default=[], metavar="NAME=VALUE")
    parser.add_argument("--env-b", nargs="*", default=[], metavar="NAME=VALUE")
    parser.add_argument("--rounds", type=int, default=6, help="runs of each, alternated")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--whole", action="store_true", help="whole answers, not streamed")
    args = harness.parse(parser)
    cores = sorted(os.sched_getaffinity(0))
    load_core, server_core = cores[0], cores[-1]
    engine, engine_port = po.fake_engine(server_core)
    servers = {}
    try:
        for name, tree, env in (("A", args.a, args.env_a), ("B", args.b, args.env_b)):
            db = Path(tempfile.mkdtemp(prefix=f"onjob-alternate-{name}-")) / "onjob.duckdb"
            proc, port = po.proxy(engine_port, db, server_core, tree=tree, **_env(env))
            po.PIDS[port] = proc.pid
            servers[name] = (proc, port)
        os.sched_setaffinity(0, {load_core})
        runs: dict[str, list[dict]] = {"A": [], "B": []}
        for r in range(args.rounds):
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                m = po.load(servers[name][1], "agent", not args.whole, args.concurrency, args)
                runs[name].append(m)
                print(f"round {r + 1} {po.line(name, m)}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        engine.terminate()
    summary = {
        name: {
            "cpu_us_per_request": statistics.median(m["cpu_us_per_request"] for m in ms),
            "rps": statistics.median(m["rps"] for m in ms),
        }
        for name, ms in runs.items()
    }
    a, b = summary["A"], summary["B"]
    print(
        f"medians of {args.rounds}: A {a['cpu_us_per_request']:.1f} µs/req {a['rps']:.0f}/s, "
        f"B {b['cpu_us_per_request']:.1f} µs/req {b['rps']:.0f}/s: B/A CPU "
        f"{b['cpu_us_per_request'] / a['cpu_us_per_request']:.3f}, req/s {b['rps'] / a['rps']:.3f}"
    )
    fields = {
        "a": {"tree": str(args.a), "env": _env(args.env_a)},
        "b": {"tree": str(args.b), "env": _env(args.env_b)},
        "stream": not args.whole,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "runs": runs,
        "summary": summary,
    }
    harness.save("alternate", fields, args.out)


if __name__ == "__main__":
    main()
