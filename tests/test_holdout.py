"""The held-out slice: scenarios no training snapshot takes, where a candidate must not
lose to live before it may become a canary. Real DuckDB files; the snapshot from real
traffic through `onjob serve` and a real judge pass; the held-out comparison with the
engine scripted at its HTTP boundary (as in test_reward_hacking)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess
from onjob.collector import Collector, CollectorSettings, Store
from onjob.deploy import release
from onjob.deploy.act import deployments, registry, training
from onjob.deploy.decide import holdout
from onjob.deploy.errors import TrainingFailed
from onjob.deploy.settings import DeploySettings, GateSettings, LoopSettings
from onjob.judge.settings import RewardFn
from onjob.trainer import TrainSettings, snapshot

from .test_reward_hacking import HEDGING, QUESTION, scripted, settings

ONJOB = str(Path(sys.executable).with_name("onjob"))
CONFIG = """
[judge]
group_size = 3
temperature = 1.0
max_tokens = 8
max_groups = 8
per_scenario = 2
scenario_groups = false
[judge.rewards]
varied = { fn = "tests.demo_rewards:varied" }
"""


def judged_traffic(tmp_path, engine, topics: list[str]) -> Path:
    """A database of one request per topic (a scenario each) through `onjob serve`, judged
    by `onjob judge --once` (which places each scenario in or out of the slice)."""
    db = tmp_path / "onjob.duckdb"
    (tmp_path / "onjob.toml").write_text(CONFIG)
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)], env=env) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        for topic in topics:
            client.chat.completions.create(
                model="agent", messages=[{"role": "user", "content": f"Tell me about {topic}"}],
                max_tokens=8,
            )  # fmt: skip
    judged = subprocess.run(
        [ONJOB, "judge", "--once", "--config", str(tmp_path / "onjob.toml"), "--db", str(db),
         "--engine-url", engine.url],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert judged.returncode == 0, judged.stderr
    return db


def test_held_out_scenarios_never_enter_a_training_snapshot(tmp_path, engine):
    db = judged_traffic(tmp_path, engine, ["apples", "boats", "clouds", "dunes"])
    store = Store(db)
    try:
        trained_on = {
            r["scenario_id"]
            for r in store.dicts("SELECT DISTINCT scenario_id FROM groups WHERE kind = 'turn'")
        }
        assert len(trained_on) >= 2, trained_on
        held = sorted(trained_on)[:1]
        t = TrainSettings(min_spread=0.0)
        every = snapshot.export(store, tmp_path / "all.parquet", t)
        kept = snapshot.export(store, tmp_path / "kept.parquet", t, held_out=held)
        scenario_of = {
            r["id"]: r["scenario_id"] for r in store.dicts("SELECT id, scenario_id FROM groups")
        }
        assert {scenario_of[g] for g in every.groups} & set(held)  # it was there to take
        assert not {scenario_of[g] for g in kept.groups} & set(held)
        assert snapshot.trainable(store, t, held_out=held).groups == len(kept.groups)
        rows = pq.read_table(tmp_path / "kept.parquet").column("group_id").to_pylist()
        assert not {scenario_of[g] for g in rows} & set(held)
        # The slice is decided when the loop first sees each scenario, and stays: never
        # every scenario (the first one seen is trained on), whatever the share later.
        # (`onjob judge` above decided them, at the default share.)
        decided = holdout.held_out(store, 0.1)
        assert holdout.held_out(store, 0.999999) == decided == holdout.held_out(store, 0.0)
        assert len(decided) < len(scenario_of_ids(store))
    finally:
        store.close()


def test_a_scenario_the_loop_has_not_placed_yet_is_placed_before_a_run_can_train_on_it(
    tmp_path, engine
):
    """The slice is decided in the training snapshot's own step: scenarios first seen since
    the loop last looked (here: none placed yet) are placed before the snapshot is taken,
    so one is never trained on now and held out later. The run is made to fail right
    after its snapshot (no base model), which is all this needs."""
    db = judged_traffic(tmp_path, engine, ["apples", "boats", "clouds"])
    store = Store(db)
    store.con.execute("DELETE FROM holdout_slice")  # seen since the loop last looked
    store.close()
    settings = DeploySettings(
        collector=CollectorSettings(db=db),
        trainer=TrainSettings(
            min_spread=0.0, base_model=tmp_path / "no-model", checkpoints_dir=tmp_path / "ck"
        ),
        loop=LoopSettings(holdout_share=0.999999),  # every scenario but the first held out
    )

    async def run():
        collector = Collector(settings.collector)
        await collector.start()
        try:
            return await training.train(collector, settings, parent=None, echo=lambda _: None)
        finally:
            await collector.close()

    with pytest.raises(TrainingFailed):
        asyncio.run(run())
    store = Store(db)
    try:
        placed = {r["scenario_id"]: r["held"] for r in store.dicts("SELECT * FROM holdout_slice")}
        assert set(placed) == set(scenario_of_ids(store)) and sum(placed.values()) == 2
        snap = next((tmp_path / "ck" / ".snapshots").glob("*.parquet"))
        taken = set(pq.read_table(snap).column("group_id").to_pylist())
        scenario_of = {
            r["id"]: r["scenario_id"] for r in store.dicts("SELECT id, scenario_id FROM groups")
        }
        assert taken and {scenario_of[g] for g in taken} == {
            s for s, held in placed.items() if not held
        }
    finally:
        store.close()


def scenario_of_ids(store) -> list[str]:
    return [r["id"] for r in store.dicts("SELECT id FROM scenarios")]


def candidate_against_live(tmp_path, tiny_adapter_dir, tiny_model_dir, candidate_says, gate):
    s = settings(tmp_path / "onjob.duckdb", "partial", gate=gate, holdout_pairs=24)
    store = Store(s.collector.db)
    registry.add(store, tiny_adapter_dir, "ckpt-hack", tiny_model_dir)
    for i in range(24):
        store.con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, model_alias, arm, "
            "stream, request, status, source) VALUES (?, now(), ?, 0, 'scn-held', 'agent', "
            "'live', false, ?, 200, 'production')",
            [f"h-{i}", f"ht-{i}", json.dumps({"model": "agent", "messages": QUESTION})],
        )
    # The slice as the loop decided it when it first saw the scenario.
    store.con.execute("INSERT INTO holdout_slice VALUES ('scn-held', true, 0.01, now())")
    store.close()

    async def run():
        async with scripted(s, candidate_says) as (collector, client, op):
            pipeline = release.Release(collector, client, op, s, lambda _: None)
            return await release.offline_test(pipeline, live=None, candidate="ckpt-hack")

    return asyncio.run(run()), s


def test_a_candidate_that_loses_on_the_held_out_slice_is_stopped_before_serving_anyone(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    gate = GateSettings(rewards={"exact": RewardFn(fn="tests.hacking_rewards:exact")})
    checked, s = candidate_against_live(tmp_path, tiny_adapter_dir, tiny_model_dir, HEDGING, gate)
    # Every pair lost (live right a quarter of the time, the hedger never, under the
    # referee): the slice's own test shows it worse than live where nobody trained.
    assert checked.decision == "rollback", checked.reason
    assert "worse than live on the held-out slice" in checked.reason
    held = checked.evidence.held_out
    assert held.pairs == 24 and held.losses == 24
    assert held.worse_e_value >= 1 / s.loop.beta
    assert checked.evidence.paired.pairs == 0  # the release test's own pairs: none
    # What the loop does with it: retired, the routing unchanged, the reason on record.
    store = Store(s.collector.db)
    try:
        row = deployments.reject(
            store, "agent", "ckpt-hack", default_live=None,
            reason=f"stopped before canary: {checked.reason}", actor="loop",
            evidence=checked.evidence,
        )  # fmt: skip
        assert (row.live, row.canary) == (None, None)
        assert "worse than live on the held-out slice" in row.reason
        assert registry.get(store, "ckpt-hack").status == "retired"
    finally:
        store.close()


def test_a_candidate_that_does_not_lose_on_the_held_out_slice_may_become_the_canary(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    # Under the training reward (half credit for hedging) the hedger loses none of these
    # pairs: as good as live (right one time in two, of two answers) or better.
    checked, _ = candidate_against_live(
        tmp_path, tiny_adapter_dir, tiny_model_dir, HEDGING, GateSettings()
    )
    assert checked.decision != "rollback", checked.reason
    held = checked.evidence.held_out
    assert held.pairs == 24 and held.losses == 0 and not held.worse


def test_the_judge_spends_nothing_on_held_out_scenarios(tmp_path, engine):
    """`onjob judge` (like the loop's pass) re-samples no turn of a held-out scenario: no
    run would train on the group."""
    import os

    db = tmp_path / "onjob.duckdb"
    (tmp_path / "onjob.toml").write_text(CONFIG)
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)], env=env) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        for topic in ("apples", "boats", "clouds", "dunes"):
            client.chat.completions.create(
                model="agent", messages=[{"role": "user", "content": f"Tell me about {topic}"}],
                max_tokens=8,
            )  # fmt: skip
    store = Store(db)
    try:
        seen = [r["id"] for r in store.dicts("SELECT id FROM scenarios ORDER BY first_seen, id")]
    finally:
        store.close()
    shares = sorted((holdout.share(i), i) for i in seen)
    assert len(shares) == 4
    cut = (shares[1][0] + shares[2][0]) / 2  # two scenarios in the slice by hash, two not
    # As `held_out` decides at first sight: in the slice, unless nothing before it is trained on.
    held: set[str] = set()
    for i, scenario in enumerate(seen):
        if holdout.share(scenario) < cut and len(held) < i:
            held.add(scenario)
    judged = subprocess.run(
        [ONJOB, "judge", "--once", "--config", str(tmp_path / "onjob.toml"), "--db", str(db),
         "--engine-url", engine.url],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600,
        env={**os.environ, "ONJOB_LOOP__HOLDOUT_SHARE": str(cut)},
    )  # fmt: skip
    assert judged.returncode == 0, judged.stderr
    store = Store(db)
    try:
        sampled = {r["scenario_id"] for r in store.dicts("SELECT scenario_id FROM groups")}
    finally:
        store.close()
    assert sampled == {i for _, i in shares} - held
