"""A stateless Responses tool loop re-sends its whole history each turn; however the client
re-serialises the output items it got (the SDK's objects, `model_dump` with or without
nulls, hand-written dicts without ids or `status`), its turns are one trajectory (issue 34
item 6): the stitcher compares the chat messages the items become, and those keep only
what a message is (`responses._items`, `collector.trajectories.canonical`)."""

from __future__ import annotations

import json

import msgspec
from openai import OpenAI
from openai.types.responses import EasyInputMessage, Response

from onjob.cli.process import ServerProcess
from onjob.collector.trajectories import continuations, keys
from onjob.protocol.responses import ResponseRequest
from onjob.proxy import responses

from .conftest import TOOL_QUESTION, TOOLS, rows

FLAT_TOOL = {"type": "function", **TOOLS[0]["function"]}


def as_objects(output: list) -> list:
    return list(output)  # `input += r.output`: the SDK's own objects


def dumped(output: list) -> list:
    return [item.model_dump(exclude_none=True) for item in output]


def dumped_with_nulls(output: list) -> list:
    return [item.model_dump() for item in output]


def bare(output: list) -> list:
    """Dicts a client writes by hand: no ids, no status, no empty lists."""
    out = []
    for item in output:
        d = item.model_dump(exclude_none=True)
        d.pop("id", None)
        d.pop("status", None)
        if d.get("type") == "message":
            d["content"] = [{"type": "output_text", "text": p["text"]} for p in d["content"]]
        out.append(d)
    return out


def sent(item):
    """An item as the SDK puts it in the request body (`openai._utils._transform`: its own
    objects as `model_dump(exclude_unset=True, mode="json")`)."""
    if isinstance(item, dict):
        return item
    return item.model_dump(
        exclude_unset=True, mode="json", exclude=getattr(item, "__api_exclude__", None)
    )


SHAPES = {"objects": as_objects, "dumped": dumped, "nulls": dumped_with_nulls, "bare": bare}


def user(shape: str, text: str) -> dict:
    if shape == "nulls":  # the SDK's input type dumped whole: `"type": null` and the rest
        return EasyInputMessage(role="user", content=text).model_dump()
    return {"role": "user", "content": text}


def tool_output(shape: str, call_id: str) -> dict:
    item = {"type": "function_call_output", "call_id": call_id, "output": '{"celsius": 21}'}
    if shape == "nulls":
        item.update(id=None, status=None)
    return item


def test_each_client_shape_of_a_resent_history_continues_the_answer_it_got():
    # Turn 1's answer (text and two calls), as the proxy answers it and the SDK reads it;
    # turn 2 re-sends it in each shape: its keys hold the continuation turn 1 left.
    reply = {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": f"call_{city}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
            for city in ("Paris", "Rome")
        ],
    }
    for shape, again in SHAPES.items():
        first = [user(shape, "Weather?")]
        chat, call = responses.translate(
            ResponseRequest(model="m", input=first, instructions="Be brief."), None
        )
        left = continuations(keys(msgspec.to_builtins(chat.messages)).prefix_hash, [reply])[0]
        output = responses.output_items(reply, "x")
        built = responses.response_object(
            call, "resp_x", "agent", status="completed", output=output
        )
        got = Response.model_validate(msgspec.to_builtins(built))
        history = [*first, *(sent(item) for item in again(got.output))]
        history += [tool_output(shape, c["id"]) for c in reply["tool_calls"]]
        chat, _ = responses.translate(
            ResponseRequest(model="m", input=history, instructions="Be brief."), None
        )
        assert keys(msgspec.to_builtins(chat.messages)).candidates[0] == left, shape


def test_a_stateless_tool_loop_is_one_trajectory_in_every_client_shape(tmp_path, tool_engine):
    # One API key per shape: trajectories never span keys, so the shapes' conversations
    # (the same words) cannot stitch into each other; half of them with `store: false`.
    db = tmp_path / "onjob.duckdb"
    keys_ = {shape: f"sk-{shape}" for shape in SHAPES}
    env = {"ONJOB_PROXY__API_KEYS": json.dumps(keys_)}
    made: dict[str, list[str]] = {}
    with ServerProcess(["--engine-url", tool_engine.url, "--db", str(db)], env=env) as server:
        for n, (shape, again) in enumerate(SHAPES.items()):
            client = OpenAI(base_url=server.url, api_key=keys_[shape], max_retries=0, timeout=120)
            ask = {
                "model": "toolbot",
                "tools": [FLAT_TOOL],
                "temperature": 0,
                "max_output_tokens": 24,
                "store": n % 2 == 0,
            }
            history: list = [user(shape, m["content"]) for m in TOOL_QUESTION]
            ids = []
            for turn in range(3):
                r = client.responses.create(input=history, **ask)
                ids.append(r.id)
                history += again(r.output)
                calls = [item for item in r.output if item.type == "function_call"]
                if turn == 0:
                    assert calls, "the taught model calls get_weather on its question"
                history += [tool_output(shape, c.call_id) for c in calls]
                if not calls:
                    history.append(user(shape, f"And tomorrow ({turn})?"))
            made[shape] = ids

    logged = {r["id"]: r for r in rows(db, "SELECT id, trajectory_id, turn FROM exchanges")}
    for shape, ids in made.items():
        placed = [(logged[i]["trajectory_id"], logged[i]["turn"]) for i in ids]
        assert len({t for t, _ in placed}) == 1, (shape, placed)
        assert [turn for _, turn in placed] == [0, 1, 2], (shape, placed)
