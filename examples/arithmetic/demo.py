"""`onjob demo`: an unmodified agent gets better on a CPU while you watch.

In `--dir` (default ./onjob-demo, recreated on each run):

1. prepare the bundled SmolLM2-135M-Instruct, start `onjob engine` and measure its
   speed; size the evaluation and the groups to it and print an ETA;
2. start `onjob serve` on that engine, the loop configured for examples/arithmetic
   (reward: 1 for the sum alone, 0.5 among other numbers), and print the decision rule
   with its error rates (the family-wise error over every candidate; the first
   candidate's, estimated, `stats.promotion_chance`), saying where it is looser than
   production's;
3. measure the base model on the held-out questions (straight to the engine, unlogged);
4. run the arithmetic agent, an ordinary `openai` program, through the proxy while the
   loop re-samples, judges, trains, canaries and decides (the agent never pauses: the
   engine serves it while the trainer runs beside, as in production; `--paused` holds it
   while a run trains, the old mode), printing each stage, until
   `--rounds` canary decisions are made (the wall clock, `--minutes`, only a ceiling);
5. measure the live checkpoint on the same questions, print a before/after table, draw
   learning.png, write result.json; the database, the checkpoints and the logs stay.

A run that made no decision before the ceiling raises `NoDecision` (the CLI exits 3).
`--example calculator` runs examples/calculator instead (`Example`: its multi-turn,
tool-using agent, its held-out measure with the right-tool-call rate, its reward and
referee, which score each step on the step it takes, and its judge settings).
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec

from onjob import bundled
from onjob.cli.process import EngineProcess, ServerProcess
from onjob.collector import Store
from onjob.deploy import progress
from onjob.deploy.act import deployments, registry
from onjob.deploy.decide import ledger, stats
from onjob.deploy.decide.pairs import rule_of
from onjob.deploy.records import Routing
from onjob.deploy.settings import LoopSettings
from onjob.engine.settings import EngineSettings

from ..example import Example

ADMIN_KEY = "demo"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
MARKER = ".onjob-demo"
EXAMPLES = (
    "arithmetic",
    "calculator",
    "antonyms",
    "capitals",
    "plurals",
    "lookup",
    "languages",
    "extract",
    "sentiment",
    "weather",
    "library",
    "flights",
)


@dataclass
class Options:
    dir: Path = Path("onjob-demo")
    rounds: int = 2  # canary decisions to make (promotions or rollbacks)
    ceiling_s: float = 3600.0  # the wall clock's limit, evaluations included
    # The loop's time with the agent's traffic, the evaluations before and after outside
    # it (as a user's agent has the engine to itself and measures apart): with it, the
    # ceiling is not read. None: whatever the ceiling leaves after the evaluations.
    loop_s: float | None = None
    judge: str | None = None  # a litellm model for RULER instead of the reward function
    reward: str | None = None  # None: the example's
    gate: str | None = None  # the referee (`loop.gate`); None: the example's; "reward": none
    example: str = "arithmetic"  # one of EXAMPLES
    model: Path | None = None  # default: the bundled SmolLM2-135M-Instruct
    port: int = 0
    questions: int = 25
    samples: int = 8
    agents: int = 1  # conversations in flight
    audit: bool = False  # measure every checkpoint a promotion replaced, as well
    engine: str = "local"  # "local" or "vllm" (`onjob engine install vllm` first)
    # The agent holds its requests while a run trains, so the trainer has the cores: not
    # production conditions (an agent never pauses), kept to compare with.
    paused: bool = False


# The demo's loop: production's settings (what a loop fits to the traffic included) but
# for its rule, looser so that a CPU makes decisions in minutes: it is powered for a mean
# paired difference of +0.2, not +0.1, and allows 10% family-wise error, not 5%. `run`
# prints both rules' error rates.
DEMO_LOOP = {
    "delta": 0.2,
    "alpha": 0.1,
    # The 135M model sampled at temperature 1 spreads its answers wide, and learning a
    # task sharpens them: the offline benchmark's best runs (CISPO at 5e-4, +45 points)
    # end 0.40-0.50 nats per token from the base model, production's bound; a lineage of
    # two such candidates passes it. A diverged run reads tens of nats.
    "max_kl_to_base": 1.0,
}


def example_of(o: Options) -> Example:
    import importlib

    if o.example not in EXAMPLES:
        raise DemoError(f"no example {o.example!r}: choose one of {', '.join(EXAMPLES)}")
    return importlib.import_module(f"examples.{o.example}.example").EXAMPLE


def demo_loop(o: Options) -> dict:
    """The demo's `[loop]`, the same for every example: what a loop fits to the traffic
    (`deploy/decide/fit.py`: the held-out share, the groups that start a run) is left unset."""
    return dict(DEMO_LOOP)


def loop_settings(o: Options) -> LoopSettings:
    return LoopSettings(**demo_loop(o))


@dataclass(frozen=True)
class Plan:
    """What the demo sizes to the engine's measured speed."""

    tokens_per_s: float
    samples: int  # answers per held-out question
    eta_s: float


