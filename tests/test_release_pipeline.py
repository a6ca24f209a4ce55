"""The release pipeline (`deploy/release.py`): a trained candidate is decided at the
engine's speed on the last day's prompts it did not train on, before it serves anyone;
the canary is left to check what only real traffic shows, and ends at its cap. Real
DuckDB files, the real paired rounds, reward functions and operator; the engine scripted
at its HTTP boundary (tests/test_reward_hacking's live and candidate)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import msgspec

from onjob.collector import Store
from onjob.deploy import release
from onjob.deploy.act import deployments
from onjob.deploy.decide import ledger, pairs, prompts, verdict
from onjob.deploy.records import Routing
from onjob.deploy.settings import GateSettings
from onjob.judge.settings import RewardFn
from onjob.proxy.tenants import Lineage

from .conftest import record_trained, rows
from .test_reward_hacking import HEDGING, QUESTION, scripted, settings

EXACT = GateSettings(rewards={"exact": RewardFn(fn="tests.hacking_rewards:exact")})

AGENT = Lineage("agent")  # the shared lineage of a server with no tenants


def trained_candidate(store, adapter, base) -> None:
    """`ckpt-hack` as the loop records it: a train run, a candidate."""
    record_trained(store, "ckpt-hack", adapter, base, config={"started_by": "loop"})


def log(store, n: int, prefix: str, when: str, arm: str = "live", turns: int = 1) -> None:
    """`n` conversations of `turns` answered production turns each, logged at `when` (a
    DuckDB expression) on `arm`."""
    for i in range(n):
        for turn in range(turns):
            messages = QUESTION + [{"role": "assistant", "content": "4"}, *QUESTION] * turn
            store.con.execute(
                "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, model_alias, "
                f"arm, checkpoint, stream, request, status, latency_ms, source) VALUES (?, {when}, "
                "?, ?, 'scn', 'agent', ?, ?, false, ?, 200, 50, 'production')",
                [f"{prefix}-{i}-{turn}", f"{prefix}t-{i}", turn, arm,
                 "ckpt-hack" if arm == "canary" else None,
                 json.dumps({"model": "agent", "messages": messages})],
            )  # fmt: skip


def offline(s, candidate_says: str):
    """`release.trained` on `ckpt-hack`: its offline test, then its canary or its stop."""
    lines: list[str] = []

    async def run():
        async with scripted(s, candidate_says) as (collector, client, op):
            pipeline = release.Release(collector, client, op, s, lines.append)
            await release.trained(pipeline, live=None, candidate="ckpt-hack", trained_on=4)
            return (await collector.query(deployments.current)).get("agent")

    return asyncio.run(run()), "\n".join(lines)


def test_a_trained_candidate_is_decided_at_engine_speed_before_serving_anyone(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    # The candidate answers right every time, live one time in four, under the referee.
    s = settings(tmp_path / "onjob.duckdb", "partial", gate=EXACT, pairs_per_round=4)
    store = Store(s.collector.db)
    log(store, 10, "old", "now() - INTERVAL 1 HOUR")  # before its training snapshot
    trained_candidate(store, tiny_adapter_dir, tiny_model_dir)
    log(store, 40, "new", "now() + INTERVAL 1 SECOND")  # after it: no canary yet
    store.close()
    routing, said = offline(s, "4")
    assert routing.canary == "ckpt-hack", said
    assert "offline test of ckpt-hack against base: passed: won" in said
    drawn = rows(
        s.collector.db,
        "SELECT g.test, p.id, p.arm FROM groups g JOIN exchanges p ON p.id = g.prefix_exchange "
        "WHERE g.kind = 'ab'",
    )
    # Round after round back to back (4 pairs a round) until the test decided, from the
    # last day's live traffic it did not train on (before its snapshot too), one turn
    # per conversation.
    assert len(drawn) > s.loop.pairs_per_round
    assert {d["test"] for d in drawn} == {pairs.offline_test_id("ckpt-hack", None)}
    assert len({d["id"].rsplit("-", 1)[0] for d in drawn}) == len(drawn)
    assert {d["arm"] for d in drawn} == {"live"}
    [started] = rows(s.collector.db, "SELECT * FROM deployments WHERE canary = 'ckpt-hack'")
    assert "offline test: passed: won" in started["reason"]


def test_a_candidate_that_loses_offline_never_serves_anyone(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    # The hedger: paid by its coach, never right under the referee.
    s = settings(tmp_path / "onjob.duckdb", "partial", gate=EXACT, pairs_per_round=4)
    store = Store(s.collector.db)
    trained_candidate(store, tiny_adapter_dir, tiny_model_dir)
    log(store, 40, "new", "now() + INTERVAL 1 SECOND")
    store.close()
    routing, said = offline(s, HEDGING)
    assert routing.canary is None and routing.live is None, said
    assert routing.reason.startswith("stopped before canary: lost (not better by")
    [c] = rows(s.collector.db, "SELECT * FROM candidates")
    assert (c["checkpoint"], c["outcome"]) == ("ckpt-hack", "stopped")


def test_a_canary_whose_test_passed_checks_traffic_only_and_ends_at_its_cap(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    s = settings(
        tmp_path / "onjob.duckdb", "partial", gate=EXACT, pairs_per_round=4, canary_max_rounds=2
    )
    store = Store(s.collector.db)
    trained_candidate(store, tiny_adapter_dir, tiny_model_dir)
    log(store, 40, "new", "now() + INTERVAL 1 SECOND")
    store.close()
    routing, _ = offline(s, "4")
    assert routing.canary == "ckpt-hack"
    before = rows(s.collector.db, "SELECT count(*) AS n FROM groups WHERE kind = 'ab'")[0]["n"]

    def round_() -> tuple[dict, str]:
        lines: list[str] = []

        async def run():
            async with scripted(s, "4") as (collector, client, op):
                await op.restore()
                routing = (await collector.query(deployments.current))["agent"]
                await release.canary_round(
                    release.Release(collector, client, op, s, lines.append), routing
                )
                return (await collector.query(deployments.current))["agent"]

        return asyncio.run(run()), "\n".join(lines)

    # No canary traffic yet: the guards hold the promotion; the test drew no more pairs.
    routing, said = round_()
    assert routing.canary == "ckpt-hack", said
    assert "won the pairs, but the guards need 1 turns served per arm" in said
    after = rows(s.collector.db, "SELECT count(*) AS n FROM groups WHERE kind = 'ab'")[0]["n"]
    assert after == before
    # Still none at the cap: rolled back, with the reason.
    routing, said = round_()
    assert (routing.live, routing.canary) == (None, None), said
    assert "undecided after 2 rounds (loop.canary_max_rounds)" in routing.reason


def test_a_canary_whose_test_passed_is_promoted_once_traffic_clears_its_guards(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    s = settings(tmp_path / "onjob.duckdb", "partial", gate=EXACT, pairs_per_round=4)
    store = Store(s.collector.db)
    trained_candidate(store, tiny_adapter_dir, tiny_model_dir)
    log(store, 40, "new", "now() + INTERVAL 1 SECOND")
    store.close()
    routing, _ = offline(s, "4")
    store = Store(s.collector.db)
    log(store, 2, "live", "now() + INTERVAL 2 SECOND")
    log(store, 2, "canary", "now() + INTERVAL 2 SECOND", arm="canary")
    store.close()

    async def run():
        async with scripted(s, "4") as (collector, client, op):
            await op.restore()
            routing = (await collector.query(deployments.current))["agent"]
            await release.canary_round(release.Release(collector, client, op, s, print), routing)
            return (await collector.query(deployments.current))["agent"]

    routing = asyncio.run(run())
    assert (routing.live, routing.canary) == ("ckpt-hack", None), routing.reason
    [c] = rows(s.collector.db, "SELECT * FROM candidates")
    assert c["outcome"] == "promoted"


def _canary_since(started: datetime) -> Routing:
    """`ckpt-x` as the canary of the shared lineage since `started`, set by hand."""
    return Routing(
        ts=started, model_alias="agent", live=None, canary="ckpt-x", fraction=0.5,
        reason="by hand", actor="test", evidence=None,
    )  # fmt: skip


def test_an_open_canary_ends_after_its_wall_time(tmp_path):
    s = settings(tmp_path / "onjob.duckdb", "partial", gate=EXACT)
    store = Store(s.collector.db)
    try:
        started = datetime.now(UTC) - timedelta(days=2)
        routing = _canary_since(started)
        found = verdict.decide(store, s, "ckpt-x", None, routing, rounds=1)
        assert found.decision == "rollback"
        assert "undecided after 48.0 h (loop.canary_max_s)" in found.reason
        # A person reviewing it is not rushed by the clock.
        waiting = verdict.decide(store, s, "ckpt-x", None, routing, rounds=1, capped=False)
        assert waiting.decision == "wait"
    finally:
        store.close()


def test_the_verdict_the_loop_recorded_is_read_back_whole_and_only_for_its_routing(tmp_path):
    """What the dashboard shows (`ledger.recorded`): the verdict the loop reached at its
    last look, its evidence typed as it was, and nothing for another routing of the same
    checkpoint."""
    s = settings(tmp_path / "onjob.duckdb", "partial", gate=EXACT)
    store = Store(s.collector.db)
    try:
        started = datetime.now(UTC) - timedelta(days=2)
        routing = _canary_since(started)
        assert ledger.recorded(store, "agent", routing) is None  # not looked at yet
        found = verdict.decide(store, s, "ckpt-x", None, routing, rounds=1)
        ledger.record(store, "agent", "ckpt-x", "canary", found)
        seen = ledger.recorded(store, "agent", routing)
        assert seen is not None and seen.verdict == found  # through JSON and back, typed
        assert seen.verdict.evidence.guards.live.conversations == 0
        assert seen.verdict.evidence.routing.since == started.isoformat()
        again = msgspec.structs.replace(routing, ts=started + timedelta(hours=1))
        assert ledger.recorded(store, "agent", again) is None  # a verdict on another routing
        # An offline verdict is not a canary's.
        ledger.record(store, "agent", "ckpt-x", "offline", found)
        assert ledger.recorded(store, "agent", routing) is None
    finally:
        store.close()


def test_a_test_draws_a_sample_of_the_traffic_not_its_newest_conversations(tmp_path):
    store = Store(tmp_path / "onjob.duckdb")
    try:
        for i in range(40):  # one conversation a minute, the oldest first
            log(store, 1, f"m{i:02d}", f"now() - INTERVAL {40 - i} MINUTE")
        # Five conversations whose first turn a canary answered and whose second live
        # did: their history holds answers live did not give, so no test draws them.
        for i in range(5):
            log(store, 1, f"k{i}", "now() - INTERVAL 30 SECOND", arm="live")
            store.con.execute(  # the live answer becomes the second turn
                "UPDATE exchanges SET turn = 1, id = id || '-live' WHERE trajectory_id = ?",
                [f"k{i}t-0"],
            )
            log(store, 1, f"k{i}", "now() - INTERVAL 40 SECOND", arm="canary")
        since = datetime.now(UTC) - timedelta(hours=1)
        drawn = [
            {p.trajectory_id for p in prompts.fresh(store, AGENT, since, 10, tests=[t]).prompts}
            for t in ("offline:a", "offline:b", "offline:c")
        ]
        newest = {f"m{i:02d}t-0" for i in range(30, 40)}
        for chosen in drawn:
            assert len(chosen) == 10 and not any(c.startswith("k") for c in chosen)
            assert chosen != newest  # drawn at random, not the last ten logged
        # Over a few tests, the whole hour is drawn from: its first half as well.
        assert any(int(c[1:3]) < 20 for chosen in drawn for c in chosen)
        held = prompts.held_out(store, AGENT, ["scn"], 100, tests=["holdout:a"])
        assert len(held) == 40 and not any(p.trajectory_id.startswith("k") for p in held)
    finally:
        store.close()


def test_a_test_draws_each_conversation_once_from_any_turn(tmp_path):
    store = Store(tmp_path / "onjob.duckdb")
    try:
        log(store, 30, "c", "now()", turns=3)
        since = datetime.now(UTC) - timedelta(minutes=1)
        chosen = prompts.fresh(store, AGENT, since, 100, tests=["offline:x"]).prompts
        # Each conversation once, with its three turns (one pair, their mean).
        assert len({p.trajectory_id for p in chosen}) == 30 and len(chosen) == 90
        # The turn a draw took first is any turn, tool calls and earlier turns included,
        # not only each conversation's last.
        assert {chosen[i].turn for i in range(0, 90, 3)} == {0, 1, 2}
        # The same test draws the same turns again (a resumed test repeats nothing).
        again = prompts.fresh(store, AGENT, since, 100, tests=["offline:x"]).prompts
        assert {p.id for p in again} == {p.id for p in chosen}
    finally:
        store.close()
