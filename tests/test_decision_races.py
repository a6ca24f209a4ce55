"""Decisions bound to their evidence, on a real DuckDB file and a scripted engine at the
HTTP boundary: a decision about a routing that has since changed is dropped; a promotion
cut short still leaves router and database agreeing; the replaced live adapter stays
loaded for in-flight requests and an instant revert; unload failures surface; each canary
draws its own conversations; a canary that cannot answer loses the pair."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from onjob.collector import Collector, CollectorSettings, Store
from onjob.deploy.act import deployments, registry
from onjob.deploy.act.operator import Operator
from onjob.deploy.decide import pairs, stats
from onjob.judge import JudgeSettings, tables
from onjob.proxy import Router
from onjob.proxy.routing import canary_share

from .fake_engine import completion

ALIAS = "agent"


@pytest.fixture
def db(tmp_path, tiny_adapter_dir, tiny_model_dir):
    store = Store(tmp_path / "onjob.duckdb")
    for name in ("ckpt-1", "ckpt-2", "ckpt-3"):
        registry.add(store, tiny_adapter_dir, name, tiny_model_dir)
    store.close()
    return tmp_path / "onjob.duckdb"


class Engine:
    """vLLM's LoRA endpoints, scripted: records every load and unload; `fail_unload` makes
    unloading answer 500."""

    def __init__(self, fail_unload: bool = False) -> None:
        self.loaded: set[str] = set()
        self.unloaded: list[str] = []
        self.fail_unload = fail_unload

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/models"):
            data = [{"id": "base", "parent": None}]
            data += [{"id": n, "parent": "base"} for n in sorted(self.loaded)]
            return httpx.Response(200, json={"object": "list", "data": data})
        body = json.loads(request.content)
        if path.endswith("/load_lora_adapter"):
            self.loaded.add(body["lora_name"])
            return httpx.Response(200, text="ok")
        if path.endswith("/unload_lora_adapter"):
            if self.fail_unload:
                return httpx.Response(500, json={"error": {"message": "engine busy"}})
            self.loaded.discard(body["lora_name"])
            self.unloaded.append(body["lora_name"])
            return httpx.Response(200, text="ok")
        return httpx.Response(404)


async def operator_on(db, engine: Engine) -> tuple[Operator, Collector]:
    collector = Collector(CollectorSettings(db=db))
    await collector.start()
    client = httpx.AsyncClient(transport=httpx.MockTransport(engine), base_url="http://engine/v1")
    op = Operator(collector, Router({ALIAS: None}, upstream=None), client, {ALIAS: None})
    await op.restore()
    return op, collector


def test_a_decision_about_a_routing_that_has_changed_is_dropped(db):
    store = Store(db)
    kw = {"default_live": None, "actor": "test"}
    deployments.set_canary(store, ALIAS, "ckpt-1", 0.5, reason="first", **kw)
    evaluated = deployments.current(store)[ALIAS]
    # Meanwhile, by hand: the canary rolled back and another one started.
    deployments.rollback(store, ALIAS, reason="by hand", **kw)
    deployments.set_canary(store, ALIAS, "ckpt-2", 0.5, reason="second", **kw)
    with pytest.raises(deployments.RoutingChanged):
        deployments.promote(store, ALIAS, reason="won", expected=evaluated, **kw)
    now = deployments.current(store)[ALIAS]
    assert (now.live, now.canary) == (None, "ckpt-2")  # nothing promoted
    assert registry.get(store, "ckpt-2").status == "canary"
    # On the routing it was evaluated on, the same call goes through.
    deployments.promote(store, ALIAS, reason="won", expected=now, **kw)
    assert deployments.current(store)[ALIAS].live == "ckpt-2"
    store.close()


def test_a_promotion_cut_short_leaves_router_and_database_agreeing(db):
    async def run():
        engine = Engine()
        op, collector = await operator_on(db, engine)
        try:
            await op.set_canary(ALIAS, "ckpt-1", 0.5, reason="r", actor="test")
            task = asyncio.create_task(op.promote(ALIAS, reason="won", actor="loop"))
            await asyncio.sleep(0)  # the change is under way: the loop is paused now
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(200):  # the database write finishes on its own thread
                recorded = (await collector.query(deployments.current))[ALIAS]
                if recorded.live == "ckpt-1":
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            arms = op.router.arms[ALIAS]
            assert (arms.live, arms.canary) == (recorded.live, recorded.canary)
            assert arms.live == "ckpt-1"
        finally:
            await collector.close()

    asyncio.run(run())


def test_the_replaced_live_adapter_stays_loaded_until_the_next_promotion(db):
    async def run():
        engine = Engine()
        op, collector = await operator_on(db, engine)
        try:
            for name in ("ckpt-1", "ckpt-2", "ckpt-3"):
                await op.set_canary(ALIAS, name, 0.5, reason="r", actor="test")
                row = await op.promote(ALIAS, reason="won", actor="test")
                assert row.warnings == []
            # ckpt-1 left when ckpt-3 was promoted; ckpt-2 (replaced just now) stays for
            # requests in flight on it and for a revert.
            assert engine.unloaded == ["ckpt-1"]
            assert engine.loaded == {"ckpt-2", "ckpt-3"}
        finally:
            await collector.close()

    asyncio.run(run())


def test_an_unload_that_fails_is_reported_not_swallowed(db):
    async def run():
        engine = Engine(fail_unload=True)
        op, collector = await operator_on(db, engine)
        try:
            await op.set_canary(ALIAS, "ckpt-1", 0.5, reason="r", actor="test")
            row = await op.rollback(ALIAS, reason="lost", actor="test")
            assert row.canary is None  # the rollback itself stands
            [warning] = row.warnings
            assert "ckpt-1" in warning and "500" in warning
        finally:
            await collector.close()

    asyncio.run(run())


def test_each_canary_draws_its_own_conversations():
    ids = [f"conversation-{i}" for i in range(4000)]
    first = {t for t in ids if canary_share(t, "ckpt-1") < 0.1}
    second = {t for t in ids if canary_share(t, "ckpt-2") < 0.1}
    assert 300 < len(first) < 500 and 300 < len(second) < 500
    # Independent draws overlap in ~10% of each; an unsalted hash would give the same set.
    assert len(first & second) < 0.25 * len(first)
    assert all(canary_share(t, "ckpt-1") == canary_share(t, "ckpt-1") for t in ids[:50])


def test_a_canary_that_cannot_answer_loses_the_pair(tmp_path):
    """A paired round against an engine where the canary's adapter answers 500: every
    pair is recorded as failed on the canary's side and counted as its loss."""

    def chat(request: httpx.Request) -> httpx.Response:
        model = json.loads(request.content)["model"]
        if model == "ckpt-b":
            return httpx.Response(500, json={"error": {"message": "adapter broken"}})
        return httpx.Response(200, json=completion("4", model=model))

    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    for i in range(6):
        store.con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, model_alias, "
            "arm, stream, request, status, source) VALUES (?, now(), ?, 0, 'scn', 'agent', "
            "'live', false, ?, 200, 'production')",
            [f"x-{i}", f"t-{i}", json.dumps({"messages": [{"role": "user", "content": "2+2"}]})],
        )
    prompts = store.rows(tables.LoggedTurn, f"SELECT {tables.LOGGED_TURN} FROM exchanges e")
    store.close()

    async def run():
        collector = Collector(CollectorSettings(db=db))
        await collector.start()
        engine = httpx.AsyncClient(transport=httpx.MockTransport(chat), base_url="http://e/v1")
        try:
            models = {"a": ("base", None), "b": ("ckpt-b", "ckpt-b")}
            s = JudgeSettings(group_size=1, attempts=1)
            await pairs.paired_round(
                collector, engine, s, {}, prompts, models, test="t1", echo=lambda _: None
            )
            return await collector.query(lambda st: pairs.ab_outcomes(st, "g.test = ?", ["t1"]))
        finally:
            await collector.close()

    outcomes, unjudged = asyncio.run(run())
    tally = stats.tally([o for outs in outcomes.values() for o in outs])
    assert (tally.pairs, tally.losses, unjudged) == (6, 6, [])
    failed = rows_of(db, "SELECT status, failed_arm, test FROM groups WHERE kind = 'ab'")
    assert failed == [{"status": "failed", "failed_arm": "b", "test": "t1"}] * 6


def rows_of(db, sql):
    store = Store(db)
    try:
        return store.dicts(sql)
    finally:
        store.close()
