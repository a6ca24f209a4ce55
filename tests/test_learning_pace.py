"""When a lineage trains and whether its groups carry signal (issue 62 items 3 and 4): a
lineage's first run starts on a few groups (cold start); later runs follow the groups
the last ten minutes gave, counting only groups a run can learn from, and never wait
longer than those ten minutes (the fit cannot chase its own count); scenarios whose
groups are flat are left alone by the judge for a while, and the loop says when there
is no signal. Real DuckDB files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from onjob.collector import Store
from onjob.collector.scope import EVERY_KEY
from onjob.deploy.decide import fit
from onjob.deploy.loop import LoopState, run_once
from onjob.deploy.settings import DeploySettings
from onjob.judge import signal

from .test_reward_hacking import QUESTION, scripted, settings


@pytest.fixture
def store(tmp_path: Path):
    store = Store(tmp_path / "onjob.duckdb")
    yield store
    store.close()


def scored(store: Store, group: str, scenario: str, rewards: list[float], ago_s: int = 0):
    """A scored turn group of `scenario`, its members' combined rewards `rewards`."""
    con = store.con
    con.execute(
        "INSERT INTO groups (id, scenario_id, kind, status, created) "
        "VALUES (?, ?, 'turn', 'scored', now() - to_seconds(?::BIGINT))",
        [group, scenario, ago_s],
    )
    for i, reward in enumerate(rewards):
        x, m = f"{group}-x{i}", f"{group}-m{i}"
        con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, api_key_id) "
            "VALUES (?, now(), ?, 0, ?, 'key-a')",
            [x, f"{group}-t{i}", scenario],
        )
        con.execute("INSERT INTO members VALUES (?, ?, ?, ?, 0, ?, 'sample')",
                    [m, group, i, x, f"{group}-t{i}"])  # fmt: skip
        con.execute(
            "INSERT INTO scores (id, group_id, member_id, source, score, created) "
            "VALUES (?, ?, ?, 'combined', ?, now())",
            [f"{m}-s", group, m, reward],
        )


def test_a_lineages_first_run_waits_for_a_few_groups_and_later_runs_follow_the_fit():
    settings = DeploySettings(trainer={"max_groups": 64})
    # A busy window asked a first run to wait for 64 groups: 12 minutes in, on a new task.
    assert fit.min_groups(settings, 40, runs=0) == fit.COLD_START_GROUPS == 6
    assert fit.min_groups(settings, 40, runs=1) == 40
    assert fit.min_groups(settings, 200, runs=3) == 64
    assert fit.min_groups(settings, 1, runs=3) == fit.MIN_GROUPS
    set_ = DeploySettings(loop={"min_new_groups": 9})
    assert fit.min_groups(set_, 40, runs=0) == 9  # a value set is used as it is


def test_a_run_never_waits_past_ten_minutes_of_groups_for_its_own_count():
    """The fitted count grew as fast as the groups it waited for (7 for 8, 19 for 20, ...
    61 for 64): once the oldest ready group has waited the window, the run starts."""
    settings = DeploySettings()
    assert not fit.due(settings, ready=61, wanted=64, oldest_s=300)
    assert fit.due(settings, ready=61, wanted=64, oldest_s=fit.GROUPS_WINDOW_S)
    assert fit.due(settings, ready=64, wanted=64, oldest_s=0)
    assert not fit.due(settings, ready=fit.MIN_GROUPS - 1, wanted=8, oldest_s=3600)
    # A count the user set is waited for, however long.
    set_ = DeploySettings(loop={"min_new_groups": 20})
    assert not fit.due(set_, ready=19, wanted=20, oldest_s=3600)


def test_only_groups_with_a_spread_of_rewards_count_toward_the_next_run(store):
    scored(store, "learnable", "s1", [1.0, 0.0, 0.5])
    scored(store, "flat-zero", "s2", [0.0, 0.0, 0.0])
    scored(store, "flat-one", "s3", [1.0, 1.0, 1.0])
    scored(store, "old", "s4", [1.0, 0.0], ago_s=3600)
    assert fit.recent_groups(store, EVERY_KEY) == 1


