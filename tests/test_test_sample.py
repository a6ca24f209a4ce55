"""What a candidate's test is tested on (`deploy/decide/prompts.py`): a sample of the traffic it
would serve. Turns, not conversations, are sampled; each draw keeps a whole day's mix of
tool-call and answer turns and hours; a prompt in the words of one the candidate trained
on is not a fresh prompt. Real DuckDB files; the rows as the proxy logs them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from onjob.collector import Store
from onjob.deploy.decide import prompts
from onjob.proxy.tenants import Lineage

from .conftest import record_trained

AGENT = Lineage("agent")


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "onjob.duckdb")
    yield store
    store.close()


CALL = {"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "c1"}]}}]}
ANSWER = {"choices": [{"message": {"role": "assistant", "content": "done"}}]}
CALL_MESSAGE = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "track", "arguments": "{}"}}]}  # fmt: skip


def log(store, conversation: str, *, turns: int = 1, at: datetime,
        called: bool | list[bool] = False, arm: str = "live",
        says: str = "What is 2+2?") -> None:  # fmt: skip
    """One conversation of `turns` answered production turns, logged at `at` on `arm`; live's
    answers call a tool when `called` (per turn, when a list)."""
    calls = called if isinstance(called, list) else [called] * turns
    for turn, called in zip(range(turns), calls, strict=True):
        store.con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, model_alias, arm, "
            "stream, request, response, status, latency_ms, source) "
            "VALUES (?, ?, ?, ?, 'scn', 'agent', ?, false, ?, ?, 200, 50, 'production')",
            [f"{conversation}-{turn}", at, conversation, turn, arm,
             json.dumps({"model": "agent", "messages": [{"role": "user", "content": says}]}),
             json.dumps(CALL if called else ANSWER)],
        )  # fmt: skip


def trained(store, conversations: list[str], adapter, model) -> None:
    """`cand`, a candidate trained on a turn group of each conversation's first turn."""
    for c in conversations:
        store.con.execute(
            "INSERT INTO groups (id, scenario_id, prefix_exchange, kind, status, created) "
            "VALUES (?, 'scn', ?, 'turn', 'scored', now())",
            [f"g-{c}", f"{c}-0"],
        )
        store.con.execute(
            "INSERT INTO members VALUES (?, ?, 0, ?, 0, ?, 'logged')",
            [f"m-{c}", f"g-{c}", f"{c}-0", c],
        )
    record_trained(store, "cand", adapter, model, groups=[f"g-{c}" for c in conversations])


def words(i: int) -> str:
    """A request's own words (numbers would not tell two requests apart: `OPENER`)."""
    return f"{chr(97 + i % 26)}{chr(97 + i // 26)}"


def test_a_long_conversation_is_drawn_as_often_as_the_turns_it_served(store):
    now = datetime.now(UTC)
    for i in range(40):
        log(store, f"short{i}", at=now - timedelta(minutes=5))
        log(store, f"long{i}", turns=8, at=now - timedelta(minutes=5))
    since = now - timedelta(hours=1)
    drawn = [
        p["trajectory_id"]
        for t in ("offline:a", "offline:b", "offline:c", "offline:d")
        for p in prompts.fresh(store, AGENT, since, 10, tests=[t]).prompts
    ]
    assert len(drawn) == 40 and all(len(set(drawn[i : i + 10])) == 10 for i in (0, 10))
    # The long ones served 8 turns in 9: about 36 of the 40 draws (20 if conversations
    # were drawn alike).
    assert sum(c.startswith("long") for c in drawn) >= 30


def test_a_draw_keeps_the_days_mix_of_turns_whatever_is_left_to_draw_from(
    store, tiny_adapter_dir, tiny_model_dir
):
    now = datetime.now(UTC)
    # A day of live traffic, half tool-call turns. Training took most of the tool-call
    # turns (the judge keeps a quota of them): the untrained turns left to draw from
    # are 60 answers and 6 tool calls.
    for i in range(60):
        log(store, f"a{i}", at=now - timedelta(minutes=10), says=f"answer {words(i)}?")
    for i in range(60):
        log(store, f"t{i}", at=now - timedelta(minutes=10), called=True,
            says=f"tool {words(i)}?")  # fmt: skip
    trained(store, [f"t{i}" for i in range(6, 60)], tiny_adapter_dir, tiny_model_dir)
    since = prompts.window_start(store, "cand")
    draw = prompts.fresh(store, AGENT, since, 40, chain=[None, "cand"], tests=["offline:x"])
    kinds = [p["trajectory_id"][0] for p in draw.prompts]
    # Each draw is a tool-call turn half the time (as the day served them), so the 6
    # are drawn among the first dozen or so, and the round stops when a draw asks for
    # a seventh: the test waits rather than go on on answers alone.
    assert kinds.count("t") == 6 and len(kinds) < 40
    assert draw.short == prompts.Stratum(called=True, part=draw.short.part)
    assert "tool-call turns" in str(draw.short)
    # The same test's next round asks again and stops at once: nothing new to draw.
    again = prompts.fresh(store, AGENT, since, 40, chain=[None, "cand"], tests=["offline:x"])
    assert {p["id"] for p in again.prompts} == {p["id"] for p in draw.prompts}


