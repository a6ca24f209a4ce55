"""How often the release rule is wrong over a year of candidates, how many good ones it
promotes, whether a good candidate still gets through late in the year, and what each
decision costs the engine: the loop simulated with the project's own objects
(`pairs.rule_of`: the e-process `stats.Rule`; `ledger.enter`, `ledger.settle` and
`ledger.level` on a real DuckDB ledger: each candidate's level, the period's plan, what a
promotion passes on; `ledger.backoff_s` and `loop.max_candidates_per_day`; `noise.size`:
the answers per arm each round, from the referee's noise measured on the pairs so far;
`prompts.fresh` on a real day of traffic for the low-traffic case), under production's
settings and the demo's.

Every score model scores each answer (`Referee`), k answers per arm per prompt, the i-th
answers of both arms on one seed; a pair's difference is d = mean(candidate's k) -
mean(live's k), and the rule sizes k round by round from the pairs so far, as the loop
does (`loop.gate.samples` unset), within `loop.decision_tokens` at `PROMPT_TOKENS` per
arm's prompt and `ANSWER_TOKENS` per answer (stated, not measured):

- `passfail`: each answer right or wrong. A prompt's chance that live is right is
  logit-normal around 1/2 (prompts of every difficulty), the candidate's is shifted in
  logit by the same amount plus a per-prompt spread (`between`), and on one seed both
  arms' answers come out alike a share of the time (`seed_share`) where both could;
- `sign`: the pass/fail referee of issue 63's first simulation, no prompt structure: each
  answer pair is a tie 20% of the time (both right or both wrong), else a win 50% + 10
  points of the time for a "+0.1" candidate (E[d] = 0.16);
- `graded`: a score in (0, 1) per answer, logit-normal around the prompt's mean (a
  RULER-like referee): a pair's d at one answer per arm has spread 0.24, as the pair
  model of earlier runs (20% ties, spread 0.25);
- `noisy`: the same with three times the answer noise: spread 0.40 at one answer.

A candidate's kind (`MIX`) is its mean difference over the traffic, E[d] (sign: ten
points of win rate on decided answer pairs).

The judge: each attempt to score a pair fails with chance `--judge-failures` (2%), at
random (a provider's 429, a timeout); the loop judges a failed pair again, up to
`loop.rejudge_attempts` attempts in all. `--stuck` (0 by default) adds a share of pairs
the referee never scores. A pair never scored is *set aside* (the referee failed on the
whole call: `stats.Paired.set_aside`) and another prompt is drawn; `--stuck-on-losses`
makes those pairs the candidate's worst (the referee choking on its answers, the case
the set-aside rule must not reward), measured on a no-better candidate at each rank.

A year: the loop trains a candidate (`TRAIN_S`), tests it on `holdout_pairs` held-out
pairs (their own test), then on rounds of `pairs_per_round` pairs until the rule decides,
at the engine's measured speed (`PAIRS_PER_S`); then the next one as the budget and the
back-off allow. A promoted one becomes live. Pairs here are independent draws of the
candidate's mean over the traffic; `low_traffic` is the case where they are not.

Reported per settings: P(any bad promotion in a year, and in a month) (bad: E[d] <= 0),
good promotions per month, per kind the share promoted, pairs, answers per arm and engine
tokens to a decision; then a +0.1 candidate and a no-better one at the levels of the
1st, 60th and 500th candidate of a period; the hedging candidate of issue 33; and the
low-traffic agent case: 20 conversations an hour, 20% of them 10-turn agent runs, a
candidate exactly no better over the turns served (better on short conversations, worse
on long ones), tested at the first candidate's level with today's draw and with the
draw before issue 63 (odds by turns left, no length strata).

Targets (issue 63): pass/fail, a +0.1 candidate promoted >= 80% as the 1st and as the
500th of its period; P(any no-better promotion in a year) <= alpha on every score model;
the low-traffic case at or below the candidate's level; engine tokens reported.

    python -m bench.release.decisions [--scores passfail] [--streams 10] [--years 2] [--reps 400]
        [--settings production] [--low-traffic-reps 300] [--stuck 0.02] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench import harness
from examples.arithmetic.demo import Options, loop_settings
from onjob.collector import Store
from onjob.deploy.decide import ledger, noise, pairs, prompts, stats
from onjob.deploy.decide.pairs import rule_of
from onjob.deploy.settings import GateSettings, LoopSettings
from onjob.proxy.tenants import Lineage

TIES = 0.2  # the pair models' (and `sign`'s) answer pairs scored alike
SD = 0.25  # the pair model's spread of a graded difference that is not a tie
MIX = {  # kind: (share of candidates, true E[d] over the traffic)
    "no better": (0.45, 0.0),
    "worse": (0.25, -0.1),
    "better": (0.2, 0.1),
    "much better": (0.1, 0.2),
}
DAY = 86400.0
YEAR = 365 * DAY
MONTH = YEAR / 12
START = datetime(2026, 1, 1, tzinfo=UTC)
# A training run's wall time (stated), and pairs per second at the engine's speed (2
# answers and a judgement each), as measured on this 2-core machine with vLLM's CPU build
# and the bundled model judging (docs/benchmarks.md, "Learning": 44 pairs in 451 s).
TRAIN_S = {"production": 600.0, "demo": 300.0}
PAIRS_PER_S = 0.1
# What a pair costs the engine (stated): an agent's prompt per arm, a short answer.
PROMPT_TOKENS = 800
ANSWER_TOKENS = 150
RANKS = (1, 60, 500)


def load_turns(store: Store, rows: list[dict]) -> None:
    """Logged production turns of scenario `scn` (id, ts, c: the conversation, turn,
    request, response), loaded in one statement from a file: DuckDB's executemany takes
    a minute for a day's rows."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
        f.flush()
        store.con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, model_alias, arm, "
            "stream, request, response, status, latency_ms, source) "
            "SELECT id, CAST(ts AS TIMESTAMPTZ), c, turn, 'scn', 'agent', 'live', false, "
            "request, response, 200, 50, 'production' FROM read_json(?, columns = {id: "
            "'VARCHAR', ts: 'VARCHAR', c: 'VARCHAR', turn: 'INTEGER', request: 'VARCHAR', "
            "response: 'VARCHAR'})",
            [f.name],
        )


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


