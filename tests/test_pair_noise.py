"""Less noise per pair where the referee is coarse (issue 63): the referee's noise measured
as pairs come in, the answers per arm sized from it within a token budget, what a
decision will cost said before it is reached, a pair the referee never scored set aside
rather than counted, and a draw that keeps the day's mix of long and short conversations
to the end. Pure maths on seeded pairs; the store's side on a real DuckDB file."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from onjob.collector import Store
from onjob.deploy.decide import answers, ledger, noise, pairs, prompts, stats
from onjob.deploy.decide.evidence import Forecast
from onjob.deploy.decide.pairs import rule_of
from onjob.deploy.settings import DeploySettings, GateSettings, LoopSettings
from onjob.proxy.tenants import Lineage

PRODUCTION = LoopSettings()
COST = noise.Cost(prompt=800, answer=150)


def pass_fail(rng: random.Random, k: int, edge: float = 0.0) -> tuple[list[float], list[float]]:
    """k answers per arm, each right or wrong: live right half the time on a prompt of
    middling difficulty, the candidate `edge` more often."""
    p = rng.uniform(0.3, 0.7)
    a = [float(rng.random() < p) for _ in range(k)]
    b = [float(rng.random() < p + edge) for _ in range(k)]
    return a, b


def graded(rng: random.Random, k: int) -> tuple[list[float], list[float]]:
    m = rng.uniform(0.3, 0.7)
    return [m + rng.gauss(0, 0.02) for _ in range(k)], [m + rng.gauss(0, 0.02) for _ in range(k)]


def sized(pairs, alpha: float) -> noise.Sizing:
    return noise.size(
        noise.measure(pairs), COST, alpha=alpha, edge=0.1, max_pairs=300, budget=4_000_000
    )


def test_a_pass_fail_referee_gets_several_answers_per_arm_and_a_graded_one_few():
    rng = random.Random(0)
    alpha_500 = stats.spend(0.05, 500, ledger.planned_candidates(PRODUCTION))
    coarse = sized([pass_fail(rng, 2) for _ in range(24)], alpha_500)
    fine = sized([graded(rng, 2) for _ in range(24)], alpha_500)
    assert coarse.answers >= 6, coarse  # a coin flip per answer: the mean of several
    assert fine.answers <= 2, fine
    # With them the 500th candidate's test is expected to decide well inside max_pairs,
    # where one answer per arm would need more pairs than the cap allows.
    measured = noise.measure([pass_fail(rng, 2) for _ in range(200)])
    assert noise.pairs_needed(alpha_500, 0.1, measured.variance(1)) > 300
    assert coarse.pairs < 200


def test_before_the_noise_is_measured_a_pair_gets_two_answers_per_arm():
    assert sized([], 0.015).answers == noise.FIRST_ANSWERS == 2
    one_answer = [([1.0], [0.0])] * 50  # one answer each: no within spread to read
    assert noise.measure(one_answer) is None


def test_the_answers_per_arm_stay_within_the_token_budget():
    # max_pairs pairs at k answers: 2 (prompt + k answer) tokens each, within the budget.
    k = COST.most_answers(budget=1_500_000, max_pairs=300)
    assert 300 * COST.per_pair(k) <= 1_500_000 < 300 * COST.per_pair(k + 1)
    assert COST.most_answers(budget=1, max_pairs=300) == 1  # never fewer than one
    rng = random.Random(1)
    pairs = [pass_fail(rng, 2) for _ in range(24)]
    tight = noise.size(
        noise.measure(pairs), COST, alpha=1e-5, edge=0.1, max_pairs=300, budget=1_500_000
    )
    assert tight.answers <= k


def test_answers_sized_from_earlier_pairs_keep_a_no_better_candidate_at_its_level():
    # Each round's k is read from the pairs before it: every pair's expected difference is
    # still the candidate's mean, so the e-process keeps its level.
    rule, level, rng = rule_of(PRODUCTION), 0.05, random.Random(2)
    promoted, runs = 0, 600
    for _ in range(runs):
        paired, measuring = rule.start(), noise.Measuring()
        while rule.decision(paired, level) == "wait":
            k = noise.size(
                measuring.noise(), COST, alpha=level, edge=0.1, max_pairs=300,
                budget=4_000_000,
            ).answers  # fmt: skip
            for _ in range(8):
                a, b = pass_fail(rng, k)
                measuring.add(a, b)
                paired.add(sum(b) / k - sum(a) / k)
        promoted += rule.decision(paired, level) == "promote"
    assert promoted / runs <= level


def test_an_open_test_says_what_it_expects_to_cost_and_what_happens_at_max_pairs():
    said = Forecast(
        answers=8, most_answers=16, fixed=False, pairs_expected=140, pairs_so_far=24,
        tokens_per_pair=4000, tokens_expected=560_000, budget=4_000_000, sd=0.2,
        within=0.3, between=0.01, max_pairs=300, reaches=True,
        short=["would use up tool-call turns of 06-12 UTC in conversations of 8+ turns"],
    )  # fmt: skip
    text = said.summary()
    assert "about 140 pairs" in text and "8 answers per arm" in text and "560k" in text
    assert "at 300 pairs undecided: rolled back, live kept" in text
    assert "would use up tool-call turns" in text
    # It travels in the verdict's evidence, as the deployments log and the A/B page read it.
    unknown = msgspec.convert({**msgspec.to_builtins(said), "pairs_expected": None}, Forecast)
    assert "not measured yet" in unknown.summary()


# -- the store's side ------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "onjob.duckdb")
    yield store
    store.close()


def scored_pairs(store, test: str, pairs: list[tuple[list[float], list[float]]]) -> None:
    """`ab` groups of `test` as the referee leaves them: each arm's answers as members,
    their scores, and the re-sampled exchanges with their tokens."""
    for i, (a, b) in enumerate(pairs):
        g = f"group-{test}-{i:04d}"
        store.con.execute(
            "INSERT INTO groups (id, scenario_id, prefix_exchange, kind, status, created, test) "
            "VALUES (?, 'scn', 'x', 'ab', 'scored', now(), ?)",
            [g, test],
        )
        for arm, scores in (("a", a), ("b", b)):
            ex = f"{g}-{arm}"
            store.con.execute(
                "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, model_alias, "
                "arm, stream, request, status, source, prompt_token_ids, completion_token_ids, "
                "usage) VALUES (?, now(), ?, 0, 'scn', 'agent', 'live', false, '{}', 200, "
                "'resample', ?, ?, ?)",
                [ex, ex, list(range(500)), [list(range(100))] * len(scores),
                 json.dumps({"prompt_tokens": 500, "completion_tokens": 100 * len(scores)})],
            )  # fmt: skip
            for c, score in enumerate(scores):
                m = f"{ex}-{c}"
                store.con.execute(
                    "INSERT INTO members VALUES (?, ?, ?, ?, ?, NULL, ?)", [m, g, c, ex, c, arm]
                )
                store.con.execute(
                    "INSERT INTO scores (id, group_id, member_id, source, score, created) "
                    "VALUES (?, ?, ?, 'combined', ?, now())",
                    [f"s-{m}", g, m, score],
                )


def test_the_answers_per_arm_are_read_from_the_tests_own_pairs(store):
    rng = random.Random(3)
    scored_pairs(store, "offline::cand", [pass_fail(rng, 2) for _ in range(16)])
    ledger.enter(store, "agent", "cand")
    settings = DeploySettings()
    sizing = answers.sizing(store, "agent", "cand", ["offline::cand"], settings)
    assert sizing.answers >= 4
    assert answers.cost(store, ["offline::cand"], 256) == noise.Cost(500, 100)
    said = answers.forecast(store, "agent", "cand", ["offline::cand"], settings, pairs=16)
    assert said.answers == sizing.answers and said.pairs_expected is not None
    assert said.tokens_per_pair == 2 * (500 + 100 * sizing.answers)
    # The operator's fixed number is kept, and the forecast is at it.
    fixed = settings.model_copy(
        update={"loop": settings.loop.model_copy(update={"gate": GateSettings(samples=1)})}
    )
    one = answers.forecast(store, "agent", "cand", ["offline::cand"], fixed, pairs=16)
    assert one.answers == 1 and one.fixed and one.pairs_expected > said.pairs_expected


# -- a referee that fails for good ----------------------------------------------------


def test_a_pair_the_referee_never_scored_is_set_aside_not_counted_as_a_loss():
    rule = rule_of(PRODUCTION)
    read = rule.weigh([0.2] * 40)
    aside = rule.weigh([0.2] * 40)
    aside.set_aside(2)  # two more prompts were drawn in their place
    assert aside.better.log_e == read.better.log_e and aside.mean == read.mean
    assert aside.drawn == 42 and aside.unjudged == 0
    # The candidate's own failures are still its losses.
    lost = rule.weigh([0.2] * 40, unjudged=2)
    assert lost.better.log_e < read.better.log_e


def test_a_referee_that_fails_on_too_many_pairs_stops_the_test_and_says_so():
    rule = rule_of(PRODUCTION)
    paired = rule.weigh([0.3] * 20)
    paired.set_aside(6)  # 23% of 26: over the share, but not shown to be
    decision, why = rule.decide(paired, 0.05)
    assert decision != "rollback"
    paired.set_aside(40)  # 46 of 66 never scored
    decision, why = rule.decide(paired, 0.05)
    assert decision == "rollback" and "the referee is broken" in why and "46 of 66" in why


def test_a_share_of_pairs_set_aside_past_the_limit_holds_a_promotion():
    rule = rule_of(PRODUCTION)
    paired = rule.weigh([1.0] * 30)
    assert rule.decision(paired, 0.05) == "promote"
    paired.set_aside(9)  # 23% set aside: a referee failing that often says little
    decision, why = rule.decide(paired, 0.05)
    assert decision == "wait" and "set aside" in why


# -- the draw keeps the day's mix ------------------------------------------------------

AGENT = Lineage("agent")
ANSWER = {"choices": [{"message": {"role": "assistant", "content": "done"}}]}


def day(store, now: datetime, short: int, long: int, long_turns: int = 10) -> None:
    """`short` one-turn conversations and `long` ones of `long_turns` turns, in the hour
    before `now`."""
    convs = [(f"s{i}", 1) for i in range(short)] + [(f"l{i}", long_turns) for i in range(long)]
    for c, turns in convs:
        for t in range(turns):
            store.con.execute(
                "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, model_alias, "
                "arm, stream, request, response, status, latency_ms, source) VALUES (?, ?, ?, "
                "?, 'scn', 'agent', 'live', false, ?, ?, 200, 50, 'production')",
                [f"{c}-{t}", now - timedelta(minutes=30), c, t,
                 json.dumps({"model": "agent", "messages": [
                     {"role": "user", "content": f"task {c} step {t}"}]}),
                 json.dumps(ANSWER)],
            )  # fmt: skip


def test_the_draw_keeps_the_days_share_of_long_conversations_to_the_end(store):
    # 100 long conversations of 10 turns (1,000 turns) and 250 one-turn ones: 80% of the
    # turns served are long conversations'. Drawn with odds by the turns left, the long
    # ones ran out first and the late draws were short ones; with the day's odds fixed,
    # each draw is a long one 80% of the time until that stratum is used up.
    now = datetime.now(UTC).replace(minute=45)
    day(store, now, short=250, long=100)
    drawn = prompts.fresh(store, AGENT, now - timedelta(hours=2), 300, tests=["offline:mix"])
    # Each draw, one conversation (it answers up to four of its turns: one pair).
    conversations = dict.fromkeys(p.trajectory_id for p in drawn.prompts)
    longs = [c.startswith("l") for c in conversations]
    assert drawn.short is not None and drawn.short.length == 3  # the long ones, used up
    assert "conversations of 8+ turns" in str(drawn.short)
    assert len(longs) < 160  # it stopped there, not on short ones alone
    late = longs[len(longs) // 2 :]
    assert sum(late) / len(late) > 0.65  # still the day's mix at the end


def test_a_stratum_a_test_would_use_up_is_said_before_it_starts(store):
    now = datetime.now(UTC).replace(minute=45)
    day(store, now, short=250, long=20)
    since = now - timedelta(hours=2)
    said = prompts.shortfalls(store, AGENT, since, 300, tests=["offline:warn"])
    assert len(said) == 1 and "would use up" in said[0] and "8+ turns" in said[0]
    assert "20 conversations left" in said[0]
    assert prompts.shortfalls(store, AGENT, since, 10, tests=["offline:warn"]) == []


def unscored_pair(store, test: str, i: int, *, ruler_failed: bool) -> None:
    """A pair both arms answered that the referee never scored after 3 attempts: its RULER
    call failed whole (`ruler_failed`), or a reward function raised on some answer."""
    g = f"group-{test}-{i:04d}"
    store.con.execute(
        "INSERT INTO groups (id, scenario_id, prefix_exchange, kind, status, reason, created, "
        "test, attempts) VALUES (?, 'scn', 'x', 'ab', 'failed', 'no score', now(), ?, 3)",
        [g, test],
    )
    for arm in ("a", "b"):
        store.con.execute(
            "INSERT INTO members VALUES (?, ?, 0, ?, 0, NULL, ?)", [f"{g}-{arm}", g, g, arm]
        )
    if ruler_failed:
        store.con.execute(
            "INSERT INTO judgements (id, group_id, judge, cache_key, status, error, attempts, "
            "created) VALUES (?, ?, 'ruler:judge', 'k', 'failed', '429', 1, now())",
            [f"j-{g}", g],
        )


def test_a_pair_the_referees_call_never_scored_is_set_aside_and_the_test_reads_past_it(store):
    rng = random.Random(4)
    test = "offline::cand"
    scored_pairs(store, test, [graded(rng, 1) for _ in range(5)])
    unscored_pair(store, test, 5, ruler_failed=True)  # the referee's own failure
    unscored_pair(store, test, 6, ruler_failed=False)  # a reward function raised
    ledger.enter(store, "agent", "cand")
    weighed = pairs.weigh(store, "agent", "cand", [test], PRODUCTION)
    # The set-aside pair is not read and blocks nothing; the other is the candidate's loss.
    assert (weighed.paired.aside, weighed.paired.unjudged, weighed.paired.pending) == (1, 1, 0)
    assert weighed.paired.pairs == 6 and weighed.paired.drawn == 7
    assert {(m.group[-4:], m.counted) for m in weighed.missing} == {
        ("0005", "aside"),
        ("0006", "loss"),
    }
    # The test is open: the next round draws a prompt in the set-aside one's place.
    assert weighed.decide()[0] == "wait"
    assert "1 more set aside" in weighed.decide()[1]
