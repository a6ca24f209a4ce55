"""Two tenants on different tasks through one server at once: each with an adapter of its
own (one lineage per tenant), against one adapter shared by both (no tenants).

The arithmetic example's agent on one API key, the calculator's on another, both at
once and never paused, through one `onjob serve` and one engine, with the demo's loop
(`examples/arithmetic/demo.py`: production's settings but for its looser rule). The
judge scores each task by its own reward, and the referee each by its own check (one
reward module that tells the tasks apart by their tools: the calculator's requests carry
a tool, the arithmetic's none), as a team hosting both agents would write it.

    own:    proxy.tenants = { arith = ["arith"], calc = ["calc"] }: each key trains and
            is served its own lineage (`agent@arith`, `agent@calc`);
    shared: no tenants: both keys train and are served the one lineage `agent`.

Each mode runs until each of its lineages has promoted a candidate, or its ceiling (a
candidate stopped or rolled back does not end it: the next one may still be promoted).
Then each task's held-out success is measured on the adapter its key is served (95%
intervals), against the base model's, measured once. In `own`, every logged exchange is
checked against the lineage whose adapter answered it: an answer from another tenant's
adapter is counted (target 0).

    .venv/bin/python -m bench.scale.tenant_learning                  # both modes, 40 min each
    .venv/bin/python -m bench.scale.tenant_learning --modes own --minutes 30

Writes bench/results/tenant_learning-<timestamp>.json (rewritten after each mode).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import httpx
import msgspec

from bench import harness
from bench.harness import ROOT
from examples.arithmetic import demo
from examples.arithmetic.demo import (
    ADMIN,
    ADMIN_KEY,
    DEMO_LOOP,
    Traffic,
    decisions_of,
    engine_args,
    example_of,
    pct,
)
from onjob import bundled
from onjob.cli.process import EngineProcess, ServerProcess
from onjob.collector import Store
from onjob.deploy.records import Routing

TASKS = {"arith": "arithmetic", "calc": "calculator"}  # API key id -> example
SECRETS = {"arith": "sk-bench-arith-3f0a", "calc": "sk-bench-calc-9b2c"}
REWARDS = '''\
"""Both tasks' reward and referee, told apart by their tools (the calculator's requests
carry its multiply tool; the arithmetic agent's none)."""
from examples.arithmetic import task as arithmetic
from examples.calculator import task as calculator


def reward(rollout):
    return (calculator if rollout.tools else arithmetic).reward(rollout)


def referee(rollout):
    return (calculator if rollout.tools else arithmetic).referee(rollout)