@dataclass(frozen=True)
class Referee:
    """A referee scoring each answer, over prompts of varied difficulty (module doc)."""

    name: str
    kind: str  # passfail | sign | graded
    spread: float = 1.5  # sd of live's logit per prompt (prompts' difficulty)
    between: float = 0.3  # sd of the candidate's logit shift from prompt to prompt
    noise: float = 0.0  # graded: sd of one answer's logit around its prompt's
    seed_share: float = 0.3  # answer pairs drawn alike by the common seed, where both can

    def pair(self, rng: random.Random, shift: float, k: int) -> tuple[list[float], list[float]]:
        """Live's and the candidate's k answers' scores on one prompt; `shift`: the
        candidate's logit shift (`calibrated`), or its win rate over 1/2 (`sign`)."""
        if self.kind == "sign":
            a, b = [], []
            for _ in range(k):
                u = rng.random()
                if u < TIES:
                    x = float(rng.random() < 0.5)
                    a.append(x), b.append(x)
                else:
                    win = rng.random() < 0.5 + shift
                    a.append(0.0 if win else 1.0), b.append(1.0 if win else 0.0)
            return a, b
        lp = rng.gauss(0, self.spread)
        lq = lp + shift + self.between * rng.gauss(0, 1)
        a, b = [], []
        if self.kind == "passfail":
            p, q = sigmoid(lp), sigmoid(lq)
            for _ in range(k):
                u = rng.random()
                v = u if rng.random() < self.seed_share else rng.random()
                a.append(float(u < p)), b.append(float(v < q))
            return a, b
        for _ in range(k):
            e = rng.gauss(0, 1)
            f = e if rng.random() < self.seed_share else rng.gauss(0, 1)
            a.append(sigmoid(lp + self.noise * e)), b.append(sigmoid(lq + self.noise * f))
        return a, b


