"""Tenants apart in what the loop learns from: traffic of three API keys through a real
`onjob serve` and the real openai client, the installed `onjob judge --once` against a
scripted RULER judge on loopback (`fake_judge.py`), and the real snapshot export, all on
one DuckDB file. No group, RULER prompt or training snapshot ever holds two keys'
conversations, and a key in `proxy.untrained_keys` reaches none of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from openai import OpenAI
from pydantic import ValidationError

from onjob.collector import Store
from onjob.collector.scope import KeyScope
from onjob.proxy import ProxySettings
from onjob.proxy.tenants import Lineage
from onjob.trainer import TrainSettings, snapshot

from .conftest import rows
from .fake_judge import FakeJudge, candidates, scores_json
from .test_tenants import serve

ONJOB = str(Path(sys.executable).with_name("onjob"))
KEYS = {"alice": "sk-alice-31c9e07a", "bob": "sk-bob-5a7d2f18", "carol": "sk-carol-0e4b9d26"}
SYSTEM = {"role": "system", "content": "You are a support agent."}
CONFIG = """
[judge]
group_size = 2
settle_s = 0
backoff_s = 0
min_trajectories = 2
"""


def marker(key: str) -> str:
    """What each key's users write: tells whose conversation a judge was shown."""
    return f"<<{key}>>"


def converse(server, key: str, name: str) -> None:
    """A two-turn conversation of `key`'s, named `name`, in the scenario every key names
    `refunds`."""
    client = OpenAI(base_url=server.url, api_key=KEYS[key], max_retries=0, timeout=30)
    headers = {"X-Onjob-Scenario": "refunds", "X-Onjob-Trajectory": name}
    messages = [SYSTEM, {"role": "user", "content": f"{marker(key)} order {name} is late."}]
    first = client.chat.completions.create(
        model="agent", messages=messages, max_tokens=8, extra_headers=headers
    )
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": f"{marker(key)} it was due on Monday ({name})."},
    ]
    client.chat.completions.create(
        model="agent", messages=messages, max_tokens=8, extra_headers=headers
    )