# Measured here (2 idle cores, SmolLM2-135M, fp32; bench/results/learning-20261123-*):
# 100 tokens/s sampling 8 at a time, and 740 s per decision (16 groups judged, 8 training
# steps, up to 8 paired rounds of 6 prompts).
REFERENCE_TOKENS_PER_S = 100.0
DECISION_S_AT_REFERENCE = 740.0


def plan(o: Options, tokens_per_s: float, sample_tokens: int) -> Plan:
    """Evaluations of about two minutes each (`sample_tokens`: what one held-out sample
    costs the engine, `Example.sample_tokens`); the ETA scales the reference machine's
    decision time by the speed."""
    budget = 120 * tokens_per_s / sample_tokens  # samples one evaluation may take
    samples = max(2, min(o.samples, int(budget // max(o.questions, 1))))
    slower = max(1.0, REFERENCE_TOKENS_PER_S / max(tokens_per_s, 1e-3))
    evaluation = o.questions * samples * sample_tokens / max(tokens_per_s, 1e-3)
    eta = 60 + 2.4 * evaluation + o.rounds * DECISION_S_AT_REFERENCE * slower
    return Plan(tokens_per_s, samples, eta)


def config(o: Options, model: Path) -> str:
    """The demo's onjob.toml: production's defaults (what the loop fits to the traffic
    included: docs/settings.md) but for the example's reward and referee, the demo's rule
    (`DEMO_LOOP`) and where it writes."""
    ex = example_of(o)
    reward, gate = o.reward or ex.reward, o.gate or ex.referee
    judge = (
        f'model = "{o.judge}"' if o.judge else f'[judge.rewards]\ncorrect = {{ fn = "{reward}" }}'
    )
    loop = "\n".join(f"{k} = {v}" for k, v in demo_loop(o).items())
    if gate != "reward":
        # The referee passes the reward's top grade only (for arithmetic: the sum and
        # nothing else); a hedge earns half a reward and loses the pairs.
        loop += f'\n\n[loop.gate.rewards]\nexact = {{ fn = "{gate}" }}'
    return f"""\
# Written by `onjob demo`; `onjob serve --config {o.dir}/onjob.toml --start-engine` serves
# it again.
[proxy]
aliases = {{ agent = "" }}
admin_key = "{ADMIN_KEY}"

[collector]
db = "{o.dir / "onjob.duckdb"}"

[engine]
args = {json.dumps(engine_args(o, model))}

[trainer]
base_model = "{model}"
checkpoints_dir = "{o.dir / "checkpoints"}"

[loop]
{loop}

[judge]
{judge}
"""


# The demo's engine puts its loop's rows in every step beside the agent's, one batch, as
# the local engine did before its lanes (issue 64): the demo's agent never pauses, and on
# two cores the production share (`engine.background_share`, 0.15) would give the loop's
# sampling a sixth of the engine, slowing its learning several times over. Production
# keeps users' answers within 1.18x; the demo says which it runs.
DEMO_BACKGROUND_SHARE = 1.0


def engine_args(o: Options, model, *, share: float | None = DEMO_BACKGROUND_SHARE) -> list[str]:
    """`onjob engine`'s flags: the engine's defaults, as `onjob serve --start-engine` starts
    it (every core this process may use; the trainer shares them by `trainer.threads`
    and `trainer.nice`: docs/training.md, "Sharing the host"), but for the demo's
    background share (None: the engine's own)."""
    if o.engine == "vllm":
        return ["--backend", "vllm", "--model", str(model)]
    lanes = [] if share is None else ["--background-share", f"{share:g}"]
    return ["--model", str(model), *lanes]


def say(text: str) -> None:
    print(text, flush=True)


def run(o: Options, echo=say) -> dict:
    """The whole demo; returns what result.json holds."""
    started, started_at = time.monotonic(), time.time()
    ex = example_of(o)
    clock = _Clock(started, echo)
    o.dir = _fresh(o.dir)
    clock.stage("preparing the model")
    model = o.model or bundled.prepare()
    seconds: dict[str, float] = {}
    which = "vLLM" if o.engine == "vllm" else "`onjob engine`"
    clock.stage(f"starting {which} (its log: engine.log) and measuring its speed")
    # Both children die with the demo however it ends (a SIGKILL runs no `with` exit): an
    # engine and a server left behind keep serving and training on the machine. Started
    # from the main thread, which the signal follows.
    engine = EngineProcess(
        engine_args(o, model), timeout=900, log=o.dir / "engine.log", die_with_parent=True
    )
    with engine:
        base = base_model_of(engine.url)
        p = plan(o, _speed(engine.url, base, ex), ex.sample_tokens)
        echo(
            f"  {p.tokens_per_s:.0f} tokens/s: {o.questions} held-out questions x {p.samples} "
            f"samples; ETA about {p.eta_s / 60:.0f} minutes for "
            f"{o.rounds} decisions (ceiling {o.ceiling_s / 60:.0f})"
        )
        if o.loop_s is None and p.eta_s > o.ceiling_s:
            echo(
                f"  the ETA is past the {o.ceiling_s / 60:.0f}-minute ceiling: this machine is "
                "slow or busy (the engine shares its cores); stop other work or raise --minutes"
            )
        for line in _rule_lines(loop_settings(o)):
            echo(f"  {line}")
        if o.engine == "local":
            production = EngineSettings.model_fields["background_share"].default
            echo(
                "  the engine decodes the loop's samples in every step beside the agent's "
                f"requests (engine.background_share {DEMO_BACKGROUND_SHARE:g}; production: "
                f"{production:g} of its time while users decode, so that a user's answer "
                f"takes at most {1 / (1 - production):.2f}x its time alone)"
            )
        (o.dir / "onjob.toml").write_text(config(o, model))
        args = ["--config", str(o.dir / "onjob.toml"), "--engine-url", engine.url]
        server = ServerProcess(
            args, port=o.port, env={"PYTHONPATH": str(Path.cwd())}, timeout=300,
            log=o.dir / "serve.log", die_with_parent=True,
        )  # fmt: skip
        seconds["start"] = clock.lap()
        clock.stage("starting onjob serve (its log: serve.log)")
        with server:
            clock.stage(
                f"measuring {base} on {o.questions} held-out questions x {p.samples} samples"
            )
            before = ex.evaluate(engine.url, base, o.questions, p.samples)
            seconds["eval_before"] = clock.lap()
            echo(f"  base model: {pct(before)} answers right")
            # Leave time for the same evaluation again (slower on a LoRA adapter: ~1.3x
            # here), the shutdown and the plot.
            deadline = (
                time.monotonic() + o.loop_s
                if o.loop_s is not None
                else started + o.ceiling_s - seconds["eval_before"] * 1.4 - 15
            )
            clock.stage(
                f"the agent's traffic through {server.url}; the loop re-samples, judges, "
                f"trains, canaries and decides, until {o.rounds} decision(s)"
            )
            with Traffic(server.url, ex, o.agents, paused=o.paused) as traffic:
                status = _watch(server, clock, deadline, o.rounds, _limit(o), traffic)
            # The loop stops before the final measurement, which has the engine to itself.
            httpx.post(
                f"{server.base}/admin/loop", json={"running": False}, headers=ADMIN, timeout=60
            )
            seconds["loop"] = clock.lap()
            live = status["aliases"]["agent"]["live"]
            clock.stage(f"measuring {live or base} on the same questions")
            after = ex.evaluate(engine.url, live or base, o.questions, p.samples)
            seconds["eval_after"] = clock.lap()
            echo(f"  {'live checkpoint' if live else 'base model'}: {pct(after)} answers right")
        store = Store(o.dir / "onjob.duckdb")  # the server is gone: the database is free
        try:
            groups = progress.group_rewards(store)
            history = list(reversed(deployments.history(store, 1000)))
            runs = store.scalar("SELECT count(*) FROM train_runs")
            timeline = training_timeline(store)
            formed = groups_formed(store)
            paths = {c.name: c.path for c in registry.checkpoints(store)}
        finally:
            store.close()
        audit = None
        if o.audit:
            clock.stage("measuring every checkpoint a promotion replaced")
            measured = {None: before, live: after} if live else {None: before}
            audit = _audit(engine.url, history, paths, measured, o, p, clock)
            seconds["audit"] = clock.lap()
    result = {
        "task": ex.task,
        "model": str(model),
        "engine": o.engine,
        "traffic": "paused while training" if o.paused else "never paused",
        "judge": o.judge or o.reward or ex.reward,
        "before": {**before, "model": base},
        "after": {**after, "model": live or base},
        "started": started_at,
        "wall_s": time.monotonic() - started,
        "stage_s": {**seconds, "loop_stages": status["loop"]["seconds"]},
        "train_runs": runs,
        "training": timeline,
        "kl_guard_stops": sum("KL guard" in (h.reason or "") for h in history),
        "groups_formed": formed,
        **decisions_of(history),
        "agent": {"requests": traffic.done, "errors": traffic.errors},
        "rewards": status["rewards"],
        "plan": {"tokens_per_s": p.tokens_per_s, "samples": p.samples, "eta_s": p.eta_s},
        "rule": rule_summary(loop_settings(o)),
        "gate": _gate(o, ex),
        "example_lines": ex.table(before, after),
        "audit": audit,
    }  # fmt: skip
    (o.dir / "result.json").write_text(json.dumps(result, indent=2, default=str))
    plotted = _plot(o.dir / "learning.png", groups, history, result)
    echo(_table(result))
    echo(f"\nin {o.dir}/: result.json, onjob.duckdb, checkpoints/, serve.log" + plotted)
    echo(
        f"to look around: onjob serve --config {o.dir}/onjob.toml --start-engine, then open "
        f"http://127.0.0.1:8000/dashboard (password: {ADMIN_KEY})"
    )
    if result["promotions"] + result["rollbacks"] + result["stopped"] == 0:
        raise NoDecision(
            f"no canary decision was made within the {_limit(o)} "
            "(the engine was slower than the ETA assumed, or the loop had too little to train "
            "on): run again with a higher --minutes; what ran is in " + str(o.dir)
        )
    return result


def _limit(o: Options) -> str:
    if o.loop_s is not None:
        return f"{o.loop_s / 60:.0f}-minute loop (evaluations apart)"
    return f"{o.ceiling_s / 60:.0f}-minute ceiling"


def _gate(o: Options, ex: Example) -> str:
    gate = o.gate or ex.referee
    return "the training reward" if gate == "reward" else gate


def _audit(
    engine_url, history: list[Routing], paths, measured, o: Options, p: Plan, clock
) -> list[dict]:
    """Each promotion: the held-out success of the checkpoint it promoted against the one it
    replaced (each measured once, loaded into the engine for it), and whether it is worse:
    by the point estimates, and beyond the 95% interval of the difference."""
    out, live, canary = [], None, None
    for row in history:
        if row.live != live and row.live == canary:
            out.append({"replaced": live, "promoted": row.live, "ts": str(row.ts)})
        live, canary = row.live, row.canary
    for promotion in out:
        for name in (promotion["replaced"], promotion["promoted"]):
            if name not in measured:
                httpx.post(
                    f"{engine_url}/load_lora_adapter",
                    json={"lora_name": name, "lora_path": paths[name]},
                    timeout=300,
                )  # an adapter already loaded answers 400: as good
                measured[name] = example_of(o).evaluate(engine_url, name, o.questions, p.samples)
                clock.line(f"{name}: {pct(measured[name])} answers right")
        old, new = measured[promotion["replaced"]], measured[promotion["promoted"]]
        change = new["success"] - old["success"]
        spread = 1.96 * math.sqrt(
            sum(r["success"] * (1 - r["success"]) / r["n"] for r in (old, new))
        )
        promotion.update(
            replaced_success=old,
            promoted_success=new,
            change=change,
            change_ci95=[change - spread, change + spread],
            worse=change < 0,
            significantly_worse=change + spread < 0,
        )
    return out


class _Clock:
    def __init__(self, started: float, echo):
        self.started, self.echo, self._lap = started, echo, started

    def stamp(self) -> str:
        s = int(time.monotonic() - self.started)
        return f"[{s // 60:2d}:{s % 60:02d}]"

    def stage(self, text: str) -> None:
        self.echo(f"{self.stamp()} == {text}")

    def line(self, text: str) -> None:
        self.echo(f"{self.stamp()}    {text}")

    def lap(self) -> float:
        """Seconds since the previous lap."""
        now = time.monotonic()
        took, self._lap = now - self._lap, now
        return round(took, 1)


class DemoError(Exception):
    """The demo cannot run here (said in one line)."""


class NoDecision(DemoError):
    """The ceiling came before any canary decision: the demo showed nothing it promised."""


def _speed(engine_url: str, model: str, ex: Example) -> float:
    """Tokens per second the engine samples, 8 answers at a time, after a warm-up."""
    body = {"model": model, "messages": ex.first_messages(ex.heldout(1)[0])}
    httpx.post(f"{engine_url}/chat/completions", json={**body, "max_tokens": 4}, timeout=300)
    t0 = time.monotonic()
    reply = httpx.post(
        f"{engine_url}/chat/completions",
        json={**body, "max_tokens": 32, "n": 8, "temperature": 1.0},
        timeout=600,
    ).json()
    return reply["usage"]["completion_tokens"] / (time.monotonic() - t0)


def rule_summary(s: LoopSettings) -> dict:
    """The demo's rule and production's: the family-wise error over every candidate
    (`alpha`: the chance that any candidate no better than live is ever promoted), the
    first candidate's share of it, and that candidate's promotion rates (estimated) when every
    pair is a win or a loss (d = +-1, no ties: the worst case for the error): one no
    better than live, and one winning 0.5 + delta of its pairs (a mean difference of
    2 delta: with +-1 pairs the spread is widest, so delta alone is hard to see)."""
    out = {}
    for name, rule_settings in (("demo", s), ("production", LoopSettings())):
        rule = rule_of(rule_settings)
        first = stats.spend(rule_settings.alpha, 1, ledger.planned_candidates(rule_settings))
        better = 0.5 + rule_settings.delta
        out[name] = {
            "margin": rule_settings.margin,
            "delta": rule_settings.delta,
            "alpha": rule_settings.alpha,
            "family_wise_error": rule_settings.alpha,
            "first_candidate_alpha": first,
            "better_win_rate": better,
            "promoted_when_no_better": stats.promotion_chance(rule, first, 0.5),
            "promoted_when_better_by_delta": stats.promotion_chance(rule, first, better),
            "max_kl_to_base": rule_settings.max_kl_to_base,
        }
    return out


def _rule_lines(s: LoopSettings) -> list[str]:
    r = rule_summary(s)
    demo, prod = r["demo"], r["production"]
    looser = demo["alpha"] > prod["alpha"] or demo["delta"] > prod["delta"]
    lines = [
        f"the rule: promote when the canary beats live on paired prompts (an e-process on "
        f"the referee's score differences, on a day's traffic it did not train on; "
        f"candidate k of a year tested at its share of alpha, plus the level of a promoted "
        f"one before it): "
        f"family-wise error {demo['family_wise_error']:g}, the chance that any candidate of "
        f"this run no better than live is promoted",
        f"  the first candidate (at {demo['first_candidate_alpha']:.3f}): one no better than "
        f"live promoted {demo['promoted_when_no_better']:.1%} of the time, one winning "
        f"{demo['better_win_rate']:.0%} of its pairs {demo['promoted_when_better_by_delta']:.0%}",
        (
            "  looser than production's rule, to fit a CPU's time: production's family-wise "
            f"error is {prod['family_wise_error']:g}, delta {prod['delta']:g} (its first "
            f"candidate: {prod['promoted_when_no_better']:.1%} promoted when no better, "
            f"{prod['promoted_when_better_by_delta']:.0%} when winning "
            f"{prod['better_win_rate']:.0%} of its pairs)"
            if looser
            else "  the same rule as production's"
        ),
    ]
    if demo["max_kl_to_base"] != prod["max_kl_to_base"]:
        lines.append(
            f"  the KL guard stops a candidate {demo['max_kl_to_base']:g} nats per token from the "
            f"base model (production: {prod['max_kl_to_base']:g}); a small model sampled at "
            "temperature 1 moves far as it learns"
        )
    return lines


def _fresh(path: Path) -> Path:
    path = path.resolve()
    if path.exists():
        if not (path / MARKER).exists() and any(path.iterdir()):
            raise DemoError(f"{path} exists and is not a demo directory: choose another --dir")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("written by onjob demo; recreated on each run\n")
    return path


def base_model_of(engine_url: str) -> str:
    """The id of the base model the engine at `engine_url` serves (the model without a
    `parent`, which its adapters have)."""
    models = httpx.get(f"{engine_url}/models", timeout=30).json()["data"]
    return next(m["id"] for m in models if not m.get("parent"))


class Traffic:
    """The example's agent: `agents` conversations at a time through the proxy, with the
    official client, until stopped, as production traffic: it never waits for the loop
    (with `paused`, the old mode, it holds new requests while the loop trains: `pace`).
    Errors are counted, not fatal (a canary may fail)."""

    def __init__(
        self,
        url: str,
        example: Example,
        agents: int,
        paused: bool = False,
        api_key: str = "unused",
    ):
        from openai import OpenAI

        self.client = OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=300)
        self.example, self.agents, self.paused = example, agents, paused
        self.done = self.errors = 0
        self._stop = threading.Event()
        self._go = threading.Event()
        self._go.set()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Traffic:
        for seed in range(self.agents):
            t = threading.Thread(target=self._run, args=(seed,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def pace(self, training: bool) -> None:
        """With `paused`: hold new requests while a training run has the cores (those in
        flight finish). Without, nothing: the agent's traffic goes on."""
        if self.paused:
            (self._go.clear if training else self._go.set)()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._go.set()
        # A request in flight may take a while on a busy engine; the threads are daemons,
        # so a Ctrl-C does not wait for it.
        for t in self._threads:
            t.join(timeout=5)

    def _run(self, seed: int) -> None:
        import openai

        while not self._stop.is_set():
            seed += self.agents
            for q in self.example.questions(seed):
                self._go.wait()
                if self._stop.is_set():
                    return
                try:
                    self.example.converse(self.client, q)
                    self.done += 1
                except openai.APIError:
                    self.errors += 1
                    self._stop.wait(1)


# What the demo shows of the server's log: the loop's stages, the trainer's steps,
# routing changes, errors. Not shown: each group's details.
_TRAINER = ("training on", "step ", "wrote ", "warm start")


def _watch(
    server: ServerProcess,
    clock: _Clock,
    deadline: float,
    rounds: int,
    limit: str,
    traffic: Traffic,
) -> dict:
    """Relay the loop's progress until `rounds` decisions or the ceiling (the agent paused
    while the loop trains only in the `paused` mode); the last status."""
    waiting = rewards = None
    while True:
        for line in server.new_lines():
            shown, waiting = _shown(line, waiting)
            if shown:
                clock.line(shown)
        status = httpx.get(f"{server.base}/admin/status", headers=ADMIN, timeout=60).json()
        traffic.pace(status["loop"]["stage"] == "train")
        summary = _reward_summary(status["rewards"])
        if summary and summary != rewards:
            clock.line(f"reward of re-sampled answers: {summary}")
            rewards = summary
        decided = decisions_of(msgspec.convert(status["deployments"][::-1], list[Routing]))
        made = decided["promotions"] + decided["rollbacks"] + decided["stopped"]
        if made >= rounds:
            clock.line(f"{rounds} canary decision(s) made: stopping the traffic")
            return status
        if time.monotonic() >= deadline:
            canary = status["aliases"]["agent"]["canary"]
            clock.line(
                f"the {limit} is near after "
                f"{made} of {rounds} decision(s)"
                + (f"; canary {canary} left undecided" if canary else "")
            )
            return status
        if server.proc.poll() is not None:
            raise DemoError(f"onjob serve exited with {server.proc.returncode}; see serve.log")
        time.sleep(2)


def _shown(line: str, waiting: str | None) -> tuple[str | None, str | None]:
    """The part of a log line the demo prints (None: nothing), and the last 'waiting' line."""
    _, sep, message = line.partition(" onjob.")
    if not sep:
        text = line.strip()
        if text.startswith(_TRAINER) or "Error" in text or "Traceback" in text:
            return f"trainer: {text}" if text.startswith(_TRAINER) else text, waiting
        return None, waiting
    _, _, message = message.partition(": ")
    if message.startswith(("  ", "re-sampling")):
        return None, waiting
    if message.startswith("judge pass:") and " scored 0," in message:
        return None, waiting
    if message.startswith("train:") and "waiting" in message:
        return (None, waiting) if message == waiting else (message, message)
    return message, waiting


def _reward_summary(rows: list[dict]) -> str:
    return ", ".join(
        f"{r['checkpoint'] or 'base'} {r['reward']:.2f} ({r['groups']} groups)" for r in rows
    )


def decisions_of(history: list[Routing]) -> dict:
    """Canaries started, promoted and rolled back, and candidates stopped by their offline
    test before serving anyone, from the deployments in time order; and each change's
    reason as the release wrote it (`why`), so a result file says why as well as how many."""
    out = {"canaries": 0, "promotions": 0, "rollbacks": 0, "stopped": 0}
    out["why"] = [row.reason for row in history if row.reason]
    canary = None
    for row in history:
        if row.canary and row.canary != canary:
            out["canaries"] += 1
        elif canary and not row.canary:
            out["promotions" if row.live == canary else "rollbacks"] += 1
        elif not canary and not row.canary and (row.reason or "").startswith("stopped before"):
            out["stopped"] += 1
        canary = row.canary
    return out


def pct(r: dict) -> str:
    """A held-out measurement as a line: success with its 95% interval, of how many."""
    low, high = r["ci95"]
    return f"{r['success']:.1%} [95% CI {low:.1%}, {high:.1%}] of {r['n']}"


def training_timeline(store: Store) -> dict:
    """When each training run started, counted from the agent's first request, with its
    groups, steps and the trust region's figures (the KL the release's guard reads)."""
    first = store.dicts("SELECT min(ts) AS ts FROM exchanges WHERE source = 'production'")[0]["ts"]
    rows = store.dicts(
        "SELECT created, duration_s, len(groups_used) AS groups, metrics FROM train_runs "
        "ORDER BY created"
    )
    runs = []
    for r in rows:
        m = json.loads(r["metrics"]) if isinstance(r["metrics"], str) else (r["metrics"] or {})
        started = (r["created"] - first).total_seconds() - (r["duration_s"] or 0) if first else None
        runs.append({
            "started_s": None if started is None else round(started, 1),
            "took_s": round(r["duration_s"] or 0, 1),
            "groups": r["groups"],
            **{k: m.get(k) for k in ("steps", "kl_to_base", "kl_to_base_own", "kl_budget",
                                     "undone_steps", "trust_stopped", "skipped_groups")},
        })  # fmt: skip
    return {"first_run_started_s": runs[0]["started_s"] if runs else None, "runs": runs}


def groups_formed(store: Store) -> dict:
    """The groups the judge formed: turn groups on turns whose logged answer called a tool
    and on other turns, and trajectory groups with the conversations in them."""
    row = store.dicts(
        """
        SELECT count(*) FILTER (WHERE g.kind = 'turn' AND coalesce(json_array_length(
                   e.response -> '$.choices[0].message.tool_calls'), 0) > 0) AS tool_call_turns,
               count(*) FILTER (WHERE g.kind = 'turn') AS turns,
               count(*) FILTER (WHERE g.kind = 'trajectory') AS trajectories,
               (SELECT count(*) FROM members m JOIN groups t ON t.id = m.group_id
                WHERE t.kind = 'trajectory') AS conversations
        FROM groups g LEFT JOIN exchanges e ON e.id = g.prefix_exchange
        """
    )[0]
    return {
        "tool_call_turn_groups": row["tool_call_turns"],
        "other_turn_groups": row["turns"] - row["tool_call_turns"],
        "trajectory_groups": row["trajectories"],
        "conversations_in_trajectory_groups": row["conversations"],
    }


def _groups_line(g: dict | None) -> str:
    if not g:
        return "judge groups: none recorded"
    return (
        f"judge groups: {g['tool_call_turn_groups']} on tool-call turns, "
        f"{g['other_turn_groups']} on other turns, {g['trajectory_groups']} trajectory groups "
        f"({g['conversations_in_trajectory_groups']} conversations)"
    )


def _table(r: dict) -> str:
    b, a = r["before"], r["after"]
    width = max(len(b["model"]), len(a["model"]))
    loop = ", ".join(f"{k} {v:.0f} s" for k, v in r["stage_s"]["loop_stages"].items())
    stages = r["stage_s"]
    return "\n".join(
        [
            "",
            f"held-out success ({b['n']} sampled answers to the held-out questions):",
            f"  before  {b['model']:<{width}}  {pct(b)}",
            f"  after   {a['model']:<{width}}  {pct(a)}",
            f"  change  {(a['success'] - b['success']) * 100:+.1f} points",
            *r.get("example_lines", ()),
            *_audit_lines(r.get("audit")),
            _groups_line(r.get("groups_formed")),
            f"{r['train_runs']} training runs, {r['canaries']} canaries, "
            f"{r['promotions']} promoted, {r['rollbacks']} rolled back, {r['stopped']} stopped "
            "before serving anyone; "
            f"{r['agent']['requests']} agent requests ({r['agent']['errors']} errors), "
            f"traffic {r.get('traffic', 'paused while training')}",
            f"wall time {r['wall_s']:.0f} s: start {stages['start']:.0f} s, "
            f"evaluations {stages['eval_before'] + stages['eval_after']:.0f} s, "
            f"loop {stages['loop']:.0f} s ({loop})",
        ]
    )


def _audit_lines(audit: list[dict] | None) -> list[str]:
    if audit is None:
        return []
    worse = sum(a["worse"] for a in audit)
    lines = [f"{len(audit)} promotion(s), {worse} to a checkpoint worse on held-out questions:"]
    for a in audit:
        low, high = a["change_ci95"]
        lines.append(
            f"  {a['replaced'] or 'base'} -> {a['promoted']}: "
            f"{a['replaced_success']['success']:.1%} -> {a['promoted_success']['success']:.1%} "
            f"({a['change'] * 100:+.1f} points, 95% {low * 100:+.1f} to {high * 100:+.1f})"
        )
    return lines


def _plot(path: Path, groups: list[dict], history: list[Routing], result: dict) -> str:
    """learning.png; the sentence the demo adds about it."""
    try:
        from .plot import learning_curve
    except ImportError:
        return "\n(no plot: matplotlib is missing; pip install 'onjob[demo]')"
    learning_curve(path, groups, history, result)
    return f"\nplot: {path}"
