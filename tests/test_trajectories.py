"""Stitching: which trajectory, turn and scenario each request belongs to."""

from __future__ import annotations

import json
import random

from onjob.collector import Stitcher
from onjob.collector.trajectories import (
    DERIVED,
    EXPLICIT,
    Placement,
    canonical,
    chain,
    scenario_id,
)

SYSTEM = {"role": "system", "content": "You are a travel agent."}
ASK = {"role": "user", "content": "Book me a flight to Paris."}


def reply(text=None, calls=None) -> dict:
    msg = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = calls
    return msg


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "search", "arguments": json.dumps({"to": "Paris", "seats": 1})},
}


def test_requests_that_extend_the_previous_reply_continue_the_trajectory():
    s = Stitcher()
    first = s.place([SYSTEM, ASK])
    assert first.turn == 0 and first.scenario_keyed == DERIVED
    s.record_replies(first, [reply(calls=[CALL])])

    # The client re-serialises the tool call's arguments (spacing, key order): still a match.
    echoed = {**CALL, "function": {"name": "search", "arguments": '{"seats":1,  "to":"Paris"}'}}
    tool = {"role": "tool", "tool_call_id": "call_1", "content": '{"flights": 2}'}
    second = s.place([SYSTEM, ASK, reply(calls=[echoed]), tool])
    assert (second.trajectory_id, second.turn) == (first.trajectory_id, 1)
    assert second.scenario_id == first.scenario_id
    s.record_replies(second, [reply("Booked.")])

    third = s.place(
        [
            SYSTEM,
            ASK,
            reply(calls=[echoed]),
            tool,
            reply("Booked."),
            {"role": "user", "content": "Thanks"},
        ]
    )
    assert (third.trajectory_id, third.turn) == (first.trajectory_id, 2)


def test_edited_history_starts_a_new_trajectory():
    s = Stitcher()
    first = s.place([ASK])
    s.record_replies(first, [reply("Which date?")])
    edited = s.place([ASK, reply("Which date? (edited)"), {"role": "user", "content": "May 3"}])
    assert edited.trajectory_id != first.trajectory_id and edited.turn == 0


def test_continuing_an_older_turn_forks_into_a_new_trajectory():
    s = Stitcher()
    a = s.place([ASK])
    s.record_replies(a, [reply("Which date?")])
    b = s.place([ASK, reply("Which date?"), {"role": "user", "content": "May 3"}])
    s.record_replies(b, [reply("Done")])
    retry = s.place([ASK, reply("Which date?"), {"role": "user", "content": "June 9"}])
    assert b.trajectory_id == a.trajectory_id
    assert retry.trajectory_id != a.trajectory_id and retry.turn == 0


def test_a_failed_turn_is_released_so_the_retry_continues():
    s = Stitcher()
    a = s.place([ASK])
    s.record_replies(a, [reply("Which date?")])
    msgs = [ASK, reply("Which date?"), {"role": "user", "content": "May 3"}]
    failed = s.place(msgs)
    s.release(failed)
    retry = s.place(msgs)
    assert (retry.trajectory_id, retry.turn) == (a.trajectory_id, 1)


def test_any_of_n_choices_can_be_continued():
    s = Stitcher()
    a = s.place([ASK])
    s.record_replies(a, [reply("one"), reply("two")])
    b = s.place([ASK, reply("two"), {"role": "user", "content": "ok"}])
    assert (b.trajectory_id, b.turn) == (a.trajectory_id, 1)


def call(call_id: str, city: str) -> dict:
    arguments = json.dumps({"city": city})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "weather", "arguments": arguments},
    }


def result(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "sunny"}


CHECKING = reply("Checking.", [call("c1", "Rome"), call("c2", "Paris")])


def answered() -> tuple[Stitcher, Placement]:
    """A first turn answered with text and two calls."""
    s = Stitcher()
    first = s.place([ASK])
    s.record_replies(first, [CHECKING])
    return s, first


