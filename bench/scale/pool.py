"""Several engines behind one `onjob serve`, one killed and restarted under load.

N real local engines (the bundled SmolLM2-135M, a few tokens per answer) in
`proxy.engine_urls`, a live adapter and a canary on `agent` (loaded into each engine by
the server), concurrent openai clients each sending whole (not streamed) requests, every
request its own conversation. Part-way through, one engine is SIGKILLed, and after
`--down-for` seconds started again on its port, with no adapter. Reported:

- `failed_requests`: client requests that got an error while a healthy engine with the
  adapters existed (every engine but the killed one stays up, so: every failure). Target 0;
- `wrong_model`: answers (status 200) whose `served_model` in DuckDB is not the adapter
  their arm names (`checkpoint`). Target 0;
- `health_to_adapters_s`: from the restarted engine's first passing `/health` to its
  `/v1/models` listing both adapters (polled every 50 ms from outside the server).
  Target <= 5 s; `health_to_in_rotation_s`: to the server's `/admin/status` saying `up`;
- how the answered requests spread over the engines before the kill (requests the
  engines report cannot be told apart, so: the server's outstanding counts, sampled).

    python -m bench.scale.pool                          # 3 engines, 8 clients, 60 s
    python -m bench.scale.pool --engines 2 --seconds 20  # a quick look

Writes bench/results/pool-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from openai import APIStatusError, AsyncOpenAI

from bench import harness
from bench.engine.lora import random_adapter
from onjob import bundled
from onjob.cli.process import EngineProcess, ServerProcess
from onjob.collector import Store
from onjob.deploy.act import registry

LIVE, CANARY = "pool-live", "pool-canary"
ADMIN_KEY = "bench-admin"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def make_adapters(model_dir: Path, work: Path) -> dict[str, Path]:
    """Two small random LoRA adapters for the bundled model (they barely change it)."""
    return {
        name: random_adapter(model_dir, work / name, seed=seed, std=0.001)
        for seed, name in enumerate((LIVE, CANARY), start=1)
    }


async def client_loop(k: int, url: str, max_tokens: int, stop: asyncio.Event, log: list):
    client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    i = 0
    while not stop.is_set():
        i += 1
        started = time.monotonic()
        try:
            await client.chat.completions.create(
                model="agent",
                messages=[{"role": "user", "content": f"client {k}, question {i}: say hi"}],
                max_tokens=max_tokens,
            )
            log.append((started, time.monotonic() - started, 200, None))
        except APIStatusError as exc:
            log.append((started, time.monotonic() - started, exc.status_code, exc.message))
        except Exception as exc:  # a dropped connection: counted, never raised
            log.append((started, time.monotonic() - started, 0, repr(exc)))
    await client.close()


async def watch_return(engine_url: str, server: str, index: int, since: float) -> dict:
    """From outside: when the restarted engine's /health passes, when its /v1/models lists
    both adapters, and when the server puts it back (`up`)."""
    root = engine_url.removesuffix("/v1")
    marks: dict[str, float] = {}
    async with httpx.AsyncClient(headers=ADMIN, timeout=2) as http:
        while len(marks) < 3:
            now = time.monotonic()
            try:
                if "health" not in marks and (await http.get(f"{root}/health")).status_code == 200:
                    marks["health"] = now
                if "health" in marks and "adapters" not in marks:
                    models = (await http.get(f"{engine_url}/models")).json()["data"]
                    if {LIVE, CANARY} <= {m["id"] for m in models}:
                        marks["adapters"] = now
                if "health" in marks and "up" not in marks:
                    status = (await http.get(f"{server}/admin/status")).json()
                    if status["engines"][index]["state"] == "up":
                        marks["up"] = now
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            await asyncio.sleep(0.05)
    return {
        "restart_to_health_s": round(marks["health"] - since, 2),
        "health_to_adapters_s": round(marks["adapters"] - marks["health"], 2),
        "health_to_in_rotation_s": round(marks["up"] - marks["health"], 2),
    }


async def sample_spread(server: str, stop: asyncio.Event, samples: list):
    async with httpx.AsyncClient(headers=ADMIN, timeout=2) as http:
        while not stop.is_set():
            try:
                engines = (await http.get(f"{server}/admin/status")).json()["engines"]
                samples.append([e["outstanding"] for e in engines])
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            await asyncio.sleep(0.1)


async def run(args, engines: list[EngineProcess], server: ServerProcess, engine_args) -> dict:
    stop, spread_stop = asyncio.Event(), asyncio.Event()
    log: list = []
    spread: list = []
    clients = [
        asyncio.create_task(client_loop(k, server.url, args.max_tokens, stop, log))
        for k in range(args.clients)
    ]
    sampler = asyncio.create_task(sample_spread(server.base, spread_stop, spread))
    started = time.monotonic()
    await asyncio.sleep(args.kill_at)
    spread_stop.set()
    await sampler
    victim = engines[args.victim]
    victim.kill()
    killed = time.monotonic()
    print(f"killed engine {args.victim} at {killed - started:.1f} s", flush=True)
    await asyncio.sleep(args.down_for)
    restarted = time.monotonic()
    watcher = asyncio.create_task(watch_return(victim.url, server.base, args.victim, restarted))
    engines[args.victim] = await asyncio.to_thread(
        EngineProcess(engine_args, port=victim.port).start
    )
    returned = await asyncio.wait_for(watcher, timeout=120)
    print(f"engine {args.victim} back: {returned}", flush=True)
    await asyncio.sleep(max(0.0, args.seconds - (time.monotonic() - started)))
    stop.set()
    await asyncio.gather(*clients)
    return {
        "log": log,
        "spread": spread,
        "returned": returned,
        "killed_at_s": round(killed - started, 2),
        "wall_s": time.monotonic() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--kill-at", type=float, default=15, help="seconds into the load")
    parser.add_argument("--down-for", type=float, default=5)
    parser.add_argument("--victim", type=int, default=1, help="which engine is killed")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per engine")
    args = harness.parse(parser)

    model_dir = bundled.prepare()
    with tempfile.TemporaryDirectory(prefix="onjob-pool-") as tmp:
        work = Path(tmp)
        db = work / "onjob.duckdb"
        store = Store(db)
        for name, path in make_adapters(model_dir, work).items():
            registry.add(store, path, name, model_dir)
        store.close()
        engine_args = ["--model", str(model_dir), "--threads", str(args.threads)]
        engines = [EngineProcess(engine_args).start() for _ in range(args.engines)]
        env = {
            "ONJOB_LOOP__INTERVAL_S": "0",
            "ONJOB_PROXY__ENGINE_URLS": json.dumps([e.url for e in engines]),
            "ONJOB_PROXY__ADMIN_KEY": ADMIN_KEY,
        }
        try:
            with ServerProcess(["--db", str(db)], env=env, timeout=120) as server:
                for path, body in [
                    ("canary", {"alias": "agent", "checkpoint": LIVE, "fraction": 1.0}),
                    ("promote", {"alias": "agent"}),
                    ("canary", {"alias": "agent", "checkpoint": CANARY, "fraction": 0.5}),
                ]:
                    resp = httpx.post(
                        f"{server.base}/admin/{path}", json=body, headers=ADMIN, timeout=120
                    )
                    resp.raise_for_status()
                out = asyncio.run(run(args, engines, server, engine_args))
                server_log = server.output()
        finally:
            for e in engines:
                e.stop()
        store = Store(db)
        logged = store.dicts("SELECT status, arm, checkpoint, served_model FROM exchanges")
        store.close()

    log = out["log"]
    failed = [entry for entry in log if entry[2] != 200]
    answered = [r for r in logged if r["status"] == 200]
    wrong = [r for r in answered if r["served_model"] != r["checkpoint"]]
    latencies = sorted(entry[1] for entry in log if entry[2] == 200)
    spread = out["spread"]
    busy = [sum(1 for s in spread if s[i] > 0) / max(len(spread), 1) for i in range(args.engines)]
    fields = {
        "engines": args.engines,
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "seconds": round(out["wall_s"], 1),
        "killed_engine": args.victim,
        "killed_at_s": out["killed_at_s"],
        "down_for_s": args.down_for,
        "requests": len(log),
        "answered": len(log) - len(failed),
        "failed_requests": len(failed),
        "failures": Counter(f"{e[2]} {str(e[3])[:120]}" for e in failed).most_common(5),
        "logged_answers": len(answered),
        "wrong_model": len(wrong),
        "answers_by_checkpoint": Counter(r["checkpoint"] for r in answered),
        "requests_per_s": round(len(log) / out["wall_s"], 2),
        "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "latency_p99_s": round(latencies[int(0.99 * (len(latencies) - 1))], 3)
        if latencies
        else None,
        "share_of_samples_busy_per_engine_before_kill": [round(b, 2) for b in busy],
        **out["returned"],
        "server_warnings": [line for line in server_log.splitlines() if "onjob.proxy" in line][
            -10:
        ],
    }
    for key in ("failed_requests", "wrong_model", "health_to_adapters_s"):
        print(f"{key}: {fields[key]}")
    harness.save("pool", fields, args.out, machine={"engine_threads": args.threads})


if __name__ == "__main__":
    main()
