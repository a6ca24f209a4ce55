"""Daily budgets on a real DuckDB file, through the installed commands: the RULER judge
(a real HTTP judge on loopback, priced through litellm's custom pricing) stops being
called once the day's spend reaches `judge.max_usd_per_day`, its groups wait `sampled`
and are judged the next UTC day; the loop of a real `onjob serve` starts no training
run once `trainer.max_minutes_per_day` is spent, says so in its log, `/admin/status`
and the dashboard, and its train stage runs again the next day. "The next day" is
today's rows moved back 24 hours."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import httpx

from onjob.cli.process import ServerProcess, free_port
from onjob.collector import Collector, CollectorSettings, ExchangeRecord, Store, budgets
from onjob.collector.records import to_json
from onjob.judge import tables
from onjob.judge.ruler import Judgement

from .conftest import record_trained, rows
from .fake_judge import FakeJudge, candidates, scores_json

ONJOB = str(Path(sys.executable).with_name("onjob"))
ADMIN = {"Authorization": "Bearer adm-secret"}
SCENARIOS = 4  # each with two finished conversations: one trajectory group each
# The fake judge reports 100 prompt and 20 completion tokens per call: $0.14 a call.
JUDGE = """
[judge]
model = "openai/budget-judge"
api_base = "{url}"
attempts = 1
concurrency = 1
settle_s = 0
max_usd_per_day = 0.25
input_cost_per_token = 0.001
output_cost_per_token = 0.002
[judge.rewards]
short = {{ fn = "my_rewards:short" }}
"""
# Every scenario judged: these tests count the groups a budget lets through, and a fitted
# held-out share (deploy/decide/fit.py: 30% of a few scenarios) would take one of them away.
JUDGE += "[loop]\nholdout_share = 0\n"
REWARDS = "def short(rollout):\n    return 1.0 if len(rollout.text) < 12 else 0.0\n"


def tomorrow() -> str:
    return f"{(datetime.now(UTC) + timedelta(days=1)):%Y-%m-%d} 00:00 UTC"


def log_conversations(
    db: Path, keys: tuple[str | None, ...] = (None,), scenarios: int = SCENARIOS
) -> None:
    """Per API key (None: none), `scenarios` scenarios of two one-turn conversations with
    different answers, through the collector (spool, then DuckDB) as the proxy logs them."""

    async def main():
        collector = Collector(CollectorSettings(db=db))
        await collector.start()
        for key in keys:
            for s in range(scenarios):
                for c in range(2):
                    asked = f"{key} question {s}" if key else f"question {s}"
                    messages = [{"role": "user", "content": asked}]
                    placement = collector.stitcher.place(
                        messages, trajectory_id=f"conv-{s}-{c}", api_key_id=key
                    )
                    answer = {"role": "assistant", "content": f"answer {s}" + " more" * c}
                    collector.log(
                        ExchangeRecord(
                            id=f"chatcmpl-{uuid.uuid4().hex}",
                            ts=time.time() - 60,
                            trajectory_id=placement.trajectory_id,
                            turn=placement.turn,
                            scenario_id=placement.scenario_id,
                            scenario_key=placement.scenario_key,
                            scenario_keyed=placement.scenario_keyed,
                            model_alias="agent",
                            api_key_id=key,
                            request=to_json({"model": "agent", "messages": messages}),
                            response=to_json({"choices": [{"index": 0, "message": answer}]}),
                            prompt_token_ids=[1, 2, 3],
                            completion_token_ids=[[4, 5]],
                            completion_logprobs=[[-0.5, -0.25]],
                        )
                    )
        await collector.close()

    asyncio.run(main())


def to_yesterday(db: Path, table: str) -> None:
    store = Store(db)
    try:
        store.con.execute(f"UPDATE {table} SET created = created - INTERVAL 1 DAY")
    finally:
        store.close()


def onjob(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    nowhere = f"http://127.0.0.1:{free_port()}"  # no engine: nothing here needs one
    done = subprocess.run(
        [ONJOB, *args, "--engine-url", nowhere],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def statuses(db: Path) -> list[str]:
    return sorted(r["status"] for r in rows(db, "SELECT status FROM groups"))


def test_a_spent_judge_budget_stops_judge_calls_and_its_groups_are_judged_the_next_day(
    tmp_path,
):
    db = tmp_path / "onjob.duckdb"
    log_conversations(db)
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    with FakeJudge(lambda n, body: (200, scores_json(dict.fromkeys(candidates(body), 0.5)))) as j:
        (tmp_path / "onjob.toml").write_text(JUDGE.format(url=j.url))

        first = onjob(tmp_path, "judge", "--once")
        # $0.14 after the first call, $0.28 after the second: no third call today.
        assert len(j.calls) == 2, first.stdout
        assert statuses(db) == ["sampled", "sampled", "scored", "scored"]
        costs = rows(db, "SELECT cost_usd FROM judgements")
        assert [round(c["cost_usd"], 6) for c in costs] == [0.14, 0.14]
        status = f"judge budget spent: $0.28 of $0.25 today; resumes {tomorrow()}"
        assert status in first.stdout and "(2 groups wait for it)" in first.stdout
        # The waiting groups are whole: not scored by the reward function alone either.
        waiting = rows(
            db,
            "SELECT count(*) AS n FROM scores s JOIN groups g ON g.id = s.group_id "
            "WHERE g.status = 'sampled'",
        )
        assert waiting[0]["n"] == 0

        again = onjob(tmp_path, "judge", "--once")  # the same day: nothing more is spent
        assert len(j.calls) == 2
        assert statuses(db) == ["sampled", "sampled", "scored", "scored"]
        assert status in again.stdout

        to_yesterday(db, "judgements")  # the next UTC day
        tomorrow_run = onjob(tmp_path, "judge", "--once")
        assert len(j.calls) == 4, tomorrow_run.stdout
        assert statuses(db) == ["scored"] * SCENARIOS  # nothing was dropped
        assert "scored 2," in tomorrow_run.stdout


TRAIN = "[trainer]\nmax_minutes_per_day = 10\n"


def test_a_spent_training_budget_pauses_the_loops_training_visibly_until_the_next_day(
    tmp_path,
):
    db = tmp_path / "onjob.duckdb"
    (tmp_path / "onjob.toml").write_text(TRAIN)
    store = Store(db)
    earlier = {"duration_s": 15 * 60}  # 15 minutes
    record_trained(store, "ckpt-earlier", tmp_path / "ckpt-earlier", "base", metrics=earlier)
    store.close()

    nowhere = f"http://127.0.0.1:{free_port()}"
    env = {
        "ONJOB_PROXY__ADMIN_KEY": "adm-secret",
        "ONJOB_LOOP__INTERVAL_S": "0.5",
        "ONJOB_TRAINER__MAX_MINUTES_PER_DAY": "10",
    }
    args = ["--engine-url", nowhere, "--db", str(db)]
    status = f"train budget spent: 15.0 of 10.0 minutes today; resumes {tomorrow()}"
    with ServerProcess(args, env=env) as server:
        budget = {}
        deadline = time.monotonic() + 60
        while "train" not in budget and time.monotonic() < deadline:
            time.sleep(0.2)
            loop = httpx.get(f"{server.base}/admin/status", headers=ADMIN).json()["loop"]
            budget = loop["budget"]
        assert budget["train"]["paused"] is True, server.output()
        assert budget["train"]["spent"] == 15.0 and budget["train"]["limit"] == 10.0
        assert budget["train"]["status"].startswith(status)
        assert f"{status}; the groups wait" in server.output()
        page = httpx.get(f"{server.base}/dashboard", headers=ADMIN)
        assert page.status_code == 200 and status in page.text
    assert "training on" not in server.output()

    to_yesterday(db, "train_runs")  # the next UTC day: the train stage runs again
    done = onjob(tmp_path, "loop", "--once")
    assert "train budget spent" not in done.stdout
    assert "train agent: 0 new trainable groups;" in done.stdout  # it waits for groups now


def test_a_day_is_the_utc_calendar_day_whatever_the_callers_time_zone(tmp_path):
    store = Store(tmp_path / "onjob.duckdb")
    try:
        for cost, created in ((0.5, "2025-03-01 23:59:59+00"), (0.25, "2025-03-02 00:00:01+00")):
            call = Judgement("ruler:j", f"key-{cost}", status="ok", cost_usd=cost)
            tables.save_scores(
                store, "group-x", status="scored", reason=None, judgements=[(call, None)], scores=[]
            )
            store.con.execute(
                "UPDATE judgements SET created = ?::TIMESTAMPTZ WHERE cache_key = ?",
                [created, call.cache_key],
            )
        noon = datetime(2025, 3, 2, 12, tzinfo=UTC)
        assert budgets.judge(store, 0.3, now=noon).spent == 0.25
        assert budgets.judge(store, 0.3, now=noon).resumes_at == datetime(2025, 3, 3, tzinfo=UTC)
        # 01:00 in UTC+5 is still 1 March in UTC: the day before's spend, already over.
        early = datetime(2025, 3, 2, 1, tzinfo=timezone(timedelta(hours=5)))
        assert budgets.judge(store, 0.3, now=early).spent == 0.5
        assert budgets.judge(store, 0.3, now=early).spent_out
    finally:
        store.close()