def test_some_of_a_replys_calls_handed_back_without_its_text_continue_it():
    # A Responses client hands back the `function_call` items it ran, often not the text
    # nor the other calls; a chat client's whole message is the same continuation.
    for kept in (
        [CHECKING],
        [reply(calls=[call("c1", "Rome")])],
        [reply(calls=[call("c2", "Paris")])],
        [reply(calls=[call("c1", "Rome"), call("c2", "Paris")])],
        [reply("Checking.", [call("c1", "Rome")])],
        # each call handed back with its result, one after the other
        [reply(calls=[call("c1", "Rome")]), result("c1"), reply(calls=[call("c2", "Paris")])],
    ):
        s, first = answered()
        placed = s.place([ASK, *kept, result(kept[-1]["tool_calls"][-1]["id"])])
        assert (placed.trajectory_id, placed.turn) == (first.trajectory_id, 1), kept
    # A second turn after the first went on: a fork, as in chat.
    s, first = answered()
    s.place([ASK, CHECKING, result("c1"), result("c2")])
    fork = s.place([ASK, reply(calls=[call("c2", "Paris")]), result("c2")])
    assert fork.trajectory_id != first.trajectory_id and fork.turn == 0


def test_a_call_handed_back_changed_or_after_another_history_continues_nothing():
    s, first = answered()
    for messages in (
        [ASK, reply(calls=[call("c1", "Milan")]), result("c1")],  # its arguments edited
        [ASK, reply(calls=[call("c9", "Rome")]), result("c9")],  # another call's id
        [SYSTEM, ASK, reply(calls=[call("c1", "Rome")]), result("c1")],  # another history
    ):
        placed = s.place(messages)
        assert placed.trajectory_id != first.trajectory_id and placed.turn == 0, messages


def test_explicit_trajectory_and_scenario_win():
    s = Stitcher()
    a = s.place([ASK], trajectory_id="conv-42", scenario="booking")
    assert (
        a.trajectory_id == "conv-42"
        and a.scenario_keyed == EXPLICIT
        and a.scenario_key == "booking"
    )
    b = s.place([{"role": "user", "content": "unrelated"}], trajectory_id="conv-42")
    assert (b.trajectory_id, b.turn, b.scenario_id) == ("conv-42", 1, a.scenario_id)


def test_derived_scenario_depends_on_system_prompt_and_first_user_message_only():
    s = Stitcher()
    x = s.place([SYSTEM, ASK])
    y = s.place([SYSTEM, ASK])
    z = s.place([{"role": "system", "content": "Other agent."}, ASK])
    assert x.scenario_id == y.scenario_id != z.scenario_id
    assert x.trajectory_id != y.trajectory_id


def test_warm_restores_continuations_after_a_restart():
    s = Stitcher()
    a = s.place([ASK])
    hashes = s.record_replies(a, [reply("Which date?")])
    fresh = Stitcher()
    fresh.warm([(a.trajectory_id, 0, a.scenario_id, a.scenario_key, a.scenario_keyed, hashes)])
    b = fresh.place([ASK, reply("Which date?"), {"role": "user", "content": "May 3"}])
    assert (b.trajectory_id, b.turn, b.scenario_id) == (a.trajectory_id, 1, a.scenario_id)


def test_the_index_is_bounded():
    s = Stitcher(capacity=10)
    for i in range(50):
        p = s.place([{"role": "user", "content": f"q{i}"}])
        s.record_replies(p, [reply("a")])
    assert len(s._continuations) <= 10 and len(s._trajectories) <= 10


def test_two_keys_sending_the_same_conversation_get_two_trajectories():
    s = Stitcher()
    alice = s.place([SYSTEM, ASK], api_key_id="alice")
    bob = s.place([SYSTEM, ASK], api_key_id="bob")
    s.record_replies(alice, [reply("Which date?")])
    s.record_replies(bob, [reply("Which date?")])
    more = [SYSTEM, ASK, reply("Which date?"), {"role": "user", "content": "May 3"}]
    alice2, bob2 = s.place(more, api_key_id="alice"), s.place(more, api_key_id="bob")
    assert (alice2.trajectory_id, alice2.turn) == (alice.trajectory_id, 1)
    assert (bob2.trajectory_id, bob2.turn) == (bob.trajectory_id, 1)
    assert alice.trajectory_id != bob.trajectory_id
    # The same situation is each key's own scenario, under the same key.
    assert alice.scenario_id != bob.scenario_id and alice.scenario_key == bob.scenario_key


