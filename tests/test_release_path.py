"""The release path's bookkeeping (issue 33): every pair counts, `ab` pairs are judged by
the referee alone, the held-out slice is fixed at first sight and keeps out what a
lineage trained on, orphaned candidates are decided or retired, and what the operator
keeps loaded survives a restart. Real DuckDB files, the real paired rounds, judge pass,
loop iteration and operator; engines scripted at their HTTP boundary
(tests/test_reward_hacking's checkpoints, tests/test_adapter_control's vLLM). A restart
is new objects over the same file."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from onjob.collector import Collector, CollectorSettings, Store
from onjob.deploy.act import deployments, registry
from onjob.deploy.decide import holdout, pairs, prompts, stats
from onjob.deploy.loop import run_once
from onjob.deploy.settings import LoopSettings
from onjob.judge import JudgeSettings, run_pass, tables
from onjob.judge.settings import RewardFn
from onjob.proxy.tenants import Lineage

from .conftest import record_trained, rows
from .test_adapter_control import ALIAS, VLLM, checkpoint_path, operator_on
from .test_adapter_control import db as db
from .test_reward_hacking import HEDGING, QUESTION, engine, scripted, settings

AGENT = Lineage("agent")  # the shared lineage of a server with no tenants


def logged(db, n: int, scenario: str = "scn", prefix: str = "x") -> list[tables.LoggedTurn]:
    """`n` answered production turns of `scenario`, one per conversation."""
    store = Store(db)
    try:
        for i in range(n):
            store.con.execute(
                "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, model_alias, "
                "arm, stream, request, status, source) VALUES (?, now(), ?, 0, ?, 'agent', "
                "'live', false, ?, 200, 'production')",
                [f"{prefix}-{i}", f"{prefix}t-{i}", scenario,
                 json.dumps({"model": "agent", "messages": QUESTION})],
            )  # fmt: skip
        return store.rows(
            tables.LoggedTurn,
            f"SELECT {tables.LOGGED_TURN} FROM exchanges e WHERE e.id LIKE ? ORDER BY e.id",
            [f"{prefix}-%"],
        )
    finally:
        store.close()


def fn(name: str) -> dict[str, RewardFn]:
    return {name: RewardFn(fn=f"tests.hacking_rewards:{name}")}


async def paired(
    db, judge: JudgeSettings, prompts: list[tables.LoggedTurn], test: str, seen=None
) -> None:
    """A paired round: live (the base model) against `ckpt-hack`, which hedges. `seen`: a
    list the engine's request bodies are added to."""
    collector = Collector(CollectorSettings(db=db))
    await collector.start()
    handle = engine(HEDGING)

    def recording(request: httpx.Request) -> httpx.Response:
        if seen is not None and request.url.path.endswith("/chat/completions"):
            seen.append(json.loads(request.content))
        return handle(request)

    client = httpx.AsyncClient(transport=httpx.MockTransport(recording), base_url="http://e/v1")
    try:
        from onjob.judge import rewards

        models = {"a": ("base", None), "b": ("ckpt-hack", "ckpt-hack")}
        fns = rewards.load(judge.rewards)
        await pairs.paired_round(
            collector, client, judge, fns, prompts, models, test=test, echo=lambda _: None
        )
    finally:
        await collector.close()


def outcomes(db, test: str):
    store = Store(db)
    try:
        by_scenario, missing = pairs.ab_outcomes(store, "g.test = ?", [test])
    finally:
        store.close()
    return stats.tally([o for outs in by_scenario.values() for o in outs]), missing


# -- every pair counts ---------------------------------------------------------------