'''


def config(work: Path, model: Path, own: bool) -> str:
    loop = "\n".join(f"{k} = {v}" for k, v in DEMO_LOOP.items())
    keys = ", ".join(f'"{k}" = "{v}"' for k, v in SECRETS.items())
    tenants = ", ".join(f'{k} = ["{k}"]' for k in SECRETS) if own else ""
    return f"""\
[proxy]
aliases = {{ agent = "" }}
admin_key = "{ADMIN_KEY}"
api_keys = {{ {keys} }}
tenants = {{ {tenants} }}

[collector]
db = "{work / "onjob.duckdb"}"

[trainer]
base_model = "{model}"
checkpoints_dir = "{work / "checkpoints"}"

[loop]
{loop}

[loop.gate.rewards]
exact = {{ fn = "two_tasks:referee" }}

[judge.rewards]
correct = {{ fn = "two_tasks:reward" }}
"""


def lineages(own: bool) -> dict[str, str]:
    """API key id -> the lineage that serves it."""
    return {k: (f"agent@{k}" if own else "agent") for k in TASKS}


def measure(engine_url: str, model: str, args, task: str) -> dict:
    ex = example_of(demo.Options(example=task))
    return ex.evaluate(engine_url, model, args.questions, args.samples)


def run_mode(mode: str, args, engine: EngineProcess, model: Path, base: str) -> dict:
    own = mode == "own"
    work = Path(tempfile.mkdtemp(prefix=f"onjob-tenant-learning-{mode}-"))
    (work / "two_tasks.py").write_text(REWARDS)
    (work / "onjob.toml").write_text(config(work, model, own))
    served = lineages(own)
    wanted = set(served.values())
    started = time.monotonic()
    server = ServerProcess(
        ["--config", str(work / "onjob.toml"), "--engine-url", engine.url],
        env={"PYTHONPATH": f"{work}:{ROOT}"},
        timeout=300,
        log=work / "serve.log",
        die_with_parent=True,
    )
    print(f"{mode}: serving at {server.url} (log {work / 'serve.log'})", flush=True)
    with server:
        traffic = {
            key: Traffic(server.url, example_of(demo.Options(example=task)), 1,
                          api_key=SECRETS[key])
            for key, task in TASKS.items()
        }  # fmt: skip
        for t in traffic.values():
            t.__enter__()
        try:
            decided: dict[str, dict] = {}
            while time.monotonic() - started < args.minutes * 60:
                status = httpx.get(f"{server.base}/admin/status", headers=ADMIN, timeout=60).json()
                history = msgspec.convert(status["deployments"][::-1], list[Routing])
                decided = {
                    name: decisions_of([h for h in history if h.model_alias == name])
                    for name in wanted
                }
                made = {
                    n: d["promotions"] + d["rollbacks"] + d["stopped"] for n, d in decided.items()
                }
                promoted = {n: d["promotions"] for n, d in decided.items()}
                print(
                    f"{mode}: {(time.monotonic() - started) / 60:.1f} min, decisions {made}, "
                    f"promotions {promoted}, "
                    f"requests { ({k: t.done for k, t in traffic.items()}) }",
                    flush=True,
                )
                if all(promoted.values()):
                    break
                time.sleep(30)
        finally:
            for t in traffic.values():
                t.__exit__(None, None, None)
        # The loop stops before the measurement, which has the engine to itself; the
        # server stays up, so the engine keeps serving its adapters.
        httpx.post(f"{server.base}/admin/loop", json={"running": False}, headers=ADMIN)
        loop_s = time.monotonic() - started
        aliases = status["aliases"]
        after = {}
        for key, task in TASKS.items():
            live = aliases.get(served[key], {}).get("live")
            after[key] = {**measure(engine.url, live or base, args, task), "model": live or base}
            print(f"{mode}: {task} on {live or 'the base model'}: {pct(after[key])}", flush=True)
    crossed, answered = cross_tenant(work / "onjob.duckdb", served) if own else (None, None)
    result = {
        "lineages": sorted(wanted),
        "decisions": decided,
        "loop_s": round(loop_s),
        "requests": {k: {"done": t.done, "errors": t.errors} for k, t in traffic.items()},
        "after": after,
        "answers_by_an_adapter": answered,
        "answers_by_another_tenants_adapter": crossed,
        "work": str(work),
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def cross_tenant(db: Path, served: dict[str, str]) -> tuple[int, int]:
    """Of the exchanges answered by an adapter, how many by one trained for another
    lineage than the key's (from the log and the train runs' lineage)."""
    store = Store(db)
    try:
        rows = store.dicts(
            "SELECT e.api_key_id AS key, t.config->>'lineage' AS lineage FROM exchanges e "
            "JOIN checkpoints c ON c.name = e.checkpoint JOIN train_runs t ON t.id = c.train_run "
            "WHERE e.api_key_id IS NOT NULL"
        )
    finally:
        store.close()
    return sum(r["lineage"] != served[r["key"]] for r in rows), len(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", nargs="+", choices=["own", "shared"], default=["own", "shared"])
    p.add_argument("--minutes", type=float, default=40.0, help="each mode's ceiling")
    p.add_argument("--questions", type=int, default=20, help="held-out questions per task")
    p.add_argument("--samples", type=int, default=4, help="samples per held-out question")
    p.add_argument("--engine", choices=["local", "vllm"], default="local")
    p.add_argument("--keep", action="store_true", help="keep each mode's work directory")
    args = harness.parse(p, timed=False)
    path = harness.path_for("tenant_learning", args.out)
    model = bundled.prepare()
    report: dict = {"args": vars(args), "before": {}, "modes": {}}
    work = Path(tempfile.mkdtemp(prefix="onjob-tenant-learning-engine-"))
    o = demo.Options(engine=args.engine)
    engine = EngineProcess(
        engine_args(o, model), timeout=900, log=work / "engine.log", die_with_parent=True
    )
    with engine:
        base = demo.base_model_of(engine.url)
        for key, task in TASKS.items():
            report["before"][key] = measure(engine.url, base, args, task)
            print(f"base model, {task}: {pct(report['before'][key])}", flush=True)
        for mode in args.modes:
            report["modes"][mode] = run_mode(mode, args, engine, model, base)
            harness.save("tenant_learning", report, path=path, quiet=True)
    print(json.dumps({m: r["after"] for m, r in report["modes"].items()}, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
