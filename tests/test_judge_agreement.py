"""The judge checked against users: conversations through a real `onjob serve` (the openai
client, a real engine), feedback posted to `/v1/feedback` with the exchange ids the client
got, real judge passes scoring trajectory groups with three reward functions, then
`judge_agreement`, `onjob status` (with and without a server), `/admin/status` and the
dashboard read the same DuckDB file.

Each conversation carries a number k in its metadata and users rate it k/11. One reward
function ranks by k (it agrees with users), one by -k (it orders them backwards), one by
k's parity (unrelated to what users say). Scenario "quiz" has 12 conversations (3 groups of
4), and eight "trio-i" scenarios 3 each (one group of 3): 11 groups, 3 * 6 + 8 * 3 = 42
pairs."""

from __future__ import annotations

import asyncio
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import msgspec
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess, free_port
from onjob.collector import Collector, CollectorSettings, Store
from onjob.judge import Agreement, JudgeSettings, RewardFn, judge_agreement, run_pass
from onjob.judge.agreement import MIN_PAIRS, wilson

from .conftest import admin_of

ONJOB = str(Path(sys.executable).with_name("onjob"))
SCENARIOS = {"quiz": 12, **{f"trio-{i}": 3 for i in range(8)}}  # conversations in each
PAIRS = 3 * 6 + 8 * 3


def agrees(rollout) -> float:
    return int(rollout.metadata["k"])


def contrary(rollout) -> float:
    return -int(rollout.metadata["k"])


def parity(rollout) -> float:
    return int(rollout.metadata["k"]) % 2


@pytest.fixture(scope="module")
def db(tmp_path_factory, engine) -> Path:
    """Users' feedback on 36 conversations in nine scenarios, and three judge passes over
    them (each makes one trajectory group of at most 4 conversations per scenario)."""
    db = tmp_path_factory.mktemp("agreement") / "onjob.duckdb"
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)], env=env) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        for scenario, n in SCENARIOS.items():
            for k in range(n):
                answer = client.chat.completions.create(
                    model="agent",
                    messages=[{"role": "user", "content": f"{scenario} question {k}"}],
                    max_tokens=2,
                    metadata={
                        "scenario": scenario,
                        "k": str(k),
                        "trajectory_id": f"{scenario}-{k}",
                    },
                )
                feedback = {"exchange_id": answer.id, "value": k / 11}
                posted = httpx.post(f"{server.base}/v1/feedback", json=feedback, timeout=30)
                assert posted.status_code == 200, posted.text
    settings = JudgeSettings(
        settle_s=0,
        max_trajectories=4,
        max_sample_tokens=1,  # no turn groups: in those only the logged answer has feedback
        rewards={
            name: RewardFn(fn=f"{__name__}:{name}") for name in ("agrees", "contrary", "parity")
        },
    )
    asyncio.run(judge_passes(db, engine.url, settings, passes=3))
    return db


async def judge_passes(db: Path, engine_url: str, settings: JudgeSettings, passes: int) -> None:
    collector = Collector(CollectorSettings(db=db))
    await collector.start()
    try:
        async with httpx.AsyncClient(base_url=engine_url, timeout=60) as engine:
            for _ in range(passes):
                report = await run_pass(collector, engine, settings, echo=lambda line: None)
                assert report.failed == 0, report.summary()
    finally:
        await collector.close()


@pytest.fixture(scope="module")
def records(db) -> dict[tuple[str, str | None], Agreement]:
    store = Store(db)
    try:
        found = judge_agreement(store)
    finally:
        store.close()
    return {(a.judge, a.scenario): a for a in found}


def test_a_judge_that_ranks_as_users_do_agrees_with_no_warning(records):
    overall, quiz = records["fn:agrees", None], records["fn:agrees", "quiz"]
    assert (overall.groups, overall.pairs) == (11, PAIRS)  # pairs within groups only
    assert overall.accuracy == 1.0 and overall.tau == 1.0 and overall.tau_ci == (1.0, 1.0)
    assert overall.accuracy_ci == wilson(PAIRS, PAIRS) and overall.accuracy_ci[0] > 0.5
    assert overall.verdict == "agrees" and not overall.warning
    assert (quiz.groups, quiz.pairs, quiz.verdict) == (3, 18, "agrees")
    assert quiz.tau == 1.0 and quiz.tau_ci is None  # 3 groups: too few for an interval


def test_a_judge_that_orders_answers_against_users_is_warned_about(records):
    overall = records["fn:contrary", None]
    assert overall.accuracy == 0.0 and overall.tau == -1.0 and overall.tau_ci == (-1.0, -1.0)
    assert overall.accuracy_ci[1] < 0.5
    assert overall.verdict == "disagrees" and overall.warning
    assert records["fn:contrary", "quiz"].warning