def test_both_arms_of_a_pair_sample_on_one_seed_fixed_by_the_test_and_the_prompt(tmp_path):
    # Common random numbers: where the two checkpoints agree they draw alike, so a pair's
    # difference is theirs, not the sampler's. A resumed round draws the same answers.
    db = tmp_path / "onjob.duckdb"
    prompts = logged(db, 3)
    judge = JudgeSettings(group_size=2, rewards=fn("exact"))
    runs = {}
    for test in ("t1", "t1", "t2"):
        seen: list[dict] = []
        asyncio.run(paired(db, judge, prompts, test, seen))
        by_seed: dict[int, set[str]] = {}
        for body in seen:
            by_seed.setdefault(body["seed"], set()).add(body["model"])
        assert len(by_seed) == 3  # a seed per prompt
        assert all(models == {"base", "ckpt-hack"} for models in by_seed.values())
        runs.setdefault(test, []).append(set(by_seed))
    assert runs["t1"][0] == runs["t1"][1]  # the same test and prompts: the same seeds
    assert not runs["t1"][0] & runs["t2"][0]  # another test: others


def test_a_pair_the_judge_cannot_score_is_the_candidates_loss(tmp_path):
    """The coach raises on the candidate's answer ("4 or 7"), failing every group: those
    pairs are its losses, not dropped (dropped, a candidate whose losses are the ones the
    judge fails on would look no worse than live)."""
    db = tmp_path / "onjob.duckdb"
    prompts = logged(db, 6)
    judge = JudgeSettings(group_size=1, attempts=1, rewards=fn("fragile"))
    asyncio.run(paired(db, judge, prompts, "t1"))
    tally, missing = outcomes(db, "t1")
    assert (tally.pairs, tally.losses, tally.wins) == (6, 6, 0)
    assert pairs.unjudged(missing) == 6
    assert {(m.why, m.counted) for m in missing} == {("unjudged", "loss")}
    assert "cannot grade" in missing[0].reason


def test_ab_pairs_are_never_scored_by_the_coach_and_the_referee_retries_them(tmp_path):
    """Pairs left unscored (no scorer ready: the referee's budget spent, the loop paused)
    stay out of the judge pass, which would score them with the coach's settings; they
    count as losses meanwhile, and the referee's retry judges them."""
    db = tmp_path / "onjob.duckdb"
    prompts = logged(db, 4)
    asyncio.run(paired(db, JudgeSettings(group_size=1), prompts, "t2"))  # nobody scores
    tally, missing = outcomes(db, "t2")
    assert (tally.pairs, tally.losses) == (4, 4)
    assert {m.reason for m in missing} == {"not scored yet"}
    store = Store(db)
    try:
        assert tables.groups_to_score(store, 100) == []
    finally:
        store.close()

    coach = JudgeSettings(group_size=1, max_groups=0, scenario_groups=False, rewards=fn("partial"))
    referee = JudgeSettings(group_size=1, rewards=fn("exact"))

    async def judge_then_retry():
        collector = Collector(CollectorSettings(db=db))
        await collector.start()
        client = httpx.AsyncClient(
            transport=httpx.MockTransport(engine(HEDGING)), base_url="http://e/v1"
        )
        try:
            await run_pass(collector, client, coach, echo=lambda _: None)
            left = await collector.query(
                lambda st: st.dicts("SELECT count(*) AS n FROM groups WHERE status = 'sampled'")
            )
            from onjob.judge import rewards

            tried = await pairs.rejudge(
                collector, referee, rewards.load(referee.rewards), ["t2"], attempts=3
            )
            return left[0]["n"], tried
        finally:
            await collector.close()

    left, tried = asyncio.run(judge_then_retry())
    assert (left, tried) == (4, 4)  # the coach's pass left all four to the referee
    sources = {r["source"] for r in rows(db, "SELECT DISTINCT source FROM scores")}
    assert sources == {"fn:exact", "combined"}
    tally, missing = outcomes(db, "t2")
    assert missing == [] and tally.pairs == 4


