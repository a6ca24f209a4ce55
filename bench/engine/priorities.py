"""Live traffic first (issue 64): users' latency while the loop works, against the same
requests with the loop paused, and the loop's own sampling speed with no user waiting.

    .venv/bin/python -m bench.engine.priorities [--example arithmetic] [--minutes 20]
    .venv/bin/python -m bench.engine.priorities --before /path/to/older/checkout   # side by side
    .venv/bin/python -m bench.engine.priorities --steps-only   # a decode step's cost by batch rows
    .venv/bin/python -m bench.engine.priorities --mix 10   # a user, with an adapter loaded or not
    .venv/bin/python -m bench.engine.priorities --engine vllm   # the same on vLLM (priority policy)

One run, on the bundled SmolLM2-135M behind `onjob serve` as the demo starts it
(`examples/arithmetic/demo.py`: the example's reward function, the demo's loop):

1. the loop paused, the example's agent logs `--seed` conversations;
2. **paused**: a user sends `--probes` requests one after another (the example's
   questions, each answered with exactly 30 tokens on a seed of its own, so both phases
   time the same work; a pause of `--gap-s` between), the loop paused;
3. **running**: the loop resumes and the same user sends the same requests again, in turn,
   until the loop has run a judge pass, a training run and an offline test (or the
   `--minutes` ceiling); each request is labelled with the loop's stage when it was sent;
4. **background alone**: with no user request, `--background` requests as the judge
   sends them (`n` 8, background priority) straight to the engine: tokens per second.

Printed and written to bench/results/priorities-<timestamp>.json: p50 and p99 per phase
and per loop stage, the cores each process used in each stage (the engine, the server
with the proxy and the loop, the server's children: a training run), their ratios to
the paused phase (targets: p50 <= 1.2x, p99 <= 1.5x),
and the background tokens per second. With `--before DIR` the whole run is made twice,
the second time with DIR's onjob (an older commit's checkout) for the engine, the server
and the loop, so the ratios of the two and the background speed (target >= 0.9x of
before's) come from one sitting on one machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

import httpx

from bench import harness
from bench.engine.engine import tree  # a process and those below it
from bench.harness import ROOT
from examples.arithmetic.demo import (
    ADMIN,
    Options,
    Traffic,
    config,
    engine_args,
    example_of,
)
from onjob import bundled
from onjob.cli.process import EngineProcess, ServerProcess

BACKGROUND = 10  # onjob.judge.sampling.BACKGROUND, spelt here so --before can run too


def quantiles(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    cuts = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else xs * 99
    return {"n": len(xs), "p50": statistics.median(xs), "p99": cuts[98], "max": max(xs)}


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """A process's CPU seconds (its threads') and its reaped children's, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0, 0.0
    own = (int(fields[11]) + int(fields[12])) / TICK
    return own, (int(fields[13]) + int(fields[14])) / TICK


class Cpu:
    """The CPU the engine, the server (the proxy and the loop) and the server's children
    (a training run) spend, in seconds since the last `take`."""

    def __init__(self, engine: int, server: int) -> None:
        self.engine, self.server = engine, server
        self.last = self._now()

    def _now(self) -> dict[str, float]:
        own, reaped = cpu_seconds(self.server)
        children = sum(cpu_seconds(c)[0] for c in tree(self.server)[1:])  # a run, live
        return {
            "engine": cpu_seconds(self.engine)[0],
            "server": own,
            "children": reaped + children,
            "wall": time.monotonic(),
        }

    def take(self) -> dict[str, float]:
        now = self._now()
        spent = {k: max(0.0, now[k] - self.last[k]) for k in now}
        self.last = now
        return spent


class Stage:
    """The loop's stage, read from the admin status every half second, and the CPU each
    process spent in each stage (`cpu`, with `pids`: the engine's and the server's)."""

    def __init__(self, base: str, pids: tuple[int, int] | None = None) -> None:
        self.base, self.now, self.seen = base, "idle", set()
        self.cpu: dict[str, dict[str, float]] = {}
        self._meter = Cpu(*pids) if pids else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Stage:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._meter is not None:  # what the last half second cost, in its stage
                bucket = self.cpu.setdefault(self.now, {})
                for k, v in self._meter.take().items():
                    bucket[k] = bucket.get(k, 0.0) + v
            try:
                loop = httpx.get(f"{self.base}/admin/status", headers=ADMIN, timeout=30)
                self.now = loop.json()["loop"]["stage"]
                self.seen.add(self.now)
            except httpx.HTTPError:
                pass
            self._stop.wait(0.5)


