"""What a candidate's test is tested on (`deploy/decide/prompts.py`): a sample of the traffic
it would serve. Turns, not conversations, are sampled; each draw keeps a whole day's mix
of tool-call and answer turns and hours, and answers its conversation's turns (the drawn
one alone where conversations are plenty), which the test reads as one pair; a prompt in
the words of one the candidate trained on is not a fresh prompt. Real DuckDB files; the
rows as the proxy logs them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from onjob.collector import Store
from onjob.deploy.decide import pairs, prompts
from onjob.deploy.settings import LoopSettings
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


def conversations(draw: prompts.Draw) -> list[str]:
    """The conversations a draw took, in order (each draw takes several of one's turns)."""
    return list(dict.fromkeys(p.trajectory_id for p in draw.prompts))


def short_and_long(store, n: int) -> datetime:
    """`n` one-turn and `n` eight-turn conversations logged five minutes ago; the start of
    the window that holds them."""
    now = datetime.now(UTC)
    for i in range(n):
        log(store, f"short{i}", at=now - timedelta(minutes=5))
        log(store, f"long{i}", turns=8, at=now - timedelta(minutes=5))
    return now - timedelta(hours=1)


def test_a_long_conversation_is_drawn_as_often_as_the_turns_it_served(store):
    since = short_and_long(store, 40)
    draws = [
        prompts.fresh(store, AGENT, since, 10, tests=[t])
        for t in ("offline:a", "offline:b", "offline:c", "offline:d")
    ]
    drawn = [c for d in draws for c in conversations(d)]
    assert len(drawn) == 40 and all(len(conversations(d)) == 10 for d in draws)
    # The long ones served 8 turns in 9: about 36 of the 40 draws (20 if conversations
    # were drawn alike).
    assert sum(c.startswith("long") for c in drawn) >= 30
    # 80 conversations for 10 pairs: plenty (the engine, not the traffic, is short), so a
    # draw answers the one turn it drew, of a long conversation as of a short one.
    assert all(len(d.prompts) == 10 for d in draws)


def test_a_draw_answers_a_conversations_turns_while_conversations_are_few(store):
    since = short_and_long(store, 5)
    # 10 conversations for 4 pairs: fewer than `PLENTY` a pair, so each draw gives its
    # conversation's evidence, TURNS_PER_DRAW turns of a long one, its one of a short one.
    draw = prompts.fresh(store, AGENT, since, 4, tests=["offline:a"])
    assert len(conversations(draw)) == 4
    for c in conversations(draw):
        turns = [p.turn for p in draw.prompts if p.trajectory_id == c]
        assert len(set(turns)) == (prompts.TURNS_PER_DRAW if c.startswith("long") else 1)
    # 10 for 3 pairs: plenty, one turn each.
    draw = prompts.fresh(store, AGENT, since, 3, tests=["offline:b"])
    assert len(draw.prompts) == len(conversations(draw)) == 3


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
    kinds = [p.trajectory_id[0] for p in draw.prompts]
    # Each draw is a tool-call turn half the time (as the day served them), so the 6
    # are drawn among the first dozen or so, and the round stops when a draw asks for
    # a seventh: the test waits rather than go on on answers alone.
    assert kinds.count("t") == 6 and len(kinds) < 40
    assert draw.short == prompts.Stratum(called=True, part=draw.short.part)
    assert "tool-call turns" in str(draw.short)
    # The same test's next round asks again and stops at once: nothing new to draw.
    again = prompts.fresh(store, AGENT, since, 40, chain=[None, "cand"], tests=["offline:x"])
    assert {p.id for p in again.prompts} == {p.id for p in draw.prompts}


def test_a_conversation_of_both_kinds_of_turn_is_drawn_by_either(store):
    now = datetime.now(UTC)
    # Every conversation calls a tool, then answers: the day's mix is half and half, and
    # every conversation can stand for either kind. Drawing one takes both out.
    for i in range(20):
        log(store, f"c{i}", turns=2, called=[True, False], at=now - timedelta(minutes=5),
            says=f"track {words(i)}")  # fmt: skip
    draw = prompts.fresh(store, AGENT, now - timedelta(hours=1), 20, tests=["offline:z"])
    assert draw.short is None
    assert sorted(conversations(draw)) == sorted(f"c{i}" for i in range(20))
    # Each draw answers both turns, the one it drew first: either turn, about as often.
    assert len(draw.prompts) == 40
    firsts = [draw.prompts[i].turn for i in range(0, 40, 2)]
    assert 4 <= firsts.count(0) <= 16


def test_a_draw_reaches_every_hour_of_the_day_in_proportion(store):
    now = datetime.now(UTC)
    # 40 conversations in the last hour, 40 spread over the day's other three quarters.
    for i in range(40):
        log(store, f"n{i}", at=now - timedelta(minutes=30))
        log(store, f"d{i}", at=now - timedelta(hours=7 + (i % 3) * 6))
    draw = prompts.fresh(store, AGENT, now - timedelta(days=1), 40, tests=["offline:y"])
    earlier = sum(p.trajectory_id.startswith("d") for p in draw.prompts)
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
    assert {p.trajectory_id for p in chosen} == {"other", "ticket", "number"}
    assert [p.turn for p in chosen if p.trajectory_id == "ticket"] == [1]
    # Without the candidate's chain nothing is trained, so nothing is alike.
    every = prompts.fresh(store, AGENT, since, 10).prompts
    assert {p.trajectory_id for p in every} == {
        "trained",
        "alike",
        "other",
        "ticket",
        "number",
    }
    # An adapter added by hand has no record of what it saw: no window of its own.
    assert prompts.window_start(store, "hand-made") is None


def scored(store, group: str, prefix: str, test: str, d: float | None) -> None:
    """An `ab` group of `test` on the turn `prefix`, as the referee leaves it: arm b's
    score minus a's is `d` (None: not judged yet)."""
    status = "sampled" if d is None else "scored"
    store.con.execute(
        "INSERT INTO groups (id, scenario_id, prefix_exchange, kind, status, created, test) "
        "VALUES (?, 'scn', ?, 'ab', ?, now(), ?)",
        [group, prefix, status, test],
    )
    if d is None:
        return
    for position, (arm, score) in enumerate((("a", max(0.0, -d)), ("b", max(0.0, d)))):
        member = f"{group}-{arm}"
        store.con.execute(
            "INSERT INTO members (id, group_id, position, exchange_id, choice, origin) "
            "VALUES (?, ?, ?, ?, 0, ?)",
            [member, group, position, f"x-{member}", arm],
        )
        store.con.execute(
            "INSERT INTO scores (id, group_id, member_id, source, score) "
            "VALUES (?, ?, ?, 'combined', ?)",
            [f"s-{member}", group, member, score],
        )


def test_the_turns_a_draw_answers_of_one_conversation_are_one_pair_their_mean(store):
    now = datetime.now(UTC)
    # A tool agent: each conversation finds, fetches, then answers. Four conversations,
    # fewer than `PLENTY` for each pair drawn: each draw answers its conversation's turns.
    for i in range(4):
        log(store, f"c{i}", turns=3, called=[True, True, False],
            at=now - timedelta(minutes=5), says=f"weather {words(i)}")  # fmt: skip
    test = pairs.offline_test_id("cand", None)
    draw = prompts.fresh(store, AGENT, now - timedelta(hours=1), 2, tests=[test])
    assert len(conversations(draw)) == 2 and len(draw.prompts) == 6
    # Pairs as they were made: the first conversation's turns +1, 0, 0; the second's
    # -1, -1, +1. Two pairs, +1/3 and -1/3, not six of which four tie.
    diffs = {conversations(draw)[0]: [1.0, 0.0, 0.0], conversations(draw)[1]: [-1.0, -1.0, 1.0]}
    for i, p in enumerate(draw.prompts):
        scored(store, f"g-{i:02d}", p.id, test, diffs[p.trajectory_id].pop(0))
    weighed = pairs.weigh(store, "agent", "cand", [test], LoopSettings())
    tally = weighed.paired.tally
    assert (weighed.paired.pairs, tally.wins, tally.ties, tally.losses) == (2, 1, 0, 1)
    assert weighed.paired.mean == pytest.approx(0.0)
    # The next draw takes other conversations; a turn not judged yet holds its whole pair
    # (and every pair after it) back.
    again = prompts.fresh(store, AGENT, now - timedelta(hours=1), 1, tests=[test])
    assert not set(conversations(again)) & set(conversations(draw))
    for i, p in enumerate(again.prompts):
        scored(store, f"g-{6 + i:02d}", p.id, test, 1.0 if i else None)
    weighed = pairs.weigh(store, "agent", "cand", [test], LoopSettings())
    assert weighed.paired.pairs == 2 and weighed.paired.pending == 3