def test_a_pair_the_referee_fails_on_is_judged_again_before_it_counts(tmp_path):
    """A referee that fails now and then (here: the first call on each answer) costs the
    candidate nothing: its pairs wait, are judged again at the next rounds, and count as
    judged (d = -0.5 under `partial`: live says "4"), not as losses (-1). One that never
    scores them (the fragile coach on "4 or 7") has them counted as losses once its
    attempts are spent, and says so."""
    db = tmp_path / "onjob.duckdb"
    loop = LoopSettings()  # rejudge_attempts = 3
    for name, test in (("flaky", "t-flaky"), ("fragile", "t-fragile")):
        referee = JudgeSettings(group_size=1, attempts=1, rewards=fn(name))
        asyncio.run(paired(db, referee, logged(db, 6, prefix=name), test))

        def weigh(test=test):
            store = Store(db)
            try:
                weighed = pairs.weigh(store, "agent", "ckpt-hack", [test], loop)
                return weighed.paired, weighed.decide()[1]
            finally:
                store.close()

        before, _ = weigh()
        assert (before.pairs, before.pending, before.unjudged) == (0, 6, 0), name
        tried = [rejudged(db, referee, test, loop.rejudge_attempts) for _ in range(3)]
        after, why = weigh()
        if name == "flaky":
            assert tried == [6, 6, 0]  # a's answer tried, then b's, then scored
            assert (after.pairs, after.unjudged, after.pending) == (6, 0, 0)
            assert after.tally.losses == 6 and after.mean == -0.5  # each -0.5, none -1
        else:
            assert tried == [6, 6, 0]  # three attempts in all, then no more
            assert (after.pairs, after.unjudged, after.pending) == (6, 6, 0)
            assert "6 unjudged, counted as losses" in why


def rejudged(db, referee: JudgeSettings, test: str, attempts: int) -> int:
    async def go():
        collector = Collector(CollectorSettings(db=db))
        await collector.start()
        try:
            from onjob.judge import rewards

            return await pairs.rejudge(
                collector, referee, rewards.load(referee.rewards), [test], attempts
            )
        finally:
            await collector.close()

    return asyncio.run(go())


# -- the held-out slice ----------------------------------------------------------------


def scenario_ids(below: bool, n: int, cut: float = 0.5) -> list[str]:
    found, i = [], 0
    while len(found) < n:
        name = f"scn-{i}"
        if (holdout.share(name) < cut) == below:
            found.append(name)
        i += 1
    return found


def see(store, scenario: str) -> None:
    store.con.execute(
        "INSERT INTO scenarios (id, key, keyed, first_seen, count) VALUES (?, ?, ?, now(), 1)",
        [scenario, scenario, scenario],
    )


def test_the_held_out_slice_is_decided_when_a_scenario_is_first_seen(tmp_path):
    first, second = scenario_ids(True, 2)
    [other] = scenario_ids(False, 1)
    store = Store(tmp_path / "onjob.duckdb")
    try:
        see(store, first)  # alone: trained on, though its hash falls in the slice
        assert holdout.held_out(store, 0.5) == []
        see(store, second)
        see(store, other)
        # `first` was trained on: it never becomes held out; `second` is held out.
        assert holdout.held_out(store, 0.5) == [second]
        # Decisions stand whatever the share is later.
        assert holdout.held_out(store, 0.0) == [second]
        assert holdout.held_out(store, 0.99) == [second]
    finally:
        store.close()