# A user's request: the example's first messages, answered at its temperature with exactly
# PROBE_TOKENS tokens and a seed of its own, so that the paused and the running phase time
# the same work (an answer's length, which sampling and a promotion change, moved the
# paused p50 by a third between runs).
PROBE_TOKENS = 30


def probe(client, ex, question: str, seed: int) -> float:
    started = time.perf_counter()
    client.chat.completions.create(
        model="agent",
        messages=ex.first_messages(question),
        max_tokens=PROBE_TOKENS,
        temperature=1.0,
        seed=seed,
        extra_body={"min_tokens": PROBE_TOKENS},
    )
    return time.perf_counter() - started


def background_speed(engine_url: str, model: str, prompts: list[list[dict]]) -> float:
    """Tokens per second of judge-like requests (n 8, 48 tokens, background) one at a
    time, two in flight as the judge sends them."""
    done = [0]

    def one(messages):
        body = {
            "model": model,
            "messages": messages,
            "n": 8,
            "max_tokens": 48,
            "temperature": 1.0,
            "priority": BACKGROUND,
        }
        r = httpx.post(f"{engine_url}/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        done[0] += r.json()["usage"]["completion_tokens"]

    started = time.perf_counter()
    for i in range(0, len(prompts), 2):
        threads = [threading.Thread(target=one, args=(m,)) for m in prompts[i : i + 2]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return done[0] / (time.perf_counter() - started)


def step_costs() -> dict:
    """What a user's decode step costs with background rows beside it, and what a chunk
    of a background prompt's prefill costs, on the bundled model in this process (its
    threads: all this process may use)."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(bundled.prepare(), dtype=torch.float32).eval()
    out: dict = {"threads": torch.get_num_threads(), "step_ms": {}, "chunk_ms": {}}

    def run(ids, cache):
        return model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)

    with torch.inference_mode():
        for rows in (1, 2, 4, 8, 16):
            cache = run(torch.randint(100, 10000, (rows, 300)), DynamicCache()).past_key_values
            token = torch.randint(100, 10000, (rows, 1))
            for _ in range(3):
                run(token, cache)
            started = time.perf_counter()
            for _ in range(20):
                run(token, cache)
            out["step_ms"][rows] = (time.perf_counter() - started) / 20 * 1000
        for chunk in (8, 16, 32, 64):
            ids = torch.randint(100, 10000, (1, chunk))
            started = time.perf_counter()
            for _ in range(5):
                run(ids, DynamicCache())
            out["chunk_ms"][chunk] = (time.perf_counter() - started) / 5 * 1000
    return out


def one_run(args, root: Path, work: Path) -> dict:
    o = Options(dir=work, example=args.example, engine=args.engine)
    ex = example_of(o)
    model = bundled.prepare()
    env = {"PYTHONPATH": f"{root}{os.pathsep}{ROOT}"}
    work.mkdir(parents=True, exist_ok=True)
    with EngineProcess(
        engine_args(o, model, share=args.background_share),
        timeout=900,
        log=work / "engine.log",
        env=env,
    ) as engine:
        (work / "onjob.toml").write_text(config(o, model))
        server_args = ["--config", str(work / "onjob.toml"), "--engine-url", engine.url]
        with ServerProcess(server_args, env=env, timeout=300, log=work / "serve.log") as server:
            loop = f"{server.base}/admin/loop"
            httpx.post(loop, json={"running": False}, headers=ADMIN, timeout=60)
            print(f"[{root.name}] seeding {args.seed} conversations, the loop paused", flush=True)
            with Traffic(server.url, ex, 1) as traffic:
                while traffic.done < args.seed:
                    time.sleep(0.5)
            from openai import OpenAI

            client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=600)
            questions = [q for seed in range(1000, 1100) for q in ex.questions(seed)]
            paused = []
            print(f"[{root.name}] paused: {args.probes} requests", flush=True)
            asked = questions[: args.probes]  # both phases ask these, in this order
            for i, q in enumerate(asked):
                paused.append(probe(client, ex, q, i))
                time.sleep(args.gap_s)
            httpx.post(loop, json={"running": True}, headers=ADMIN, timeout=60)
            print(f"[{root.name}] running: until judge, train and offline test", flush=True)
            running: dict[str, list[float]] = {}
            deadline = time.monotonic() + args.minutes * 60
            with Stage(server.base, (engine.proc.pid, server.proc.pid)) as stage:
                i = 0
                wanted = {"judge", "train", "offline test"}
                while time.monotonic() < deadline and not (
                    wanted <= stage.seen and stage.now == "idle"
                ):
                    sent_in = stage.now
                    running.setdefault(sent_in, []).append(probe(client, ex, asked[i], i))
                    i = (i + 1) % len(asked)
                    time.sleep(args.gap_s)
                seen = sorted(stage.seen)
                cpu = {
                    name: {k: round(v / b["wall"], 2) for k, v in b.items() if k != "wall"}
                    | {"seconds": round(b["wall"])}
                    for name, b in stage.cpu.items()
                    if b.get("wall")
                }
            httpx.post(loop, json={"running": False}, headers=ADMIN, timeout=60)
        base = httpx.get(f"{engine.url}/models", timeout=30).json()["data"][0]["id"]
        print(f"[{root.name}] background alone: {args.background} requests", flush=True)
        prompts = [ex.first_messages(q) for q in questions[: args.background]]
        speed = background_speed(engine.url, base, prompts)
    everything = [x for xs in running.values() for x in xs]
    p, r = quantiles(paused), quantiles(everything)
    return {
        "root": str(root),
        "paused": p,
        "running": r,
        "running_by_stage": {k: quantiles(v) for k, v in running.items()},
        "stages_seen": seen,
        "cores_by_stage": cpu,  # CPU seconds per wall second: engine, server, its children
        "p50_ratio": r.get("p50", 0) / p["p50"] if p.get("p50") else None,
        "p99_ratio": r.get("p99", 0) / p["p99"] if p.get("p99") else None,
        "background_tokens_per_s": speed,
    }


def lines(result: dict) -> list[str]:
    def q(d):
        return f"p50 {d['p50']:.2f} s, p99 {d['p99']:.2f} s (n {d['n']})" if d["n"] else "none"

    out = [
        f"{result['root']}:",
        f"  loop paused:  {q(result['paused'])}",
        f"  loop running: {q(result['running'])}  -> p50 x{result['p50_ratio']:.2f}, "
        f"p99 x{result['p99_ratio']:.2f} (targets 1.2, 1.5)",
    ]
    for stage, d in sorted(result["running_by_stage"].items()):
        out.append(f"    sent during {stage}: {q(d)}")
    for stage, c in sorted(result.get("cores_by_stage", {}).items()):
        out.append(
            f"    cores during {stage} ({c['seconds']} s): engine {c['engine']:.2f}, "
            f"server {c['server']:.2f}, its children {c['children']:.2f}"
        )
    out.append(f"  background alone: {result['background_tokens_per_s']:.1f} tokens/s")
    return out


# The conditions of `--mix`: no adapter loaded and nothing beside the user; then, with
# the adapter loaded, nothing beside, or two background requests of 4 answers always in
# flight sampled by the base model, the adapter, or one each; or `pairs`, the offline
# test's shape: a short request per checkpoint (2 answers of 4 tokens), again and again.
MIXES = {
    "no adapter": [],
    "none": [],
    "base": ["base", "base"],
    "adapter": ["cand", "cand"],
    "both": ["base", "cand"],
    "pairs": ["base", "cand"],
}
ASK = [{"role": "user", "content": "Name three rivers of Europe and say why."}]
STORY = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def mix(users: int, work: Path) -> dict:
    """A user's answer (30 tokens, `users` of them one after another) in each of `MIXES`,
    on one engine process with the engine's default lanes: p50 and p99 seconds."""
    import torch

    from onjob.trainer import adapter
    from onjob.trainer.settings import TrainSettings

    lora = work / "adapter"
    if not lora.exists():  # the trainer's shape of adapter, as a first run writes it
        peft_model, _ = adapter.load(TrainSettings(), None, "cpu", torch.float32)
        peft_model.save_pretrained(lora)
    out: dict = {}
    args = ["--model", str(bundled.prepare())]
    with EngineProcess(args, timeout=900, log=work / "mix.log") as engine:
        base = httpx.get(f"{engine.url}/models", timeout=30).json()["data"][0]["id"]
        for name, lanes in MIXES.items():
            if name == "none":  # from here on, with the adapter loaded
                httpx.post(
                    f"{engine.base}/v1/load_lora_adapter",
                    json={"lora_name": "cand", "lora_path": str(lora)},
                    timeout=300,
                ).raise_for_status()
            models = [base if m == "base" else m for m in lanes]
            with _Background(engine.url, models, short=name == "pairs"):
                out[name] = quantiles([_answer(engine.url, base) for _ in range(users)])
            print(f"  {name:10s}: {out[name]['p50']:.2f} s p50", flush=True)
    return out


def _answer(url: str, model: str) -> float:
    body = {"model": model, "messages": ASK, "max_tokens": 30, "min_tokens": 30}
    started = time.perf_counter()
    httpx.post(f"{url}/chat/completions", json=body, timeout=600).raise_for_status()
    return time.perf_counter() - started


class _Background:
    """Background requests of `models` (one thread each), sent again and again until the
    block ends; the first ones decoding before it starts."""

    def __init__(self, url: str, models: list[str], short: bool) -> None:
        self.url, self.models, self.short = url, models, short
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(m,)) for m in models]

    def __enter__(self) -> _Background:
        for t in self.threads:
            t.start()
        time.sleep(2 if self.threads else 0)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def _run(self, model: str) -> None:
        body = {"model": model, "messages": STORY, "n": 2 if self.short else 4,
                "max_tokens": 4 if self.short else 48, "temperature": 1.0,
                "priority": BACKGROUND}  # fmt: skip
        while not self.stop.is_set():
            httpx.post(f"{self.url}/chat/completions", json=body, timeout=600)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--example", default="arithmetic")
    p.add_argument("--seed", type=int, default=40, help="conversations logged before")
    p.add_argument("--probes", type=int, default=30, help="requests with the loop paused")
    p.add_argument("--gap-s", type=float, default=1.0, help="pause between a user's requests")
    p.add_argument("--minutes", type=float, default=20, help="ceiling of the running phase")
    p.add_argument("--background", type=int, default=12, help="background requests alone")
    p.add_argument("--before", type=Path, help="an older checkout, run the same way after")
    p.add_argument(
        "--engine",
        choices=["local", "vllm"],
        default="local",
        help="the engine: onjob's own, or vLLM (`onjob engine install vllm` first) with its "
        "priority scheduling",
    )
    p.add_argument(
        "--background-share",
        type=float,
        help="the engine's engine.background_share (default: the engine's own)",
    )
    p.add_argument("--keep", type=Path, help="work directory (default: a temporary one)")
    p.add_argument(
        "--steps-only", action="store_true", help="only a decode step's cost by batch rows"
    )
    p.add_argument(
        "--mix",
        type=int,
        metavar="N",
        help="only N users' answers on one engine, without and with an adapter loaded, "
        "beside background rows of the base model, of the adapter and of both",
    )
    args = harness.parse(p)
    if args.mix:
        import tempfile

        work = args.keep or Path(tempfile.mkdtemp(prefix="onjob-priorities-"))
        harness.save("priorities-mix", {"users": args.mix, "mix": mix(args.mix, work)}, args.out)
        return
    if args.steps_only:
        costs = step_costs()
        print(f"on {costs['threads']} threads, a decode step at 300 tokens of context:")
        for rows, ms in costs["step_ms"].items():
            print(f"  {rows:2d} rows: {ms:6.1f} ms")
        for chunk, ms in costs["chunk_ms"].items():
            print(f"  a {chunk}-token prefill chunk: {ms:6.1f} ms")
        return
    import tempfile

    work = args.keep or Path(tempfile.mkdtemp(prefix="onjob-priorities-"))
    results = [one_run(args, ROOT, work / "now")]
    if args.before:
        results.append(one_run(args, args.before.resolve(), work / "before"))
    for r in results:
        print("\n".join(lines(r)))
    out = {"args": vars(args) | {"before": str(args.before)}}
    out["runs"] = results
    if args.before:
        now, before = results
        out["background_vs_before"] = (
            now["background_tokens_per_s"] / before["background_tokens_per_s"]
        )
        print(f"background alone, now / before: x{out['background_vs_before']:.2f} (target 0.9)")
    harness.save("priorities", out, args.out)


if __name__ == "__main__":
    main()