REFEREES = {
    "passfail": Referee("passfail", "passfail"),
    "sign": Referee("sign", "sign"),
    "graded": Referee("graded", "graded", spread=1.0, noise=1.35, seed_share=0.5),
    "noisy": Referee("noisy", "graded", spread=1.0, noise=2.6, seed_share=0.3),
}


def calibrated(ref: Referee, mean: float) -> float:
    """The candidate's logit shift that makes its mean difference over the traffic `mean`
    (for `sign`, its win rate over 1/2: 10 points per 0.1). Live's answers average 1/2;
    the candidate's are sigmoid(shift + tau Z), tau the spread of its answers' logits over
    prompts and answers, whose mean is read on a grid of Z (exact to 1e-6)."""
    if ref.kind == "sign":
        return mean
    tau = math.sqrt(ref.spread**2 + ref.between**2 + ref.noise**2)
    grid = [-8 + 16 * i / 4000 for i in range(4001)]
    weights = [math.exp(-z * z / 2) for z in grid]
    total = sum(weights)

    def mean_at(shift: float) -> float:
        at = sum(w * sigmoid(shift + tau * z) for w, z in zip(weights, grid, strict=True))
        return at / total - 0.5

    low, high = -6.0, 6.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if mean_at(mid) < mean else (low, mid)
    return (low + high) / 2


_SHIFTS: dict[tuple[str, float], float] = {}


def shift_of(ref: Referee, mean: float) -> float:
    key = (ref.name, mean)
    if key not in _SHIFTS:
        _SHIFTS[key] = calibrated(ref, mean)
    return _SHIFTS[key]


@dataclass(frozen=True)
class Judge:
    """How the referee fails: each attempt at random, and a share of pairs for ever
    (`stuck`), at random or on the candidate's worst answers (`on_losses`)."""

    failures: float
    stuck: float
    attempts: int
    on_losses: bool = False

    def unjudged(self, rng: random.Random) -> bool:
        """Whether a pair stays unjudged after every attempt (the loop judging it again)."""
        if not self.on_losses and rng.random() < self.stuck:
            return True
        return all(rng.random() < self.failures for _ in range(self.attempts))


def draw(rng: random.Random, mean: float, scores: str, judge: Judge) -> float:
    """bench/release/drift.py's pair model: one pair's difference for a candidate `mean` better
    than live, drawn whole (graded: 20% ties, else 2 Beta - 1 with spread `SD`; sign:
    +-1), nan when the judge never scored it."""
    if judge.unjudged(rng):
        return float("nan")
    if rng.random() < TIES:
        return 0.0
    if scores == "sign":
        return 1.0 if rng.random() < 0.5 + mean else -1.0
    m = mean / (1 - TIES)
    mid = (1 + m) / 2
    c = mid * (1 - mid) / (SD * SD / 4) - 1
    return 2 * rng.betavariate(mid * c, (1 - mid) * c) - 1