def test_a_scenario_whose_groups_are_flat_is_left_alone_and_the_loop_says_no_signal(store):
    scored(store, "a1", "never", [0.0, 0.0, 0.0], ago_s=60)
    scored(store, "a2", "never", [0.0, 0.0, 0.0])
    scored(store, "b1", "always", [1.0, 1.0, 1.0])  # one flat group: not yet
    scored(store, "c1", "split", [0.0, 0.0, 0.0], ago_s=60)
    scored(store, "c2", "split", [1.0, 0.0, 0.0])  # its newest split the answers
    scored(store, "d1", "stale", [0.0, 0.0], ago_s=2 * signal.SILENT_S)
    scored(store, "d2", "stale", [0.0, 0.0], ago_s=2 * signal.SILENT_S)  # tried again
    assert signal.silent_scenarios(store) == ["never"]

    s = signal.signal(store)
    assert (s.scored, s.flat, s.all_zero, s.all_top, s.silent) == (5, 4, 3, 1, 1)
    assert s.none
    assert s.line.startswith("NO SIGNAL: 1 of 5 groups scored in the last 10 minutes")
    assert "every member scored 0: the model never succeeds" in s.line
    # Another key's traffic is not this lineage's signal.
    other = signal.signal(store, "e.api_key_id = ?", ["key-b"])
    assert other.scored == 0 and not other.none


def test_groups_that_split_the_answers_are_signal(store):
    for i in range(5):
        scored(store, f"g{i}", f"s{i}", [1.0, 0.0, 0.5])
    s = signal.signal(store)
    assert not s.none and s.line.startswith("5 of 5 groups")


def served(store: Store, arm: str, conversations: int, turns: int, first: int = 0) -> None:
    """`conversations` production conversations of `turns` turns each on `arm`, answered."""
    for c in range(first, first + conversations):
        for t in range(turns):
            store.con.execute(
                "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, model_alias, "
                "arm, source, status, latency_ms) "
                "VALUES (?, now(), ?, ?, 's', 'agent', ?, 'production', 200, 100)",
                [f"{arm}-{c}-{t}", f"{arm}-{c}", t, arm],
            )


def test_the_guards_count_a_tool_agents_turns_toward_their_floor(store):
    """A tool agent of 1.5 conversations a minute waited 27 minutes for 20 conversations
    per arm; each of its turns is a request a user waited on, checked as one."""
    from datetime import UTC, datetime, timedelta

    from onjob.deploy.decide import guards
    from onjob.deploy.settings import LoopSettings
    from onjob.proxy.tenants import Tenants

    lineage = Tenants.of(DeploySettings().proxy).lineage("agent")
    since = datetime.now(UTC) - timedelta(minutes=5)
    served(store, "live", 6, 3)
    served(store, "canary", 6, 3)
    (service, _) = guards.on_traffic(store, lineage, since, LoopSettings())
    assert service.found.holding == (
        "the guards need 20 turns served per arm (live 18 in 6 conversations, canary 18 in 6: "
        "50.0% of the turns)"
    )
    served(store, "live", 1, 3, first=6)
    served(store, "canary", 1, 3, first=6)  # 7 conversations, 21 turns each: enough
    (service, _) = guards.on_traffic(store, lineage, since, LoopSettings())
    assert service.found.holding is None and service.found.tripped is None


def test_status_shows_the_groups_a_judge_pass_scored_before_the_iteration_ends(tmp_path):
    """An iteration's judge pass, run and offline test take minutes on a CPU: what `onjob
    status` shows of a lineage (its signal, the groups ready) is counted again after the
    pass, not left as the iteration found it (a newcomer read "no signal" while a run
    trained on the pass's groups). The real `run_once` on a real DuckDB file, the engine
    scripted at its HTTP boundary (live right one time in four)."""
    s = settings(tmp_path / "onjob.duckdb", "exact", train=False)
    s = s.model_copy(update={"judge": s.judge.model_copy(update={"max_groups": 8})})
    store = Store(s.collector.db)
    for i in range(6):
        store.con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, model_alias, "
            "stream, request, response, status, latency_ms, source) VALUES "
            "(?, now(), ?, 0, ?, 'agent', false, ?, ?, 200, 50, 'production')",
            [
                f"x-{i}",
                f"t-{i}",
                f"scn-{i}",
                json.dumps({"model": "agent", "messages": QUESTION}),
                json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "4"}}]}),
            ],
        )  # fmt: skip
    store.close()
    state, said = LoopState(), []

    async def iterate():
        async with scripted(s, "4") as (collector, client, op):
            await run_once(collector, client, op, s, said.append, state)

    asyncio.run(iterate())
    shown = state.lineages["agent"]
    assert shown.signal is not None and shown.signal.scored >= 1, (shown, said)
    assert shown.ready_groups == shown.signal.scored - shown.signal.flat >= 1, shown