def test_a_conversation_of_both_kinds_of_turn_is_drawn_by_either(store):
    now = datetime.now(UTC)
    # Every conversation calls a tool, then answers: the day's mix is half and half, and
    # every conversation can stand for either kind. Drawing one takes both out.
    for i in range(20):
        log(store, f"c{i}", turns=2, called=[True, False], at=now - timedelta(minutes=5),
            says=f"track {words(i)}")  # fmt: skip
    draw = prompts.fresh(store, AGENT, now - timedelta(hours=1), 20, tests=["offline:z"])
    assert draw.short is None
    assert sorted(p["trajectory_id"] for p in draw.prompts) == sorted(f"c{i}" for i in range(20))
    turns = [p["turn"] for p in draw.prompts]
    assert 4 <= turns.count(0) <= 16  # either turn, about as often


def test_a_draw_reaches_every_hour_of_the_day_in_proportion(store):
    now = datetime.now(UTC)
    # 40 conversations in the last hour, 40 spread over the day's other three quarters.
    for i in range(40):
        log(store, f"n{i}", at=now - timedelta(minutes=30))
        log(store, f"d{i}", at=now - timedelta(hours=7 + (i % 3) * 6))
    draw = prompts.fresh(store, AGENT, now - timedelta(days=1), 40, tests=["offline:y"])
    earlier = sum(p["trajectory_id"].startswith("d") for p in draw.prompts)
    assert draw.short is None and len(draw.prompts) == 40
    assert 10 <= earlier <= 30  # about half, as served; not the newest hour alone


def test_a_prompt_in_the_words_of_a_trained_one_is_not_a_fresh_prompt(
    store, tiny_adapter_dir, tiny_model_dir
):
    now = datetime.now(UTC)
    # Every conversation of two turns: one stratum, so a draw takes all it may use.
    log(store, "trained", turns=2, at=now - timedelta(minutes=5), says="Order #1234 is late. Why?")
    log(store, "number", turns=2, at=now - timedelta(minutes=5), says="Order #98 is late. Why?")
    trained(store, ["trained"], tiny_adapter_dir, tiny_model_dir)
    # The same request in other spacing, case and punctuation.
    log(store, "alike", turns=2, at=now - timedelta(minutes=5), says="order 1234  is LATE why")
    log(store, "other", turns=2, at=now - timedelta(minutes=5), says="Where is my refund?")
    # An agent whose conversations all open alike, then get their own tool results:
    # its first turn is the trained one's, its second is not.
    opening = {"role": "user", "content": "Order #1234 is late. Why?"}
    result = {"role": "tool", "tool_call_id": "c1", "content": "courier lost parcel 77"}
    log(store, "ticket", turns=2, at=now - timedelta(minutes=5))
    for turn, messages in enumerate(([opening], [opening, CALL_MESSAGE, result])):
        store.con.execute(
            "UPDATE exchanges SET request = ? WHERE id = ?",
            [json.dumps({"model": "agent", "messages": messages}), f"ticket-{turn}"],
        )
    since = prompts.window_start(store, "cand", now)
    assert since == now - prompts.PROFILE
    chosen = prompts.fresh(store, AGENT, since, 10, chain=[None, "cand"]).prompts
    assert {p["trajectory_id"] for p in chosen} == {"other", "ticket", "number"}
    assert next(p["turn"] for p in chosen if p["trajectory_id"] == "ticket") == 1
    # Without the candidate's chain nothing is trained, so nothing is alike.
    every = prompts.fresh(store, AGENT, since, 10).prompts
    assert {p["trajectory_id"] for p in every} == {
        "trained",
        "alike",
        "other",
        "ticket",
        "number",
    }
    # An adapter added by hand has no record of what it saw: no window of its own.
    assert prompts.window_start(store, "hand-made") is None