def test_a_judge_unrelated_to_users_is_no_better_than_chance(records):
    overall = records["fn:parity", None]
    # Each group of 4 consecutive k: 3 pairs ordered as users did, 1 against, 2 judge ties
    # (half right each); each group of 3: 1, 1 and 1.
    assert overall.agreed == 3 * (3 + 2 / 2) + 8 * (1 + 1 / 2) and overall.pairs == PAIRS
    low, high = overall.accuracy_ci
    assert low < 0.5 < high
    # tau-b pooled within groups: (C - D) / sqrt((n0 - judge ties) (n0 - feedback ties)).
    concordant, discordant, judge_ties = 3 * 3 + 8 * 1, 3 * 1 + 8 * 1, 3 * 2 + 8 * 1
    expected = (concordant - discordant) / math.sqrt((PAIRS - judge_ties) * PAIRS)
    assert math.isclose(overall.tau, expected)
    assert overall.tau_ci[0] <= 0 < expected < overall.tau_ci[1]  # 0 is inside
    assert overall.verdict == "chance" and overall.warning


def test_a_scenario_with_few_rated_pairs_has_too_few_to_tell(records):
    trio = records["fn:contrary", "trio-0"]
    assert trio.pairs == 3 < MIN_PAIRS and trio.groups == 1 and trio.accuracy == 0.0
    assert trio.verdict == "too few pairs" and not trio.warning
    assert "too few pairs" in trio.summary()


def onjob_status(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [ONJOB, "status", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
        env=os.environ,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def check_status_lines(out: str) -> None:
    lines = out.splitlines()
    low = wilson(PAIRS, PAIRS)[0]
    judged = [line for line in lines if line.startswith("judge ")]
    assert [line.split(":")[0] for line in judged] == [
        "judge fn",
        "judge fn",
        "judge fn",
    ] and len(judged) == 3, out  # one line per judge source
    assert any(
        line.startswith(f"judge fn:agrees: 100.0% of {PAIRS} pairs agree with users (95% {low:.1%}")
        and "tau +1.00 (+1.00 to +1.00), 11 groups: agrees" in line
        for line in judged
    ), out
    warnings = [line for line in lines if line.startswith("WARNING:")]
    assert any(
        line.startswith("WARNING: judge fn:parity does no better than chance") for line in warnings
    ), out
    assert any(
        line.startswith("WARNING: judge fn:contrary orders answers against") for line in warnings
    ), out
    assert not any("fn:agrees" in line for line in warnings), out


def test_onjob_status_prints_each_judges_agreement_from_the_database(db, tmp_path):
    nowhere = f"http://127.0.0.1:{free_port()}"
    out = onjob_status(tmp_path, "--db", str(db), "--server", nowhere)
    assert "no server answered" in out
    check_status_lines(out)


def test_the_running_server_reports_agreement_in_status_and_on_the_dashboard(db, engine, tmp_path):
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)]) as server:
        admin = admin_of(db)
        status = httpx.get(f"{server.base}/admin/status", headers=admin, timeout=60).json()
        shown = {(a["judge"], a["scenario"]): a for a in status["judge_agreement"]}
        assert shown["fn:agrees", None]["accuracy"] == 1.0
        assert shown["fn:parity", None]["warning"] is True
        assert msgspec.convert(shown["fn:parity", None], Agreement).verdict == "chance"
        # The CLI reads the admin key the server made beside the database.
        check_status_lines(onjob_status(tmp_path, "--db", str(db), "--server", server.base))

        page = httpx.get(f"{server.base}/dashboard/groups", headers=admin, timeout=60)
        assert page.status_code == 200
        html = page.text
    rows = dict(
        (m["judge"], m["row"])
        for m in re.finditer(
            r'<tr data-judge="(?P<judge>[^"]+)" data-metric="" data-scenario="" class="overall">'
            r"(?P<row>.*?)</tr>",
            html,
            re.S,
        )
    )
    assert set(rows) == {"fn:agrees", "fn:contrary", "fn:parity"}
    assert f'<td class="n pairs">{PAIRS}</td>' in rows["fn:agrees"]
    assert '<td class="n accuracy">100.0%</td>' in rows["fn:agrees"]
    assert '<td class="n tau">1.00</td>' in rows["fn:agrees"]
    assert "no better than chance" in rows["fn:parity"]
    assert "worse than chance" in rows["fn:contrary"]
    assert "no better than chance" not in rows["fn:agrees"]
    assert html.count('data-judge="fn:agrees"') == 1 + len(SCENARIOS)


