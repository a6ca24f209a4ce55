"""Serving and training on one host, side by side: what a training run costs the agent's
requests, and what the requests cost the run, under each way of sharing the cores.

For each policy (`--policies`, each `name=E:T:N[:beside]`: the engine's torch threads,
the trainer's, the trainer's nice, and `beside` for onjob's own policy: the engine
serves on the cores the run leaves while it trains, through `deploy.act.host.beside` and the
engine's `POST /onjob/threads`, as `onjob serve` does), on the bundled SmolLM2-135M and
the local engine:

- serving alone: `--agents` closed-loop agents (each sends its next request when the
  last is answered, as an agent does) for `--seconds`; p50 and p99 latency of a request
  (48 tokens at most, temperature 1), tokens/s;
- training alone: one `onjob train` run (bench/trainer/train_run.py's snapshot: `--groups`
  groups of the demo's shape) with no traffic; its CPU seconds and wall seconds per
  trained group;
- both: the same run while the agents keep sending; the same figures for each side,
  the requests measured only while the run trains.

    .venv/bin/python -m bench.trainer.sharing [--policies contend=2:2:0 ...] [--agents 2]

Prints a table and the ratios (during training / alone) and writes
bench/results/sharing-<timestamp>.json. Run it on an idle machine: nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from openai import OpenAI

from bench import harness
from bench.trainer import train_run
from onjob import bundled
from onjob.cli.process import EngineProcess

QUESTIONS = [f"What is {a} + {b}?" for a in range(1, 10) for b in range(1, 10)]
DEFAULT_POLICIES = [
    "contend=2:2:0",  # both on every core at the same priority: what the loop did before
    "split=1:1:0",  # a core each, always
    "share=2:1:0",  # the engine on both cores, the trainer on one of them
    "nice5=2:1:5",  # the same, the trainer at a lower priority
    "onjob=2:1:0:beside",  # a core each while the run trains, both the engine's between
]
# Not in the defaults: the trainer at nice 19 beside a busy engine got 12 CPU-seconds in
# 11 minutes (no run finished): priority alone starves a run while traffic lasts.


class Agents:
    """`n` closed-loop agents against the engine; latencies and tokens in a window."""

    def __init__(self, url: str, model: str, n: int):
        self.client = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
        self.model, self.n = model, n
        self.done: list[tuple[float, float, int]] = []  # (finished at, latency, tokens)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(n)]

    def __enter__(self) -> Agents:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _run(self, seed: int) -> None:
        i = seed
        while not self._stop.is_set():
            i += self.n
            started = time.monotonic()
            reply = self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                max_tokens=48,
                temperature=1.0,
            )
            now = time.monotonic()
            self.done.append((now, now - started, reply.usage.completion_tokens))

    def window(self, start: float, end: float) -> dict:
        """Requests that started and finished inside [start, end]."""
        rows = [(t, lat, n) for t, lat, n in self.done if t - lat >= start and t <= end]
        lat = sorted(lat for _, lat, _ in rows)
        if not lat:
            return {"requests": 0}
        return {
            "requests": len(rows),
            "p50_s": round(statistics.median(lat), 3),
            "p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3),
            "tokens_per_s": round(sum(n for *_, n in rows) / (end - start), 1),
        }


def train(snap: Path, out: Path, threads: int, nice: int) -> dict:
    """One `onjob train` run in a child process: its CPU and wall seconds per group."""
    from onjob.trainer.settings import TrainSettings

    settings = out.with_suffix(".json")
    settings.write_text(
        TrainSettings(
            threads=threads, nice=nice, learning_rate=2e-4, groups_per_step=2, kl_own_prompts=0
        ).model_dump_json()
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    command = ["train", "--snapshot", str(snap), "--out", str(out), "--settings", str(settings)]
    subprocess.run(
        [sys.executable, "-m", "onjob.cli", *command],
        check=True,
        capture_output=True,
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    groups = len(json.loads((out / "onjob-manifest.json").read_text())["groups"])
    return {
        "groups": groups,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "cpu_s_per_group": round(cpu / groups, 2),
        "wall_s_per_group": round(wall / groups, 2),
        "started": started,
        "ended": started + wall,
    }


def beside(url: str, threads: int, run):
    """`run()` while the engine serves on the cores it leaves, as the loop does."""
    import asyncio

    import httpx

    from onjob.deploy.act import host

    async def go():
        async with (
            httpx.AsyncClient(base_url=url) as engine,
            host.beside(engine, threads, print),
        ):
            return await asyncio.to_thread(run)

    return asyncio.run(go())


def policy(name: str, spec: str, snap: Path, work: Path, agents: int, seconds: float) -> dict:
    engine_threads, threads, nice, *flags = spec.split(":")
    engine_threads, threads, nice = int(engine_threads), int(threads), int(nice)
    model = bundled.prepare()
    print(f"== {name}: engine {engine_threads} threads, trainer {threads} at nice {nice}")
    with EngineProcess(["--model", str(model), "--threads", str(engine_threads)]) as engine:
        alone = train(snap, work / f"{name}-alone", threads, nice)
        print(f"  training alone: {alone['wall_s']} s, {alone['cpu_s_per_group']} CPU-s/group")
        with Agents(engine.url, str(model), agents) as load:
            # A warm-up, then serving alone, then the run beside the same traffic.
            time.sleep(10)
            start = time.monotonic()
            time.sleep(seconds)
            idle = load.window(start, time.monotonic())
            print(f"  serving alone: {idle}")
            run = lambda: train(snap, work / f"{name}-during", threads, nice)  # noqa: E731
            during = beside(engine.url, threads, run) if "beside" in flags else run()
            busy = load.window(during["started"], during["ended"])
        print(
            f"  training beside serving: {during['wall_s']} s, "
            f"{during['cpu_s_per_group']} CPU-s/group; serving meanwhile: {busy}"
        )
    return {
        "engine_threads": engine_threads,
        "trainer_threads": threads,
        "trainer_nice": nice,
        "engine_beside": "beside" in flags,
        "serving_alone": idle,
        "serving_while_training": busy,
        "training_alone": alone,
        "training_while_serving": during,
        "ratios": {
            "p50": _ratio(busy.get("p50_s"), idle.get("p50_s")),
            "p99": _ratio(busy.get("p99_s"), idle.get("p99_s")),
            "tokens_per_s": _ratio(busy.get("tokens_per_s"), idle.get("tokens_per_s")),
            "trainer_cpu_per_group": _ratio(during["cpu_s_per_group"], alone["cpu_s_per_group"]),
            "trainer_wall": _ratio(during["wall_s"], alone["wall_s"]),
        },
    }


def _ratio(a, b):
    return round(a / b, 2) if a and b else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", nargs="+", default=DEFAULT_POLICIES)
    parser.add_argument("--agents", type=int, default=1, help="closed-loop agents")
    parser.add_argument("--seconds", type=float, default=40, help="the serving-alone window")
    parser.add_argument("--groups", type=int, default=8, help="groups in the training run")
    args = harness.parse(parser)
    work = Path(tempfile.mkdtemp(prefix="onjob-sharing-"))
    snap = work / "snapshot.parquet"
    train_run.snapshot(snap, args.groups)
    rows = {}
    for entry in args.policies:
        name, _, spec = entry.partition("=")
        rows[name] = policy(name, spec, snap, work, args.agents, args.seconds)
    print(f"\n{'policy':<10} {'p50 x':>6} {'p99 x':>6} {'tok/s x':>8} {'train CPU/group x':>18}"
          f" {'train wall x':>13}")  # fmt: skip
    for name, r in rows.items():
        q = r["ratios"]
        print(
            f"{name:<10} {q['p50']:>6} {q['p99']:>6} {q['tokens_per_s']:>8} "
            f"{q['trainer_cpu_per_group']:>18} {q['trainer_wall']:>13}"
        )
    harness.save(
        "sharing",
        {"agents": args.agents, "groups": args.groups, "policies": rows},
        args.out,
        machine={"affinity": len(os.sched_getaffinity(0))},
    )


if __name__ == "__main__":
    main()