def judge_once(tmp_path: Path, engine_url: str, judge: FakeJudge, **env: str) -> str:
    env = {
        "ONJOB_PROXY__API_KEYS": json.dumps(KEYS),
        "ONJOB_JUDGE__API_BASE": judge.url,
        "ONJOB_LOOP__HOLDOUT_SHARE": "0",  # every scenario may be judged here
        **env,
    }
    done = subprocess.run(
        [ONJOB, "judge", "--once", "--config", str(tmp_path / "onjob.toml"),
         "--db", str(tmp_path / "onjob.duckdb"), "--engine-url", engine_url,
         "--model", "openai/judge"],
        cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def shown(call: dict) -> set[str]:
    """The keys whose conversations one RULER prompt holds."""
    text = json.dumps(call["messages"])
    return {key for key in KEYS if marker(key) in text}


def keys_per_group(db: Path) -> dict[str, set]:
    """Each group's members' API keys (re-sampled ones by their own row)."""
    found = rows(
        db,
        "SELECT m.group_id, list(DISTINCT e.api_key_id) AS keys FROM members m "
        "JOIN exchanges e ON e.id = m.exchange_id GROUP BY m.group_id",
    )
    return {r["group_id"]: set(r["keys"]) for r in found}


def snapshot_keys(db: Path, path: Path, untrained: list[str]) -> set[str]:
    """The API keys of every exchange a training snapshot holds."""
    store = Store(db)
    try:
        scope = KeyScope(never=tuple(untrained))
        info = snapshot.export(store, path, TrainSettings(min_spread=0.0), scope=scope)
        ids = [i for turns in pq.read_table(path).column("exchange_ids").to_pylist() for i in turns]
        assert info.groups and ids
        keys = store.dicts(
            "SELECT DISTINCT api_key_id FROM exchanges WHERE list_contains(?, id)", [ids]
        )
        assert snapshot.trainable(store, TrainSettings(min_spread=0.0), scope=scope).groups
    finally:
        store.close()
    return {r["api_key_id"] for r in keys}


def test_groups_and_ruler_prompts_hold_one_keys_traffic_and_an_untrained_key_none(
    tmp_path, fake_engine_url
):
    db = tmp_path / "onjob.duckdb"
    (tmp_path / "onjob.toml").write_text(CONFIG)
    env = {"ONJOB_PROXY__API_KEYS": json.dumps(KEYS)}

    # 1. Every key trains: two conversations each, all of a scenario every key calls
    # `refunds`; one judge pass.
    with serve(tmp_path, fake_engine_url, **env) as server:
        for key in KEYS:
            for name in ("t1", "t2"):
                converse(server, key, name)

    def rank(call: int, body: dict) -> tuple[int, str]:
        return 200, scores_json({i: i / 10 for i in candidates(body)})

    with FakeJudge(rank) as judge:
        out = judge_once(tmp_path, fake_engine_url, judge)
        first_calls = list(judge.calls)
    groups = rows(db, "SELECT id, kind, scenario_id, status FROM groups")
    kinds = {g["kind"] for g in groups}
    assert kinds == {"turn", "trajectory"} and {g["status"] for g in groups} == {"scored"}, out
    # A trajectory group per key, though all three named the same scenario.
    trajectory_groups = [g for g in groups if g["kind"] == "trajectory"]
    assert len(trajectory_groups) == 3 and len({g["scenario_id"] for g in trajectory_groups}) == 3
    # No group holds two keys' members; re-sampled answers are their source's key's.
    per_group = keys_per_group(db)
    assert all(len(keys) == 1 for keys in per_group.values()), per_group
    assert {k for keys in per_group.values() for k in keys} == set(KEYS)
    resampled = rows(
        db,
        "SELECT r.api_key_id, p.api_key_id AS source_key FROM exchanges r JOIN exchanges p "
        "ON p.id = json_extract_string(r.metadata, '$.resample_of') WHERE r.source = 'resample'",
    )
    assert resampled and all(r["api_key_id"] == r["source_key"] for r in resampled)
    # Every RULER prompt showed one key's conversations only.
    assert len(first_calls) == len(groups)
    assert all(len(shown(call)) == 1 for call in first_calls)

    # 2. carol is listed in proxy.untrained_keys: what she logged before is kept out of the
    # snapshot (it was there to take), and her new traffic from every pass.
    assert "carol" in snapshot_keys(db, tmp_path / "every.parquet", [])
    assert snapshot_keys(db, tmp_path / "kept.parquet", ["carol"]) == {"alice", "bob"}

    untrained = {**env, "ONJOB_PROXY__UNTRAINED_KEYS": '["carol"]'}
    with serve(tmp_path, fake_engine_url, **untrained) as server:
        for key in KEYS:
            for name in ("t3", "t4"):
                converse(server, key, name)
    # A group of two keys made before groups were one key's (here by hand, as an old
    # database holds them), and one of carol's made before she was listed, both unscored.
    store = Store(db)
    try:
        legacy = {}
        for name, keys in (("mixed", ("alice", "bob")), ("carols", ("carol",))):
            ends = store.dicts(
                "SELECT t.id, t.last_exchange FROM trajectories t JOIN exchanges e "
                "ON e.id = t.last_exchange WHERE list_contains(?, e.api_key_id) "
                "AND (t.id LIKE '%:t1' OR t.id LIKE '%:t2')",
                [list(keys)],
            )
            legacy[name] = f"group-legacy-{name}"
            store.con.execute(
                "INSERT INTO groups (id, scenario_id, kind, checkpoints, status, created) "
                "VALUES (?, 'scn_legacy', 'trajectory', [], 'sampled', now())",
                [legacy[name]],
            )
            for position, t in enumerate(ends):
                store.con.execute(
                    "INSERT INTO members VALUES (?, ?, ?, ?, 0, ?, 'production')",
                    [f"member-{name}-{position}", legacy[name], position, t["last_exchange"],
                     t["id"]],
                )  # fmt: skip
    finally:
        store.close()
    before = {g["id"] for g in groups}
    with FakeJudge(rank) as judge:
        out = judge_once(tmp_path, fake_engine_url, judge, ONJOB_PROXY__UNTRAINED_KEYS='["carol"]')
        second_calls = list(judge.calls)
    new = {g["id"]: g for g in rows(db, "SELECT id, kind, status, reason FROM groups")}.items()
    made = {gid: g for gid, g in new if gid not in before and gid not in legacy.values()}
    assert made and {g["status"] for g in made.values()} == {"scored"}, out
    per_group = keys_per_group(db)
    assert {k for gid in made for k in per_group[gid]} == {"alice", "bob"}
    assert all(len(per_group[gid]) == 1 for gid in made)
    # The two legacy groups are failed with the reason, and no judge call showed them.
    for name, gid in legacy.items():
        g = dict(new)[gid]
        assert g["status"] == "failed", (name, g)
    assert "2 API keys" in dict(new)[legacy["mixed"]]["reason"]
    assert "untrained_keys" in dict(new)[legacy["carols"]]["reason"]
    assert len(second_calls) == len(made)
    assert all(len(shown(call)) == 1 and "carol" not in shown(call) for call in second_calls)
    assert snapshot_keys(db, tmp_path / "after.parquet", ["carol"]) == {"alice", "bob"}
    # carol's traffic is logged all the same.
    logged = rows(db, "SELECT count(*) AS n FROM exchanges WHERE api_key_id = 'carol' "
                      "AND source = 'production'")  # fmt: skip
    assert logged[0]["n"] == 8


def test_untrained_keys_need_api_keys():
    with pytest.raises(ValidationError, match="api_keys is empty"):
        ProxySettings(untrained_keys=["carol"])
    settings = ProxySettings(api_keys={"carol": "sk-1"}, untrained_keys=["carol"])
    assert settings.untrained_keys == ["carol"]


def logged_turns(store: Store, scenario_of: dict[str, str]) -> None:
    """Two finished one-turn conversations per (key, scenario), on the live arm, stored as
    the loader stores them: `exchanges`, `trajectories` and `scenarios` rows."""
    for scenario in set(scenario_of.values()):
        store.con.execute(
            "INSERT INTO scenarios VALUES (?, 'refunds', 'explicit', now(), 2)", [scenario]
        )
    for key, scenario in scenario_of.items():
        for n in range(2):
            request = {"model": "agent", "messages": [{"role": "user", "content": key}]}
            store.con.execute(
                "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, api_key_id, "
                "model_alias, arm, stream, request, response, status, source) VALUES (?, "
                "now() - INTERVAL 1 MINUTE, ?, 0, ?, ?, 'agent', 'live', false, ?, '{}', 200, "
                "'production')",
                [f"x-{key}-{n}", f"{key}:c{n}", scenario, key, json.dumps(request)],
            )
            store.con.execute(
                "INSERT INTO trajectories (id, scenario_id, first_exchange, last_exchange, "
                "n_turns, source, first_ts, last_ts) VALUES (?, ?, ?, ?, 1, 'production', "
                "now() - INTERVAL 1 MINUTE, now() - INTERVAL 1 MINUTE)",
                [f"{key}:c{n}", scenario, f"x-{key}-{n}", f"x-{key}-{n}"],
            )


def test_a_scenario_an_older_database_shares_between_keys_makes_a_group_per_key(tmp_path):
    # Before scenarios were one key's, alice's and bob's conversations of one situation
    # had one scenario id: the judge still groups them apart.
    from onjob.judge import JudgeSettings, tables

    store = Store(tmp_path / "onjob.duckdb")
    try:
        logged_turns(store, {"alice": "scn_shared", "bob": "scn_shared", "carol": "scn_shared"})
        s = JudgeSettings(settle_s=0, per_scenario=10)
        ready = tables.scenario_candidates(store, s, untrained=["carol"])
        assert sorted((c.scenario_id, c.api_key_id) for c in ready) == [
            ("scn_shared", "alice"),
            ("scn_shared", "bob"),
        ]
        for c in ready:
            assert {t.id for t in c.trajectories} == {f"{c.api_key_id}:c0", f"{c.api_key_id}:c1"}
        turns = tables.turn_candidates(store, s, untrained=["carol"])
        assert {t.api_key_id for t in turns} == {"alice", "bob"}
    finally:
        store.close()


def test_canary_held_out_and_compare_prompts_leave_untrained_keys_out(tmp_path):
    import asyncio
    import datetime

    from onjob.collector import Collector, CollectorSettings
    from onjob.deploy import compare
    from onjob.deploy.decide import prompts

    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    try:
        logged_turns(store, {"alice": "scn_a", "carol": "scn_c"})
        since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
        for untrained, keys in (([], {"alice", "carol"}), (["carol"], {"alice"})):
            agent = Lineage("agent", scope=KeyScope(never=tuple(untrained)))
            picked = prompts.fresh(store, agent, since, 10).prompts
            assert {p.api_key_id for p in picked} == keys
            held = prompts.held_out(store, agent, ["scn_a", "scn_c"], 10)
            assert {p.api_key_id for p in held} == keys
    finally:
        store.close()

    async def compared(untrained: list[str]) -> set[str]:
        collector = Collector(CollectorSettings(db=db))
        await collector.start()
        try:
            scope = KeyScope(never=tuple(untrained))
            chosen = await compare._prompts(collector, 10, None, None, [], scope)
        finally:
            await collector.close()
        return {p.api_key_id for p in chosen}

    assert asyncio.run(compared([])) == {"alice", "carol"}
    assert asyncio.run(compared(["carol"])) == {"alice"}