def test_held_out_prompts_leave_out_conversations_the_lineage_trained_on(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    db = tmp_path / "onjob.duckdb"
    logged_turns = logged(db, 4, scenario="scn-held", prefix="h")
    store = Store(db)
    try:
        # The candidate's parent trained on a group with a member in conversation ht-0,
        # which asked something else (one asking the same would be left out by content).
        store.con.execute(
            "UPDATE exchanges SET request = ? WHERE id = 'h-0'",
            [json.dumps({"model": "agent", "messages": [{"role": "user", "content": "Hi"}]})],
        )
        store.con.execute(
            "INSERT INTO groups (id, scenario_id, prefix_exchange, kind, status, created) "
            "VALUES ('g-old', 'scn-held', 'h-0', 'turn', 'scored', now())"
        )
        store.con.execute(
            "INSERT INTO members VALUES ('m-old', 'g-old', 0, 'h-0', 0, 'ht-0', 'logged')"
        )
        record_trained(store, "parent", tiny_adapter_dir, tiny_model_dir, groups=["g-old"])
        registry.add(store, tiny_adapter_dir, "cand", tiny_model_dir)
        store.con.execute("UPDATE checkpoints SET parent = 'parent' WHERE name = 'cand'")
        chosen = prompts.held_out(store, AGENT, ["scn-held"], 10, chain=[None, "cand"])
        assert {p.trajectory_id for p in chosen} == {"ht-1", "ht-2", "ht-3"}
        every = prompts.held_out(store, AGENT, ["scn-held"], 10)
        assert len(every) == len(logged_turns)
    finally:
        store.close()


# -- orphaned candidates ---------------------------------------------------------------


def orphan(store, name: str, parent: str | None, adapter, base, started_by: str = "loop"):
    """A candidate recorded by a training run and never decided (the loop stopped between
    `record_run` and `set_canary`)."""
    config = {"started_by": started_by}
    record_trained(store, name, adapter, base, config=config, parent=parent)


def iterate(s) -> tuple[dict | None, str]:
    """One loop iteration in a new process's objects over `s`'s database."""

    async def run():
        async with scripted(s, "4") as (collector, client, op):
            await op.restore()
            lines: list[str] = []
            await run_once(collector, client, op, s, lines.append)
            return (await collector.query(deployments.current)).get("agent"), "\n".join(lines)

    return asyncio.run(run())


def test_an_orphaned_candidate_is_decided_at_the_next_loop_start(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    s = settings(tmp_path / "onjob.duckdb", "exact")
    store = Store(s.collector.db)
    orphan(store, "ckpt-old", None, tiny_adapter_dir, tiny_model_dir)
    orphan(store, "ckpt-new", None, tiny_adapter_dir, tiny_model_dir)
    orphan(store, "ckpt-mine", None, tiny_adapter_dir, tiny_model_dir, started_by="onjob train")
    registry.add(store, tiny_adapter_dir, "imported", tiny_model_dir)
    store.close()
    routing, said = iterate(s)
    assert routing.canary == "ckpt-new", said  # the newest goes on to its canary
    assert "orphaned candidate ckpt-new: recorded but never decided" in said
    assert "offline test of ckpt-new" in said
    # Progress before each round of pairs, not silence for the minutes a round takes.
    assert "offline test of ckpt-new against base: " in said and "pairs on held-out" in said
    statuses = {r["name"]: r["status"] for r in rows(s.collector.db, "SELECT * FROM checkpoints")}
    # A person's candidates (`onjob train`, `onjob checkpoints add`) are theirs to decide.
    assert statuses == {
        "ckpt-old": "retired",
        "ckpt-new": "canary",
        "ckpt-mine": "candidate",
        "imported": "candidate",
    }
    [retired] = rows(s.collector.db, "SELECT * FROM deployments WHERE reason LIKE 'orphaned%'")
    assert (
        "ckpt-old" in retired["reason"] and "a newer candidate supersedes it" in retired["reason"]
    )


def test_an_orphan_trained_from_a_live_that_changed_is_retired(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    s = settings(tmp_path / "onjob.duckdb", "exact")
    store = Store(s.collector.db)
    registry.add(store, tiny_adapter_dir, "live-now", tiny_model_dir)
    orphan(store, "ckpt-stale", None, tiny_adapter_dir, tiny_model_dir)  # trained from base
    store.close()

    async def make_live():
        async with scripted(s, "4") as (_collector, _client, op):
            await op.set_canary("agent", "live-now", 0.5, reason="by hand", actor="test")
            await op.promote("agent", reason="by hand", actor="test")

    asyncio.run(make_live())
    routing, said = iterate(s)
    assert (routing.live, routing.canary) == ("live-now", None), said
    assert "orphaned candidate ckpt-stale retired: its parent base is no longer live" in said
    [row] = rows(s.collector.db, "SELECT status FROM checkpoints WHERE name = 'ckpt-stale'")
    assert row["status"] == "retired"


# -- what the operator keeps loaded survives a restart ---------------------------------


def test_the_previous_live_adapter_is_loaded_again_after_a_restart(db):
    paths = [checkpoint_path(db, n) for n in ("ckpt-1", "ckpt-2")]
    engine = VLLM(readable=paths)

    async def promote_twice():
        op, collector = await operator_on(db, engine)
        try:
            for name in ("ckpt-1", "ckpt-2"):
                await op.set_canary(ALIAS, name, 0.5, reason="r", actor="test")
                await op.promote(ALIAS, reason="r", actor="test")
        finally:
            await collector.close()

    asyncio.run(promote_twice())
    assert set(engine.lora_requests) == {"ckpt-1", "ckpt-2"}  # ckpt-1 kept for a revert

    restarted = VLLM(readable=paths)  # the engine restarted too: it has nothing loaded

    async def restart():
        op, collector = await operator_on(db, restarted)
        await collector.close()
        return op

    op = asyncio.run(restart())
    assert set(restarted.lora_requests) == {"ckpt-1", "ckpt-2"}  # the revert is instant
    assert op._previous == {ALIAS: "ckpt-1"}


def test_a_stranded_adapter_is_unloaded_after_a_restart(db):
    engine = VLLM(readable=[checkpoint_path(db, "ckpt-1")])

    async def strand():
        op, collector = await operator_on(db, engine)
        try:
            await op.set_canary(ALIAS, "ckpt-1", 0.5, reason="r", actor="test")
            engine.runtime_updating = False
            row = await op.rollback(ALIAS, reason="lost", actor="test")
            assert "still loaded" in row.warnings[0]
        finally:
            await collector.close()

    asyncio.run(strand())
    assert rows(db, "SELECT status FROM checkpoints WHERE name = 'ckpt-1'")[0]["status"] == (
        "stranded"
    )
    assert "ckpt-1" in engine.lora_requests

    engine.runtime_updating = True  # the engine can unload again; the server restarts

    async def restart():
        op, collector = await operator_on(db, engine)
        await collector.close()
        return op

    op = asyncio.run(restart())
    assert "ckpt-1" not in engine.lora_requests and op.stranded == set()
    assert rows(db, "SELECT status FROM checkpoints WHERE name = 'ckpt-1'")[0]["status"] == (
        "retired"
    )


# -- guards that see the candidate -----------------------------------------------------


@pytest.mark.parametrize(
    ("metrics", "trips"),
    [
        ({"kl_to_base": 0.01, "kl_to_base_own": 0.9}, "0.9 nats per token"),
        # A run that learned to avoid the old sampler's mistakes reads far on its tokens
        # and near on its own answers (a tool task's candidates: 0.47 and 0.05).
        ({"kl_to_base": 0.9, "kl_to_base_own": 0.05}, None),
        # A run that read no own answers (trainer.kl_own_prompts 0): the sampler's tokens.
        ({"kl_to_base": 0.9}, "0.9 nats per token"),
    ],
)
def test_the_kl_guard_reads_the_drift_on_the_candidates_own_answers(
    tmp_path, tiny_adapter_dir, tiny_model_dir, metrics, trips
):
    """The guard reads the figure the trainer's trust region holds: k3 on the candidate's
    own answers, where it is unbiased; the sampler's tokens only for a run without them."""
    from onjob.deploy.decide import trust
    from onjob.deploy.settings import LoopSettings

    store = Store(tmp_path / "onjob.duckdb")
    try:
        record_trained(store, "drifted", tiny_adapter_dir, "b", metrics=metrics)
        guard = trust.kl_guard(store, "drifted", LoopSettings(max_kl_to_base=0.5))
    finally:
        store.close()
    assert (guard.kl_to_base, guard.kl_to_base_own) == (
        metrics["kl_to_base"], metrics.get("kl_to_base_own"))  # fmt: skip
    if trips is None:
        assert guard.tripped is None
    else:
        assert guard.tripped and trips in guard.tripped