def test_a_named_conversation_is_the_keys_own_name():
    s = Stitcher()
    a = s.place([ASK], trajectory_id="conv-1", api_key_id="alice")
    b = s.place([ASK], trajectory_id="conv-1", api_key_id="bob")
    assert (a.trajectory_id, a.turn) == ("alice:conv-1", 0)
    assert (b.trajectory_id, b.turn) == ("bob:conv-1", 0)
    # No API keys (a server for one developer): the name is the id.
    assert Stitcher().place([ASK], trajectory_id="conv-1").trajectory_id == "conv-1"


def test_a_named_scenario_is_the_keys_own():
    s = Stitcher()
    named = [s.place([ASK], scenario="booking", api_key_id=k) for k in ("alice", "bob")]
    assert named[0].scenario_id != named[1].scenario_id
    assert named[0].scenario_key == named[1].scenario_key == "booking"
    # A key's later conversations of the scenario are in its one scenario.
    again = s.place([SYSTEM, ASK], scenario="booking", api_key_id="alice")
    assert again.scenario_id == named[0].scenario_id
    # No API keys: one scenario per name, with the id it always had.
    keyless = [Stitcher().place([ASK], scenario="booking") for _ in range(2)]
    assert keyless[0].scenario_id == keyless[1].scenario_id == scenario_id("booking", EXPLICIT)


def test_warm_keeps_each_keys_continuations_its_own():
    s = Stitcher()
    a = s.place([ASK], api_key_id="alice")
    hashes = s.record_replies(a, [reply("Which date?")])
    fresh = Stitcher()
    row = (a.trajectory_id, 0, a.scenario_id, a.scenario_key, a.scenario_keyed, hashes, "alice")
    fresh.warm([row])
    more = [ASK, reply("Which date?"), {"role": "user", "content": "May 3"}]
    assert fresh.place(more, api_key_id="alice").trajectory_id == a.trajectory_id
    assert fresh.place(more, api_key_id="bob").trajectory_id != a.trajectory_id


def test_a_forgotten_conversation_is_never_continued():
    s = Stitcher()
    a = s.place([ASK], trajectory_id="conv-9")
    first = s.place([ASK])
    s.record_replies(first, [reply("Which date?")])
    s.forget([first.trajectory_id, "conv-9"])
    more = [ASK, reply("Which date?"), {"role": "user", "content": "May 3"}]
    again = s.place(more)
    assert again.trajectory_id != first.trajectory_id and again.turn == 0
    assert s.place([ASK], trajectory_id="conv-9").turn == 0 == a.turn


def test_stitching_hashes_do_not_change_whatever_the_text():
    """The chain hashes are in the database (continuation hashes, lineage): a conversation
    logged before an upgrade must stitch after it. Pinned values, and for any text the
    bytes hashed are `json.dumps`'s, whichever encoder wrote them."""
    messages = [
        {"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": [{"type": "text", "text": 'Héllo ☃ \x7f \x01 "q" \\ \n'}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"b": 1e16, "a": [0.1, "x"]}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "result \U0001f600"},
        {"role": "assistant", "content": "done\tok"},
    ]
    assert chain(messages) == [
        "2bb71a646dc5c08e3b06fa9c62a2d39d",
        "af3e7ec6d5500751eba2a11cb3672e19",
        "ddd74d5f36303b950385e312ce0238cc",
        "ad0586ae343b15d249facf118269e04e",
        "3e23d5550028383b77cbc888ee5553b2",
    ]
    rng = random.Random(1)
    alphabet = [chr(i) for i in range(160)] + ["é", "☃", "\U0001f600", "\ud800"]
    for _ in range(5000):
        message = {
            "role": rng.choice(["user", "assistant", "tool", None, 3]),
            "content": "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))),
        }
        if rng.random() < 0.3:
            message["tool_call_id"] = rng.choice(["c1", "é", None])
        reference = [message["role"], message["content"], [], message.get("tool_call_id")]
        expected = json.dumps(reference, sort_keys=True, separators=(",", ":")).encode()
        assert canonical(message) == expected, message
