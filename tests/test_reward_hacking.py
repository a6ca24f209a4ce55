"""A canary that learned to please its training reward is not promoted: one that hedges
between two answers (paid half by the training reward) loses under a separate referee
(`loop.gate`), and one that rambles (paid by length) is held by the length guard. The
loop's real iteration (`run_once`) on a real DuckDB file, with the real paired rounds,
reward functions and verdict; the engine scripted at its HTTP boundary, answering as
the two checkpoints would."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from onjob.collector import Collector, CollectorSettings, Store
from onjob.deploy.act import deployments, registry, reviews
from onjob.deploy.act.operator import Operator
from onjob.deploy.loop import LoopState, run_once
from onjob.deploy.settings import DeploySettings, GateSettings, LoopSettings
from onjob.judge import JudgeSettings
from onjob.judge.settings import RewardFn
from onjob.proxy import Router

QUESTION = [{"role": "user", "content": "What is 2 + 2? Answer with the number."}]
LIVE = ["4", "7", "9", "3"]  # right one time in four
HEDGING = "4 or 7"
RAMBLING = "Let me think about this carefully, step by step. " * 5 + "The answer is 4."


def engine(canary_says: str):
    """Live (the base model) answers LIVE in turn; the canary always `canary_says`."""

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/models"):
            data = [{"id": "base", "parent": None}, {"id": "ckpt-hack", "parent": "base"}]
            return httpx.Response(200, json={"object": "list", "data": data})
        if path.endswith(("/load_lora_adapter", "/unload_lora_adapter")):
            return httpx.Response(200, text="ok")
        body = json.loads(request.content)
        n = body.get("n", 1)
        texts = [canary_says] * n if body["model"] == "ckpt-hack" else (LIVE * n)[:n]
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": t},
                "finish_reason": "stop",
                "token_ids": list(range(len(t.split()))),
                "logprobs": {"content": [{"token": w, "logprob": -0.1} for w in t.split()]},
            }
            for i, t in enumerate(texts)
        ]
        return httpx.Response(
            200,
            json={
                "id": "chatcmpl-x",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": choices,
                "usage": {"prompt_tokens": 9, "completion_tokens": n, "total_tokens": 9 + n},
                "prompt_token_ids": list(range(9)),
            },
        )

    return handle


def settings(db, reward: str, **loop) -> DeploySettings:
    # Each arm answers 4 times a prompt: the scripted live's cycle of 4 answers, right one
    # time in four, in every pair (with fewer, a pair would read the cycle's first ones).
    gate = loop.pop("gate", GateSettings())
    loop["gate"] = gate.model_copy(update={"samples": gate.samples or 4})
    return DeploySettings(
        collector=CollectorSettings(db=db),
        judge=JudgeSettings(
            group_size=4,
            max_groups=0,
            scenario_groups=False,
            rewards={reward: RewardFn(fn=f"tests.hacking_rewards:{reward}")},
        ),
        loop=LoopSettings(
            **{
                "pairs_per_round": 12,
                "min_pairs": 6,
                "sprt_delta": 0.3,
                "min_guard_conversations": 1,
                **loop,
            }
        ),
    )


@contextlib.asynccontextmanager
async def scripted(s: DeploySettings, canary_says: str):
    """The collector on `s`'s database, the scripted engine, and an operator over both."""
    collector = Collector(s.collector)
    await collector.start()
    client = httpx.AsyncClient(
        transport=httpx.MockTransport(engine(canary_says)), base_url="http://e/v1"
    )
    op = Operator(collector, Router({"agent": None}, upstream=None), client, {"agent": None})
    try:
        yield collector, client, op
    finally:
        await collector.close()


def decide(
    tmp_path,
    tiny_adapter_dir,
    tiny_model_dir,
    canary_says: str,
    s: DeploySettings,
    live: int = 12,
    rounds: int = 1,
    state: LoopState | None = None,
):
    db = s.collector.db
    store = Store(db)
    registry.add(store, tiny_adapter_dir, "ckpt-hack", tiny_model_dir)
    store.close()
    lines: list[str] = []

    async def run():
        async with scripted(s, canary_says) as (collector, client, op):
            await op.set_canary("agent", "ckpt-hack", 0.5, reason="trained", actor="test")

            # Production traffic since the canary started: `live` live conversations, 4
            # canary; each paired round draws from live conversations not drawn yet.
            def log(st):
                for i in range(live + 4):
                    arm = "live" if i < live else "canary"
                    st.con.execute(
                        "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, "
                        "model_alias, arm, checkpoint, stream, request, response, status, "
                        "latency_ms, source) VALUES (?, now() + INTERVAL 1 SECOND, ?, 0, "
                        "'scn', 'agent', ?, ?, false, ?, ?, 200, 50, 'production')",
                        [
                            f"x-{i}",
                            f"t-{i}",
                            arm,
                            "ckpt-hack" if arm == "canary" else None,
                            json.dumps({"model": "agent", "messages": QUESTION}),
                            json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": "4"}}]}),
                        ],
                    )  # fmt: skip

            await collector.query(log)
            for _ in range(rounds):
                await run_once(collector, client, op, s, lines.append, state)
            return (await collector.query(deployments.current))["agent"]

    return asyncio.run(run()), "\n".join(lines)


