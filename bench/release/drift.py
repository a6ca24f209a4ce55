"""Does the release test read what the candidate will serve? Two candidates that are no
better than live over the traffic they would serve, but better on part of it, tested
with the project's own sampling (`prompts.fresh` on a real DuckDB file holding a day of
logged traffic) and its own rule (`pairs.rule_of`, at the level of the first candidate of
a period), against the sampling the loop used before issue 50 (one turn of each of the
newest conversations after the snapshot, conversations alike).

- `length`: +0.1 on short prompts, -0.15 on long ones. Long prompts are 10% of the
  turns from 00 to 06 UTC, 70% from 06 to 12, 50% from 12 to 18, 30% from 18 to 24: 40%
  over the day, where the candidate's mean is 0. Its snapshot is taken at 01 UTC, in the
  hours with few long prompts.
- `turn kind`: +0.1 on answer turns, -0.1 on tool-call turns. 60% of conversations are
  one answer; 40% are an agent's: four tool calls, then an answer. Over the turns served
  the candidate's mean is -0.023; over conversations, one turn each, it is +0.036.

Each pair's difference is the graded model of bench/release/decisions.py (ties 20%, spread 0.25,
each judging attempt failing 2%, judged again) with the mean of the prompt's kind. Each
test draws its prompts as one run of rounds would (`loop.max_pairs` at most) and reads
them in order, deciding after each round of `loop.pairs_per_round` as the loop does; a
draw that runs out of a stratum ends the test undecided (it would wait for traffic).

Target (issue 50): each drift case promoted with chance <= alpha, where the sampling
before issue 50 promoted them far more often than their level.

    python -m bench.release.drift [--reps 400] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench import harness
from bench.release.decisions import Judge, draw, load_turns
from onjob.collector import Store
from onjob.deploy.decide import ledger, prompts, stats
from onjob.deploy.decide.pairs import rule_of
from onjob.deploy.settings import LoopSettings
from onjob.proxy.tenants import Lineage

AGENT = Lineage("agent")
NOW = datetime(2026, 6, 2, 1, 0, tzinfo=UTC)  # the test starts at 01 UTC
PER_HOUR = 400  # conversations an hour (issue 50: a test uses ~400 fresh ones an hour)
LONG_SHARE = (0.1, 0.7, 0.5, 0.3)  # by quarter of the UTC day
EFFECTS = {  # case: {kind of prompt: the candidate's true E[d] on it}
    "length": {"short": 0.1, "long": -0.15},
    "turn kind": {"answer": 0.1, "tool": -0.1},
}
CALL = json.dumps({"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "c"}]}}]})
ANSWER = json.dumps({"choices": [{"message": {"role": "assistant", "content": "done"}}]})


def day_of_traffic(store: Store, case: str, rng: random.Random) -> None:
    """The day before `NOW`, logged as the proxy logs it: a kind of prompt per turn, in the
    exchange id's last part (`...-short`, `...-tool`)."""
    rows = []
    for hour in range(24):
        at = NOW - timedelta(hours=24 - hour)
        for i in range(PER_HOUR):
            ts = at + timedelta(seconds=rng.uniform(0, 3600))
            conversation = f"{case[0]}{hour:02d}{i:03d}"
            if case == "length":
                kind = "long" if rng.random() < LONG_SHARE[ts.hour // 6] else "short"
                turns = [(kind, ANSWER)]
            else:
                agent = rng.random() < 0.4
                turns = (
                    [("tool", CALL)] * 4 + [("answer", ANSWER)] if agent else [("answer", ANSWER)]
                )
            for turn, (kind, response) in enumerate(turns):
                request = json.dumps({"model": "agent", "messages": [
                    {"role": "user", "content": f"request {conversation} {kind}"}]})  # fmt: skip
                rows.append([f"{conversation}-{turn}-{kind}", ts + timedelta(seconds=turn),
                             conversation, turn, request, response])  # fmt: skip
    load_turns(
        store,
        [
            {"id": id_, "ts": ts.isoformat(), "c": conversation, "turn": turn,
             "request": request, "response": response}
            for id_, ts, conversation, turn, request, response in rows
        ],
    )  # fmt: skip


def served_mean(store: Store, case: str) -> float:
    kinds = [r["id"].rsplit("-", 1)[1] for r in store.dicts("SELECT id FROM exchanges")]
    return statistics.mean(EFFECTS[case][k] for k in kinds)


def before_issue_50(store: Store, rng: random.Random, n: int) -> list[str]:
    """The old sampling: conversations logged after the snapshot (an hour before `NOW`),
    newest first, one turn of each at random: the kinds of the turns drawn."""
    rows = store.dicts(
        "SELECT trajectory_id, list(id) AS ids, max(ts) AS ts FROM exchanges "
        "WHERE ts > ? GROUP BY trajectory_id ORDER BY ts DESC",
        [NOW - timedelta(hours=1)],
    )
    return [rng.choice(r["ids"]).rsplit("-", 1)[1] for r in rows[:n]]


def now_drawn(store: Store, test: str, n: int) -> list[str]:
    """Today's sampling: `prompts.fresh` over the last day, in its mix of strata."""
    picked = prompts.fresh(store, AGENT, NOW - prompts.PROFILE, n, tests=[test])
    return [p.id.rsplit("-", 1)[1] for p in picked.prompts]


def decide(kinds: list[str], case: str, s: LoopSettings, alpha: float, judge, rng) -> tuple:
    """The rule over the pairs of `kinds`, read a round at a time: (decision, pairs)."""
    rule, paired = rule_of(s), rule_of(s).start()
    for i, kind in enumerate(kinds, 1):
        d = draw(rng, EFFECTS[case][kind], "graded", judge)
        paired.add_unjudged() if d != d else paired.add(d)
        if i % s.pairs_per_round == 0 or i == len(kinds):
            decision = rule.decision(paired, alpha)
            if decision != "wait":
                return decision, paired.pairs
    return "undecided", paired.pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=400, help="tests per case and sampling")
    ap.add_argument("--seed", type=int, default=0)
    args = harness.parse(ap, timed=False)
    s = LoopSettings()
    alpha = stats.spend(s.alpha, 1, ledger.planned_candidates(s))
    judge = Judge(0.02, 0.0, s.rejudge_attempts)
    kept = {"max_pairs": s.max_pairs, "pairs_per_round": s.pairs_per_round, "delta": s.delta}
    out = {"alpha_1": alpha, "reps": args.reps, "settings": kept}
    for case in EFFECTS:
        rng = random.Random(f"{args.seed}-{case}")
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "drift.duckdb")
            try:
                day_of_traffic(store, case, rng)
                served = served_mean(store, case)
                row = {"served_mean": served}
                started = time.monotonic()
                for name in ("before issue 50", "now"):
                    decisions, means, short = [], [], 0
                    for rep in range(args.reps):
                        if name == "now":
                            kinds = now_drawn(store, f"offline:{case}:{rep}", s.max_pairs)
                        else:
                            kinds = before_issue_50(store, rng, s.max_pairs)
                        short += len(kinds) < s.max_pairs
                        means.append(statistics.mean(EFFECTS[case][k] for k in kinds))
                        decisions.append(decide(kinds, case, s, alpha, judge, rng))
                    promoted = sum(d == "promote" for d, _ in decisions) / args.reps
                    row[name] = {
                        "promoted": promoted,
                        "at_most_alpha": promoted <= s.alpha,
                        "mean_of_the_prompts_drawn": statistics.mean(means),
                        "median_pairs": statistics.median(p for _, p in decisions),
                        "draws_short_of_max_pairs": short / args.reps,
                    }
                row["seconds"] = time.monotonic() - started
            finally:
                store.close()
        out[case] = row
        print(f"== {case}: the candidate's mean over the turns served {served:+.3f}")
        for name in ("before issue 50", "now"):
            r = row[name]
            print(
                f"{name:>16}: promoted {r['promoted']:.3f} (alpha {s.alpha}: "
                f"{'met' if r['at_most_alpha'] else 'MISSED'}); mean of the prompts drawn "
                f"{r['mean_of_the_prompts_drawn']:+.3f}; median pairs {r['median_pairs']}"
            )
    harness.save("drift", out, args.out)


if __name__ == "__main__":
    main()
