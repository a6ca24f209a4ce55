"""Scenarios whose recent groups all had equal rewards are re-sampled after the others
(`judge.settled`): about a quarter of the demo's groups of 9 scored every member alike
and were re-sampled again and again. Real DuckDB."""

from __future__ import annotations

import json

import pytest

from onjob.collector import Store
from onjob.judge import JudgeSettings
from onjob.judge.settled import settled_scenarios
from onjob.judge.tables import turn_candidates


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "onjob.duckdb")
    yield store
    store.close()


def logged(store: Store, id: str, scenario: str) -> None:
    store.con.execute(
        "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, request, "
        "prompt_token_ids, completion_token_ids, completion_logprobs, status, source) "
        "VALUES (?, now(), ?, 1, ?, ?, [1, 2], [[3]], [[-0.5]], 200, 'production')",
        [id, f"t-{id}", scenario, json.dumps({"messages": [{"role": "user", "content": id}]})],
    )


def scored(store: Store, id: str, scenario: str, rewards: list[float], age_s: int) -> None:
    store.con.execute(
        "INSERT INTO groups (id, scenario_id, kind, checkpoints, status, created) "
        "VALUES (?, ?, 'turn', [], 'scored', now() - to_seconds(?))",
        [id, scenario, age_s],
    )
    for n, reward in enumerate(rewards):
        store.con.execute(
            "INSERT INTO scores (id, group_id, member_id, source, score, created) "
            "VALUES (?, ?, ?, 'combined', ?, now())",
            [f"{id}-{n}", id, f"{id}-m{n}", reward],
        )


def test_a_scenario_whose_last_groups_were_all_equal_is_re_sampled_after_the_others(store):
    # `flat` has fewer groups (the old order's first pick) but both scored alike;
    # `spread` has more, each with something to learn; `mixed` spread once, long ago.
    for scenario, groups in {
        "flat": [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]],
        "spread": [[1.0, 0.0, 0.5], [0.0, 1.0, 0.0], [0.5, 0.0, 0.0]],
        "mixed": [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    }.items():
        for age, rewards in enumerate(reversed(groups)):
            scored(store, f"{scenario}-{age}", scenario, rewards, age_s=10 * age)
        logged(store, f"x-{scenario}", scenario)

    assert settled_scenarios(store, 2) == ["flat"]
    assert settled_scenarios(store, 1) in (["flat", "mixed"], ["mixed", "flat"])
    assert settled_scenarios(store, 3) == []  # `flat` has only two groups
    assert settled_scenarios(store, 0) == []

    s = JudgeSettings(max_groups=3, per_scenario=1)
    order = [c.scenario_id for c in turn_candidates(store, s, later=["flat"])]
    assert order == ["mixed", "spread", "flat"]
    # Without it, fewer groups first: the settled scenario came before `spread`.
    old = [c.scenario_id for c in turn_candidates(store, s)]
    assert old.index("flat") < old.index("spread"), old
    one = JudgeSettings(max_groups=1, per_scenario=1)
    assert [c.scenario_id for c in turn_candidates(store, one, later=["flat"])] == ["mixed"]
