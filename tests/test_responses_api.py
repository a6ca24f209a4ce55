"""The Responses API at the proxy's edge, as clients use it: a real local engine, a real
`onjob serve`, the official `openai` client (`responses.create`, `.stream`, `.retrieve`,
`.delete`, `input_items.list`) and the OpenAI Agents SDK; then the DuckDB file is read
to check what landed (chat-shaped rows, one trajectory per `previous_response_id` chain).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from onjob.cli.process import ServerProcess

from .conftest import TOOL_QUESTION, TOOLS, rows

WEATHER = TOOLS[0]["function"]
FLAT_TOOL = {"type": "function", **WEATHER}  # the Responses API's tool shape


def client_of(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def exchanges(db, api: str = "responses") -> dict[str, dict]:
    found = rows(db, "SELECT * FROM exchanges WHERE api = ? ORDER BY ts", [api])
    return {r["id"]: r for r in found}


def test_response_create_retrieve_input_items_and_delete_through_the_openai_client(
    tmp_path, engine
):
    db = tmp_path / "onjob.duckdb"
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)]) as server:
        client = client_of(server)
        made = client.responses.create(
            model="agent",
            instructions="Answer briefly.",
            input=[
                {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
                {"role": "assistant", "content": "Hi! How can I help?"},
                {"role": "user", "content": "Name a colour."},
            ],
            max_output_tokens=6,
            temperature=0.7,
            metadata={"team": "blue"},
        )
        assert made.id.startswith("resp_") and made.object == "response"
        assert made.status == "incomplete"  # the tiny model runs to max_output_tokens
        assert made.incomplete_details.reason == "max_output_tokens"
        assert made.output[0].type == "message" and made.output_text
        assert made.usage.output_tokens == 6 and made.metadata == {"team": "blue"}
        assert made.instructions == "Answer briefly." and made.temperature == 0.7

        again = client.responses.retrieve(made.id)
        assert again.model_dump() == made.model_dump()
        items = client.responses.input_items.list(made.id, order="asc")
        assert [(i.type, i.role) for i in items.data] == [
            ("message", "user"),
            ("message", "assistant"),
            ("message", "user"),
        ]
        assert items.data[2].content[0].text == "Name a colour."
        newest = client.responses.input_items.list(made.id, limit=1)  # desc by default
        assert [i.id for i in newest.data] == [items.data[2].id] and newest.has_more

        unstored = client.responses.create(
            model="agent", input="Not kept.", store=False, max_output_tokens=3
        )
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(unstored.id)

        client.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.input_items.list(made.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.delete(made.id)

    logged = exchanges(db)
    # Deleted and unstored responses stay in the log, to learn from, as chat exchanges.
    assert set(logged) == {made.id, unstored.id}
    row = logged[made.id]
    assert row["api_object"] is None and logged[unstored.id]["api_object"] is None
    request = json.loads(row["request"])
    assert request["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": "Name a colour."},
    ]
    assert request["max_tokens"] == 6 and request["temperature"] == 0.7
    assert json.loads(row["response"])["choices"][0]["message"]["content"] == made.output_text
    assert len(row["completion_token_ids"][0]) == 6 == len(row["completion_logprobs"][0])
    assert row["prompt_token_ids"]


def test_streamed_response_sends_typed_events_numbered_in_order(tmp_path, engine):
    db = tmp_path / "onjob.duckdb"
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)]) as server:
        client = client_of(server)
        with client.responses.stream(model="agent", input="Tell me", max_output_tokens=5) as s:
            events = list(s)
        stored = client.responses.retrieve(events[0].response.id)

    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # as OpenAI ends an answer cut by max_output_tokens
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text == events[-4].text
    assert final.usage.output_tokens == 5
    assert stored.model_dump() == final.model_dump()
    (row,) = exchanges(db).values()
    assert row["id"] == final.id and row["stream"]
    assert json.loads(row["response"])["choices"][0]["message"]["content"] == text


def test_previous_response_id_chain_is_one_trajectory_and_survives_kill_9(tmp_path, engine):
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", engine.url, "--db", str(db)]
    # Nothing reaches DuckDB before the kill: the stored responses come back from the spool.
    env = {"ONJOB_COLLECTOR__FLUSH_INTERVAL_S": "3600"}
    server = ServerProcess(args, env=env).start()
    try:
        client = client_of(server)
        first = client.responses.create(
            model="agent", instructions="Be terse.", input="Hello", max_output_tokens=4
        )
        second = client.responses.create(
            model="agent", previous_response_id=first.id, input="And then?", max_output_tokens=4
        )
        assert second.previous_response_id == first.id
        assert second.instructions is None  # not carried over, as OpenAI does
    finally:
        server.kill()
    with ServerProcess(args) as server:
        client = client_of(server)
        assert client.responses.retrieve(first.id).output_text == first.output_text
        third = client.responses.create(
            model="agent", previous_response_id=second.id, input="Last one.", max_output_tokens=4
        )
        # A second answer to the same turn forks a conversation of its own.
        fork = client.responses.create(
            model="agent", previous_response_id=first.id, input="Other way.", max_output_tokens=4
        )
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.create(
                model="agent", previous_response_id="resp_nope", input="x", max_output_tokens=2
            )
        assert missing.value.body["param"] == "previous_response_id"

    logged = exchanges(db)
    chain = [logged[r.id] for r in (first, second, third)]
    assert len({r["trajectory_id"] for r in chain}) == 1
    assert [r["turn"] for r in chain] == [0, 1, 2]
    assert logged[fork.id]["trajectory_id"] != chain[0]["trajectory_id"]
    messages = json.loads(chain[2]["request"])["messages"]
    # The whole conversation, replies included, without the first call's instructions.
    assert messages == [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And then?"},
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "Last one."},
    ]
    (trajectory,) = rows(db, "SELECT * FROM trajectories WHERE id = ?", [chain[0]["trajectory_id"]])
    assert trajectory["n_turns"] == 3


def test_function_tools_round_trip_streamed_and_not(tmp_path, tool_engine):
    db = tmp_path / "onjob.duckdb"
    with ServerProcess(["--engine-url", tool_engine.url, "--db", str(db)]) as server:
        client = client_of(server)
        ask = {"model": "toolbot", "tools": [FLAT_TOOL], "temperature": 0, "max_output_tokens": 40}
        called = client.responses.create(input=TOOL_QUESTION, **ask)
        (call,) = called.output
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Paris"} and called.status == "completed"

        with client.responses.stream(input=TOOL_QUESTION, **ask) as s:
            events = list(s)
            streamed = s.get_final_response()
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" in kinds
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert done.name == "get_weather" and json.loads(done.arguments) == {"city": "Paris"}
        assert kinds[-1] == "response.completed"
        assert streamed.output[0].call_id == events[-2].item.call_id

        answered = client.responses.create(
            previous_response_id=called.id,
            input=[
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": '{"celsius": 21}',
                }
            ],
            **ask,
        )
    logged = exchanges(db)
    assert logged[answered.id]["trajectory_id"] == logged[called.id]["trajectory_id"]
    messages = json.loads(logged[answered.id]["request"])["messages"]
    assert messages[-2]["tool_calls"][0]["id"] == call.call_id
    assert messages[-1] == {
        "role": "tool",
        "tool_call_id": call.call_id,
        "content": '{"celsius": 21}',
    }
    assert json.loads(logged[called.id]["request"])["tools"] == TOOLS


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"truncation": "auto"}, "truncation"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_its_param(extra, param, server_on_tiny):
    body = {"model": "agent", "input": "hi", **extra}
    resp = httpx.post(f"{server_on_tiny.url}/responses", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_an_agent_without_tools_sends_an_empty_list_and_is_answered(server_on_tiny):
    """The Agents SDK's Responses model sends `tools: []` (and `tool_choice` when set) for an
    agent with no tools; chat engines refuse an empty list (vLLM 0.33), so it goes as none."""
    for choice in ({}, {"tool_choice": "auto"}, {"tool_choice": "none"}):
        body = {"model": "agent", "input": "hi", "tools": [], "max_output_tokens": 2, **choice}
        resp = httpx.post(f"{server_on_tiny.url}/responses", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
    forced = {"model": "agent", "input": "hi", "tools": [], "tool_choice": "required"}
    resp = httpx.post(f"{server_on_tiny.url}/responses", json=forced, timeout=60)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "tool_choice"


@pytest.fixture(scope="module")
def server_on_tiny(tmp_path_factory, engine):
    db = tmp_path_factory.mktemp("refusals") / "onjob.duckdb"
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)]) as server:
        yield server


def test_agents_sdk_runs_a_function_tool_through_responses_and_chat_completions(
    tmp_path, tool_engine
):
    from agents import (
        Agent,
        FunctionTool,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        set_tracing_disabled,
    )
    from agents.exceptions import MaxTurnsExceeded

    set_tracing_disabled(True)
    asked: list[dict] = []

    async def get_weather(_ctx, arguments: str) -> str:
        asked.append(json.loads(arguments))
        return '{"celsius": 21}'

    tool = FunctionTool(
        name=WEATHER["name"],
        description=WEATHER["description"],
        params_json_schema=WEATHER["parameters"],
        on_invoke_tool=get_weather,
        strict_json_schema=False,
    )
    db = tmp_path / "onjob.duckdb"
    with ServerProcess(["--engine-url", tool_engine.url, "--db", str(db)]) as server:

        async def run_both() -> None:
            aclient = AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
            settings = ModelSettings(temperature=0, max_tokens=40)
            for model in (
                OpenAIResponsesModel(model="toolbot", openai_client=aclient),
                OpenAIChatCompletionsModel(model="toolbot", openai_client=aclient),
            ):
                agent = Agent(name="weather", model=model, tools=[tool], model_settings=settings)
                # The tiny model may call the tool again whatever the result: two turns show
                # the protocol (a call, its result sent back), not the model's wisdom.
                with contextlib.suppress(MaxTurnsExceeded):
                    await Runner.run(agent, TOOL_QUESTION[0]["content"], max_turns=2)
                with contextlib.suppress(MaxTurnsExceeded):  # and streamed, as UIs run it
                    run = Runner.run_streamed(agent, TOOL_QUESTION[0]["content"], max_turns=2)
                    async for _ in run.stream_events():
                        pass

        asyncio.run(run_both())
    assert len(asked) >= 4 and all(a == {"city": "Paris"} for a in asked)

    for api in ("responses", None):
        logged = rows(
            db,
            "SELECT * FROM exchanges WHERE api IS NOT DISTINCT FROM ? ORDER BY ts",
            [api],
        )
        assert [r["stream"] for r in logged] == [False, False, True, True], api
        # The SDK sends the whole history back: each run stitched by prefix into one
        # conversation of two turns (a model call per turn).
        for run in (logged[:2], logged[2:]):
            assert len({r["trajectory_id"] for r in run}) == 1, api
            assert [r["turn"] for r in run] == [0, 1]
            last = json.loads(run[1]["request"])["messages"]
            assert last[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
            assert last[-1]["role"] == "tool" and last[-1]["content"] == '{"celsius": 21}'