@dataclass
class Decided:
    kind: str
    mean: float
    at: float  # seconds into the stream when its test started
    decision: str  # promote | rollback | stopped | short
    pairs: int  # every pair made, held-out and set aside included
    rounds: int
    tokens: float  # the engine's, for every pair
    answers: list[int] = field(default_factory=list)  # per arm, each round's
    aside: int = 0  # pairs set aside: the referee never scored them

    @property
    def year(self) -> int:
        return int(self.at // YEAR)

    @property
    def month(self) -> int:
        return int(self.at // MONTH)

    @property
    def wall_s(self) -> float:
        return self.pairs / PAIRS_PER_S


@dataclass
class Source:
    """Where a test's pairs come from: the referee on a candidate `mean` better, the judge,
    and (low traffic) the prompts' kinds in the order drawn, each with its own mean."""

    ref: Referee
    mean: float
    judge: Judge
    rng: random.Random
    kinds: list[float] | None = None  # per prompt, its mean; None: every prompt `mean`
    used: int = 0

    def next(self, k: int) -> tuple[list[float], list[float]] | str | None:
        """A prompt's pair at k answers per arm; None when the prompts ran out; "aside"
        when the referee never scored it."""
        if self.kinds is not None:
            if self.used >= len(self.kinds):
                return None
            mean = self.kinds[self.used]
        else:
            mean = self.mean
        self.used += 1
        a, b = self.ref.pair(self.rng, shift_of(self.ref, mean), k)
        if self.judge.unjudged(self.rng):
            return "aside"
        if self.judge.on_losses and self.judge.stuck:
            d = statistics.fmean(b) - statistics.fmean(a)
            # The referee chokes on the candidate's worst answers: a share `stuck` of all
            # pairs, taken from its losses (probability stuck / P(loss) on each loss).
            if d < 0 and self.rng.random() < min(1.0, self.judge.stuck / 0.4):
                return "aside"
        return a, b


def test_one(
    rule: stats.Rule, s: LoopSettings, alpha: float, src: Source, at: float, kind: str
) -> Decided:
    """One candidate through the loop's tests: the held-out slice's own (stopped when
    shown worse than live there), then rounds of the release test until the rule decides,
    each round's answers per arm sized by `noise.size` on the pairs so far."""
    cost = noise.Cost(PROMPT_TOKENS, ANSWER_TOKENS)
    measuring = noise.Measuring()
    tokens, answers = 0.0, []

    def k_now() -> int:
        if s.gate.samples is not None:
            return s.gate.samples
        sized = noise.size(
            measuring.noise(), cost, alpha=alpha, edge=s.delta, max_pairs=s.max_pairs,
            budget=s.decision_tokens, top=1 / (1 + s.margin),
        )  # fmt: skip
        return sized.answers

    def add(paired: stats.Paired, n: int) -> bool:
        nonlocal tokens
        k = k_now()
        answers.append(k)
        for _ in range(n):
            pair = src.next(k)
            if pair is None:
                return False
            tokens += cost.per_pair(k)
            if pair == "aside":
                paired.set_aside()
                continue
            a, b = pair
            measuring.add(a, b)
            paired.add(statistics.fmean(b) - statistics.fmean(a))
        return True

    held = stats.Paired(margin=-s.delta, delta=s.delta)
    if src.kinds is None:
        add(held, s.holdout_pairs)
        if pairs.HeldOut(held, s.beta).worse:
            return Decided(kind, src.mean, at, "stopped", held.drawn, 0, tokens, answers,
                           held.aside)  # fmt: skip
    paired, rounds = rule.start(), 0
    while True:
        full = add(paired, s.pairs_per_round)
        rounds += 1
        decision = rule.decision(paired, alpha)
        if decision != "wait":
            return Decided(kind, src.mean, at, decision, held.drawn + paired.drawn, rounds,
                           tokens, answers, held.aside + paired.aside)  # fmt: skip
        if not full:  # a stratum ran out: the test waits for traffic (here: undecided)
            return Decided(kind, src.mean, at, "short", held.drawn + paired.drawn, rounds,
                           tokens, answers, held.aside + paired.aside)  # fmt: skip


def stream(
    name: str, s: LoopSettings, ref: Referee, judge: Judge, years: int, rng: random.Random
) -> tuple[list[Decided], list[int]]:
    """Every candidate of one simulated stream of `years` years, in order, each tested at
    the level the ledger gives it; and the ranks the levels were at."""
    rule = rule_of(s)
    store = Store(":memory:")
    t, failures, out, ranks = 0.0, 0, [], []
    today, today_count = 0, 0
    kinds = list(MIX)
    weights = [MIX[c][0] for c in kinds]
    try:
        while True:
            t += ledger.backoff_s(s, failures)
            if s.max_candidates_per_day is not None:
                if int(t // DAY) != today:
                    today, today_count = int(t // DAY), 0
                if today_count >= s.max_candidates_per_day:
                    t = (today + 1) * DAY
                    today, today_count = today + 1, 0
            t += TRAIN_S[name]
            if t >= years * YEAR:
                return out, ranks
            today_count += 1
            name_k = f"c{len(out) + 1}"
            ledger.enter(store, "agent", name_k, START + timedelta(seconds=t))
            level = ledger.level(store, "agent", name_k, s)
            ranks.append(level.rank)
            kind = rng.choices(kinds, weights)[0]
            src = Source(ref, MIX[kind][1], judge, rng)
            d = test_one(rule, s, level.alpha, src, t, kind)
            out.append(d)
            t += d.pairs / PAIRS_PER_S  # offline rounds run back to back
            outcome = {"promote": "promoted", "rollback": "rolled_back"}.get(d.decision, "stopped")
            ledger.settle(store, "agent", name_k, outcome, START + timedelta(seconds=t))
            failures = 0 if d.decision == "promote" else failures + 1
    finally:
        store.close()


def summary(ds: list[Decided]) -> dict:
    return {
        "candidates": len(ds),
        "promoted": round(sum(d.decision == "promote" for d in ds) / len(ds), 4),
        "stopped_on_held_out": round(sum(d.decision == "stopped" for d in ds) / len(ds), 4),
        "median_pairs": statistics.median(d.pairs for d in ds),
        "median_answers_per_arm": statistics.median(d.answers[-1] if d.answers else 0 for d in ds),
        "median_tokens": statistics.median(d.tokens for d in ds),
        "p90_tokens": statistics.quantiles([d.tokens for d in ds], n=10)[-1] if len(ds) > 1 else 0,
        "median_wall_s_at_engine_speed": statistics.median(d.wall_s for d in ds),
        "set_aside_share": sum(d.aside for d in ds) / max(1, sum(d.pairs for d in ds)),
        "broken_stops": sum(d.decision == "rollback" and d.aside > 0 for d in ds) / len(ds),
    }


def measure(
    name: str, s: LoopSettings, ref: Referee, judge: Judge, streams: int, years: int, seed: int
) -> dict:
    rng = random.Random(f"{seed}-{name}-{ref.name}")
    runs = [stream(name, s, ref, judge, years, rng) for _ in range(streams)]
    by_year = [[d for d in r if d.year == y] for r, _ in runs for y in range(years)]
    months = [[d for d in r if d.month == m] for r, _ in runs for m in range(12 * years)]
    bad = sum(any(d.decision == "promote" and d.mean <= 0 for d in y) for y in by_year)
    bad_months = sum(any(d.decision == "promote" and d.mean <= 0 for d in m) for m in months)
    good = [sum(d.decision == "promote" and d.mean > 0 for d in y) for y in by_year]
    per_kind = {
        kind: summary(ds)
        for kind in MIX
        if (ds := [d for y in by_year for d in y if d.kind == kind])
    }
    return {
        "years": len(by_year),
        "any_bad_promotion_in_a_year": bad / len(by_year),
        "any_bad_promotion_in_a_month": bad_months / len(months),
        "bad_candidates": sum(d.mean <= 0 for y in by_year for d in y),
        "target_met": bad / len(by_year) <= s.alpha,
        "good_promotions_per_month": round(statistics.mean(good) / 12, 3),
        "candidates_per_year": round(statistics.mean(len(y) for y in by_year), 1),
        "highest_rank": max(max(ranks) for _, ranks in runs),
        "by_kind": per_kind,
    }


def by_rank(
    s: LoopSettings, ref: Referee, judge: Judge, rank: int, reps: int, rng: random.Random
) -> dict:
    """A +0.1 candidate and a no-better one tested at the level of the `rank`-th candidate
    of a period (none passed on)."""
    rule = rule_of(s)
    alpha = stats.spend(s.alpha, rank, ledger.planned_candidates(s))
    out = {"rank": rank, "alpha": alpha}
    for label, mean in (("better_0.1", 0.1), ("no_better", 0.0)):
        ds = [
            test_one(rule, s, alpha, Source(ref, mean, judge, rng), 0, label) for _ in range(reps)
        ]
        out[label] = summary(ds)
    return out


def hedger(s: LoopSettings, reps: int, rng: random.Random) -> dict:
    """Issue 33's hedger at the first level, judged by a referee paying exact answers (it
    scores 0, live right 30% of the time) and by its coach (half credit for a hedge)."""
    rule = rule_of(s)
    alpha = stats.spend(s.alpha, 1, ledger.planned_candidates(s))
    out = {}
    for who, credit in (("referee", 0.0), ("coach", 0.5)):
        promoted = 0
        for _ in range(reps):
            paired = rule.start()
            while (decision := rule.decision(paired, alpha)) == "wait":
                for _ in range(s.pairs_per_round):
                    paired.add(credit - (1.0 if rng.random() < 0.3 else 0.0))
            promoted += decision == "promote"
        out[who] = promoted / reps
    return out


# -- the low-traffic agent case ------------------------------------------------------

AGENT = Lineage("agent")
NOW = datetime(2026, 6, 2, 13, 0, tzinfo=UTC)
PER_HOUR = 20  # conversations an hour
AGENT_SHARE = 0.2  # of them 10-turn agent runs: nine tool calls, then an answer
AGENT_TURNS = 10
LONG_EFFECT = -0.1  # the candidate on an agent run's turns; short ones: what evens it out
CALL = json.dumps({"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "c"}]}}]})
ANSWER = json.dumps({"choices": [{"message": {"role": "assistant", "content": "done"}}]})


def day_of_agent_traffic(store: Store, rng: random.Random) -> dict[str, float]:
    """The day before `NOW` as the proxy logs it; returns each kind's effect, the short
    conversations' chosen so the candidate's mean over the turns served is exactly 0."""
    rows = []
    for hour in range(24):
        at = NOW - timedelta(hours=24 - hour)
        for i in range(PER_HOUR):
            ts = at + timedelta(seconds=rng.uniform(0, 3000))
            c = f"c{hour:02d}{i:02d}"
            long = rng.random() < AGENT_SHARE
            turns = [CALL] * (AGENT_TURNS - 1) + [ANSWER] if long else [ANSWER]
            for turn, response in enumerate(turns):
                kind = "long" if long else "short"
                says = {"role": "user", "content": f"task {c} step {turn}"}
                rows.append({
                    "id": f"{c}-{turn}-{kind}", "c": c, "turn": turn, "response": response,
                    "ts": (ts + timedelta(seconds=30 * turn)).isoformat(),
                    "request": json.dumps({"model": "agent", "messages": [says]}),
                })  # fmt: skip
    load_turns(store, rows)
    long = sum(r["id"].endswith("long") for r in rows)
    short = len(rows) - long
    return {"long": LONG_EFFECT, "short": -LONG_EFFECT * long / short}


def old_draw(store: Store, test: str, n: int) -> list[str]:
    """The draw before issue 63: strata of tool call x quarter, odds by the turns left in
    undrawn conversations (a whole conversation out per draw)."""
    turns = prompts.source_turns(store, AGENT, "e.arm = 'live' AND e.ts > ?",
                           [NOW - prompts.PROFILE], [], [test])  # fmt: skip
    queues: dict[tuple, list[prompts.Turn]] = {}
    strata_of: dict[str, list[tuple]] = {}
    for t in turns:
        queues.setdefault((t.called, t.part), []).append(t)
        strata_of.setdefault(t.trajectory_id, []).append((t.called, t.part))
    left: dict[tuple, int] = {}
    for t in turns:
        left[(t.called, t.part)] = left.get((t.called, t.part), 0) + 1
    strata = sorted(left)
    rng, out, used = random.Random(test), [], set()
    while len(out) < n and any(left.values()):
        st = rng.choices(strata, weights=[left[x] for x in strata])[0]
        q = queues[st]
        while q and q[0].trajectory_id in used:
            q.pop(0)
        if not q:
            break
        t = q.pop(0)
        out.append(t.id)
        used.add(t.trajectory_id)
        for x in strata_of[t.trajectory_id]:
            left[x] = max(0, left[x] - 1)
    return out


def low_traffic(s: LoopSettings, ref: Referee, judge: Judge, reps: int, seed: int) -> dict:
    """The low-traffic agent case at the first candidate's level: promoted share (target:
    at most that level), tests that ran short of a stratum, whether `prompts.shortfalls`
    said so before the test started, for today's draw and the one before issue 63."""
    rule, alpha = rule_of(s), stats.spend(s.alpha, 1, ledger.planned_candidates(s))
    rng = random.Random(f"{seed}-low-{ref.name}")
    out: dict = {"alpha_1": alpha, "reps": reps, "per_hour": PER_HOUR,
                 "agent_share": AGENT_SHARE, "agent_turns": AGENT_TURNS}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "low.duckdb")
        try:
            effects = day_of_agent_traffic(store, rng)
            out["effects"] = effects
            out["conversations"] = store.dicts(
                "SELECT count(DISTINCT trajectory_id) AS n FROM exchanges")[0]["n"]  # fmt: skip
            since = NOW - prompts.PROFILE
            warned = prompts.shortfalls(store, AGENT, since, s.max_pairs, tests=["offline:w"])
            out["said_before_a_test_of_max_pairs"] = warned
            for name in ("before issue 63", "now"):
                started = time.monotonic()
                ds, means = [], []
                for rep in range(reps):
                    test = f"offline:low:{rep}"
                    if name == "now":
                        # A pair is a conversation's turns the draw answered: their mean.
                        drawn = prompts.fresh(store, AGENT, since, s.max_pairs, tests=[test])
                        units: dict[str, list[float]] = {}
                        for p in drawn.prompts:
                            effect = effects[p.id.rsplit("-", 1)[1]]
                            units.setdefault(p.trajectory_id, []).append(effect)
                        kinds = [statistics.fmean(u) for u in units.values()]
                    else:
                        ids = old_draw(store, test, s.max_pairs)
                        kinds = [effects[i.rsplit("-", 1)[1]] for i in ids]
                    means.append(statistics.fmean(kinds) if kinds else 0.0)
                    src = Source(ref, 0.0, judge, rng, kinds=kinds)
                    ds.append(test_one(rule, s, alpha, src, 0, "no better"))
                promoted = sum(d.decision == "promote" for d in ds)
                low, high = wilson(promoted, reps)
                out[name] = {
                    "promoted": promoted / reps,
                    "ci95": [low, high],
                    "at_most_level": promoted / reps <= alpha,
                    "ran_short": sum(d.decision == "short" for d in ds) / reps,
                    "mean_of_prompts_drawn": statistics.fmean(means),
                    "median_pairs": statistics.median(d.pairs for d in ds),
                    "median_tokens": statistics.median(d.tokens for d in ds),
                    "seconds": round(time.monotonic() - started),
                }
        finally:
            store.close()
    return out


def wilson(hits: int, n: int) -> tuple[float, float]:
    w = stats.WinRate(n, hits, 0, n - hits)
    return w.interval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scores", choices=sorted(REFEREES), default="passfail")
    ap.add_argument("--streams", type=int, default=10, help="simulated streams per settings")
    ap.add_argument("--years", type=int, default=2, help="years per stream")
    ap.add_argument("--reps", type=int, default=400, help="tests per rank and candidate")
    ap.add_argument("--low-traffic-reps", type=int, default=300)
    ap.add_argument("--settings", choices=("production", "demo", "both"), default="production")
    ap.add_argument(
        "--judge-failures", type=float, default=0.02,
        help="chance that one attempt to judge a pair fails (judged again, up to "
        "loop.rejudge_attempts)",
    )  # fmt: skip
    ap.add_argument("--stuck", type=float, default=0.02, help="share of pairs never scored")
    ap.add_argument("--samples", type=int, default=None, help="fix loop.gate.samples")
    ap.add_argument("--seed", type=int, default=0)
    args = harness.parse(ap, timed=False)
    ref = REFEREES[args.scores]
    gate = {"gate": GateSettings(samples=args.samples)}
    settings = {
        "production": LoopSettings().model_copy(update=gate),
        "demo": loop_settings(Options()).model_copy(update=gate),
    }
    names = ["production", "demo"] if args.settings == "both" else [args.settings]
    out = {}
    for name in names:
        s = settings[name]
        started = time.monotonic()
        rng = random.Random(f"{args.seed}-{name}-{ref.name}-ranks")
        plain = Judge(args.judge_failures, 0.0, s.rejudge_attempts)
        stuck = Judge(args.judge_failures, args.stuck, s.rejudge_attempts)
        choking = Judge(args.judge_failures, args.stuck, s.rejudge_attempts, on_losses=True)
        r = out[name] = measure(name, s, ref, plain, args.streams, args.years, args.seed)
        r["by_rank"] = [by_rank(s, ref, plain, k, args.reps, rng) for k in RANKS]
        r["by_rank_stuck"] = [by_rank(s, ref, stuck, k, args.reps, rng) for k in (1, 500)]
        r["by_rank_stuck_on_losses"] = [
            by_rank(s, ref, choking, k, args.reps, rng) for k in (1, 500)
        ]
        r["hedger"] = hedger(s, args.reps, rng)
        if args.low_traffic_reps:
            r["low_traffic"] = low_traffic(s, ref, plain, args.low_traffic_reps, args.seed)
        r["seconds"] = round(time.monotonic() - started)
        report(name, s, ref, r)
    harness.save(
        "decisions",
        {
            "scores": args.scores, "referee": ref.__dict__, "judge_failures": args.judge_failures,
            "stuck": args.stuck, "mix": MIX, "seed": args.seed, "prompt_tokens": PROMPT_TOKENS,
            "answer_tokens": ANSWER_TOKENS, "samples": args.samples, **out,
        },
        args.out,
    )  # fmt: skip


def report(name: str, s: LoopSettings, ref: Referee, r: dict) -> None:
    met = "met" if r["target_met"] else "MISSED"
    print(
        f"== {name}, {ref.name} scores: {r['years']} simulated years, {r['seconds']} s\n"
        f"P(any bad promotion in a year) {r['any_bad_promotion_in_a_year']:.3f} (target <= "
        f"{s.alpha}: {met}; {r['bad_candidates']} no-better or worse candidates); in a month "
        f"{r['any_bad_promotion_in_a_month']:.4f}; good promotions per month "
        f"{r['good_promotions_per_month']:.2f}; {r['candidates_per_year']:.0f} candidates a year"
    )
    for kind, row in r["by_kind"].items():
        print(f"  {kind:>12}: {row['candidates']:>6} promoted {row['promoted']:.3f}, median "
              f"{row['median_pairs']} pairs, {row['median_answers_per_arm']} answers per arm, "
              f"{row['median_tokens'] / 1e3:.0f}k tokens")  # fmt: skip
    for label, rows in (("", r["by_rank"]), (" (2% never scored, set aside)", r["by_rank_stuck"]),
                        (" (2% never scored: the candidate's losses)",
                         r["by_rank_stuck_on_losses"])):  # fmt: skip
        for f in rows:
            b, n = f["better_0.1"], f["no_better"]
            print(
                f"  candidate {f['rank']} (alpha {f['alpha']:.2e}){label}: +0.1 promoted "
                f"{b['promoted']:.3f}, median {b['median_pairs']} pairs at "
                f"{b['median_answers_per_arm']} answers, {b['median_tokens'] / 1e3:.0f}k tokens; "
                f"no better promoted {n['promoted']:.4f}, {n['median_tokens'] / 1e3:.0f}k tokens"
            )
    print(f"  hedger promoted: by the referee {r['hedger']['referee']:.3f}, by its coach "
          f"{r['hedger']['coach']:.3f}")  # fmt: skip
    if "low_traffic" in r:
        low = r["low_traffic"]
        for name_ in ("before issue 63", "now"):
            x = low[name_]
            print(
                f"  low traffic, {name_}: promoted {x['promoted']:.3f} [{x['ci95'][0]:.3f}, "
                f"{x['ci95'][1]:.3f}] (level {low['alpha_1']:.3f}); ran short "
                f"{x['ran_short']:.2f}; mean of the prompts drawn {x['mean_of_prompts_drawn']:+.3f}"
            )
        for said in low["said_before_a_test_of_max_pairs"]:
            print(f"    said before: {said}")


if __name__ == "__main__":
    main()