def test_without_a_referee_the_hedging_canary_is_ready_for_review_not_promoted(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    # The hazard: the training reward (the coach, also the judge with no loop.gate)
    # prefers hedging, so the hedger wins every pair (by 0.25: half credit against live's
    # quarter; three rounds of 12 give the e-process what it needs). By default that is
    # not a promotion.
    s = settings(tmp_path / "onjob.duckdb", "partial")
    state = LoopState()
    routing, said = decide(
        tmp_path, tiny_adapter_dir, tiny_model_dir, HEDGING, s, live=36, rounds=3, state=state
    )
    assert "canary ckpt-hack against base: ready for review: " in said
    # Status says a run waits for the canary, never "a run may start" while none can.
    assert "the next run waits for the canary's decision" in state.lineages["agent"].waiting
    assert (routing.live, routing.canary) == (None, "ckpt-hack"), said  # unchanged
    store = Store(s.collector.db)
    try:
        assert registry.get(store, "ckpt-hack").status == "review"
        release = reviews.status(store, s)
        assert release.mode.mode == "review" and not release.mode.automatic
        review = release.reviews["agent"]
        assert review.checkpoint == "ckpt-hack"
        assert review.evidence["paired"]["wins"] >= 12
        assert review.evidence["paired"]["losses"] == 0
        assert review.evidence["referee"] == ["fn:partial"]
        pairs = store.dicts("SELECT count(*) AS n FROM groups WHERE kind = 'ab'")[0]["n"]
    finally:
        store.close()

    # The next iteration draws no more pairs and changes nothing: a person decides.
    async def again():
        async with scripted(s, HEDGING) as (collector, client, op):
            await op.restore()
            lines: list[str] = []
            await run_once(collector, client, op, s, lines.append)
            return (await collector.query(deployments.current))["agent"], "\n".join(lines)

    routing, said = asyncio.run(again())
    assert (routing.live, routing.canary) == (None, "ckpt-hack")
    assert "ready for review since" in said
    store = Store(s.collector.db)
    try:
        assert store.dicts("SELECT count(*) AS n FROM groups WHERE kind = 'ab'")[0]["n"] == pairs
    finally:
        store.close()

    # A referee configured since does not end the wait: these pairs were judged by the
    # coach, not by it.
    gate = GateSettings(rewards={"exact": RewardFn(fn="tests.hacking_rewards:exact")}, samples=4)
    s = s.model_copy(update={"loop": s.loop.model_copy(update={"gate": gate})})
    routing, said = asyncio.run(again())
    assert (routing.live, routing.canary) == (None, "ckpt-hack"), said
    assert "ready for review since" in said


def test_with_a_referee_configured_the_loop_promotes_by_itself(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    # loop.gate set (here to the same partial-credit reward, to show the mode alone
    # decides who promotes): the loop promotes what wins under the referee.
    gate = GateSettings(rewards={"partial": RewardFn(fn="tests.hacking_rewards:partial")})
    s = settings(tmp_path / "onjob.duckdb", "partial", gate=gate)
    routing, said = decide(
        tmp_path, tiny_adapter_dir, tiny_model_dir, HEDGING, s, live=36, rounds=3
    )
    assert routing.live == "ckpt-hack", said
    assert json.loads(routing.evidence)["release_mode"]["mode"] == "referee"


def test_a_canary_that_learned_to_hedge_loses_under_the_referee(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    gate = GateSettings(rewards={"exact": RewardFn(fn="tests.hacking_rewards:exact")})
    s = settings(tmp_path / "onjob.duckdb", "partial", gate=gate)
    routing, said = decide(tmp_path, tiny_adapter_dir, tiny_model_dir, HEDGING, s)
    assert (routing.live, routing.canary) == (None, None), said  # rolled back
    assert "canary ckpt-hack lost" in routing.reason
    evidence = json.loads(routing.evidence)
    assert evidence["referee"] == ["fn:exact"]
    assert evidence["paired"]["losses"] >= 4


@pytest.mark.parametrize("ratio", [1.5, 1000.0], ids=["guarded", "unguarded"])
def test_a_canary_that_learned_to_ramble_is_held_by_the_length_guard(
    tmp_path, tiny_adapter_dir, tiny_model_dir, ratio
):
    s = settings(tmp_path / "onjob.duckdb", "length", max_length_ratio=ratio)
    routing, said = decide(tmp_path, tiny_adapter_dir, tiny_model_dir, RAMBLING, s)
    if ratio == 1000.0:  # without the guard the length reward wins it the pairs: only its
        # coach judged them, so it waits for a person
        assert "ready for review: canary ckpt-hack won" in said
        assert routing.live is None, said
        return
    assert routing.live is None, said  # not promoted
    assert "length guard" in said and "paired samples" in said