def test_a_judge_that_disagrees_with_users_stops_what_it_trained_and_rolls_back_its_canary(db):
    """The guard (`trust.agreement_guard`) on the same real data: the coach or referee that
    orders answers against users stops a candidate before any canary and rolls a canary
    back, with the reason recorded; one that agrees, or has too little evidence, does not."""
    from datetime import UTC, datetime

    from onjob.deploy.decide import trust
    from onjob.deploy.decide.verdict import decide
    from onjob.deploy.records import Routing
    from onjob.deploy.settings import DeploySettings, LoopSettings
    from onjob.judge import JudgeSettings
    from onjob.judge.settings import RewardFn

    def judged_by(name: str) -> DeploySettings:
        fn = RewardFn(fn="tests.hacking_rewards:exact")
        return DeploySettings(judge=JudgeSettings(rewards={name: fn}))

    s = LoopSettings()
    store = Store(db)
    try:
        contrary = trust.agreement_guard(store, ["fn:agrees", "fn:contrary"], s)
        assert "fn:contrary" in contrary.tripped and "agreement" in contrary.tripped
        assert set(contrary.judges) == {"fn:agrees", "fn:contrary"}
        assert trust.agreement_guard(store, ["fn:agrees"], s).tripped is None
        # No feedback pairs for this judge: no evidence against it.
        assert trust.agreement_guard(store, ["ruler:some-model"], s).tripped is None
        # parity is at chance (24 of 42 pairs, 95% up to 0.71): past a 0.6 bound, not 0.8.
        assert trust.agreement_guard(store, ["fn:parity"], s).tripped is None
        strict = LoopSettings(min_judge_agreement=0.8)
        assert trust.agreement_guard(store, ["fn:parity"], strict).tripped
        off = LoopSettings(min_judge_agreement=None)
        assert trust.agreement_guard(store, ["fn:contrary"], off).tripped is None

        stopped = decide(store, judged_by("contrary"), "ckpt-x", None)
        assert stopped.decision == "rollback" and "fn:contrary" in stopped.reason
        assert stopped.evidence.shape.judges.tripped
        unchecked = decide(store, judged_by("agrees"), "ckpt-x", None)  # no pairs yet
        assert unchecked.decision == "wait", unchecked.reason

        routing = Routing(
            ts=datetime.now(UTC), model_alias="agent", live=None, canary="ckpt-x",
            fraction=0.5, reason="by hand", actor="test", evidence=None,
        )  # fmt: skip
        verdict = decide(store, judged_by("contrary"), "ckpt-x", None, routing)
        assert verdict.decision == "rollback" and "fn:contrary" in verdict.reason
        assert decide(store, judged_by("agrees"), "ckpt-x", None, routing).decision == "wait"
    finally:
        store.close()


def test_users_who_agree_with_the_coach_let_the_loop_promote_by_itself(db):
    """Release mode (issue 33): with no `loop.gate`, the loop promotes by itself only when
    users' feedback checks the coach; a coach users contradict, or one unrelated to what
    they say, leaves a winning canary for a person to review."""
    from onjob.deploy.decide import trust
    from onjob.deploy.settings import DeploySettings

    def mode(name: str) -> trust.ReleaseMode:
        coach = JudgeSettings(rewards={name: RewardFn(fn=f"{__name__}:{name}")})
        return trust.release_mode(store, DeploySettings(judge=coach))

    store = Store(db)
    try:
        users = mode("agrees")
        assert (users.mode, users.automatic) == ("users", True), users.reason
        assert "fn:agrees" in users.reason
        for name in ("contrary", "parity"):
            review = mode(name)
            assert (review.mode, review.automatic) == ("review", False)
            assert f"fn:{name}" in review.reason
    finally:
        store.close()


def test_for_a_canary_only_users_ratings_of_its_own_answers_check_its_coach(db, tmp_path):
    """The coach agreeing with users on live's answers says nothing yet about a candidate
    that may have learnt to please it: a canary is promoted by itself only once users'
    ratings of its own answers agree with its coach."""
    import shutil

    from onjob.deploy.decide import trust
    from onjob.deploy.settings import DeploySettings

    copy = tmp_path / "onjob.duckdb"
    shutil.copy(db, copy)
    coach = DeploySettings(
        judge=JudgeSettings(rewards={"agrees": RewardFn(fn=f"{__name__}:agrees")})
    )
    store = Store(copy)
    try:
        unrated = trust.release_mode(store, coach, candidate="ckpt-x")
        assert unrated.mode == "review", unrated.reason
        assert "no rated pairs on ckpt-x's answers" in unrated.reason
        # The canary answered the first conversations of every scenario; users rated them.
        store.dicts(
            "UPDATE exchanges SET checkpoint = 'ckpt-x', arm = 'canary' "
            "WHERE json_extract_string(metadata, '$.k') IN ('0', '1', '2')"
        )
        rated = trust.release_mode(store, coach, candidate="ckpt-x")
        assert rated.mode == "users", rated.reason
        assert "on ckpt-x's answers" in rated.reason
    finally:
        store.close()
