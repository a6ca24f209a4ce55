"""The agent frameworks people use, unchanged, against a real `onjob serve` in front of
the local engine: the openai client's `.parse`, LangChain's `ChatOpenAI`, pydantic-ai and
instructor here; the Responses API and the Agents SDK in tests/test_responses_api.py.

The tiny models are not capable, so these assert on the protocol and on what landed in
DuckDB (read through `/admin/sql` while the server runs); where an answer's content must
be right, a forced tool call or a schema makes it so, decoded under a grammar."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import httpx
import instructor
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import OpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from onjob.cli.process import ServerProcess

from .conftest import TOOL_QUESTION, admin_of


class Weather(BaseModel):
    # Bounded fields: a random tiny model under a grammar can run on inside a free string
    # or number until max_tokens cuts its JSON; an enum cannot.
    city: Literal["Paris", "Rome", "Berlin"]
    celsius: Literal[10, 15, 20, 25]


SEED = 7  # the engine samples a seeded request the same way every run
# get_weather with its city bounded, for a forced call on a prompt the model was not taught.
CITIES = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                "required": ["city"],
            },
        },
    }
]


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"18 degrees in {city}"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tool_engine):
    db = tmp_path_factory.mktemp("clients") / "onjob.duckdb"
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    with ServerProcess(["--engine-url", tool_engine.url, "--db", str(db)], env=env) as proc:
        yield proc


def sql(server: ServerProcess, query: str) -> list[dict]:
    admin = admin_of(server)
    resp = httpx.post(f"{server.base}/admin/sql", json={"query": query}, headers=admin, timeout=30)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]


def logged(server: ServerProcess, *answers: AIMessage) -> list[dict]:
    """The exchanges LangChain's answers were (the chat completion's id is the exchange's)."""
    quoted = ", ".join(f"'{a.response_metadata['id']}'" for a in answers)
    return sql(
        server,
        "SELECT id, trajectory_id, turn, status, request, response FROM exchanges_full "
        f"WHERE id IN ({quoted}) ORDER BY turn",
    )


def chat_model(server: ServerProcess, **kw) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=server.url,
        api_key="unused",
        model="agent",
        max_retries=0,
        timeout=120,
        seed=SEED,
        **kw,
    )


def test_langchain_invoke_and_stream_are_answered_and_logged(server):
    llm = chat_model(server, max_tokens=8)
    said = llm.invoke([HumanMessage("Say hello.")])
    assert isinstance(said, AIMessage) and said.response_metadata["finish_reason"] in (
        "stop",
        "length",
    )
    chunks = list(llm.stream([HumanMessage("Say hello again.")]))
    assert len(chunks) >= 2  # streamed, not one blob
    streamed = chunks[0]
    for c in chunks[1:]:
        streamed += c
    [row] = logged(server, said)
    assert row["status"] == 200
    assert json.loads(row["response"])["choices"][0]["message"]["content"] == said.content
    # A stream's chunks carry no id LangChain keeps: the logged stream is found by its text.
    rows = sql(server, "SELECT status, response FROM exchanges WHERE stream")
    texts = [json.loads(r["response"])["choices"][0]["message"]["content"] for r in rows]
    assert streamed.content in texts


def test_langchain_bind_tools_with_a_forced_tool_is_one_conversation(server):
    llm = chat_model(server, max_tokens=48).bind_tools([get_weather], tool_choice="get_weather")
    messages = [HumanMessage(TOOL_QUESTION[0]["content"])]
    first = llm.invoke(messages)
    [call] = first.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    messages += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    second = chat_model(server, max_tokens=8).bind_tools([get_weather]).invoke(messages)
    rows = logged(server, first, second)
    # The tool call and its result continued the same conversation.
    assert len({r["trajectory_id"] for r in rows}) == 1 and [r["turn"] for r in rows] == [0, 1]
    stored = json.loads(rows[0]["response"])["choices"][0]["message"]["tool_calls"]
    assert stored[0]["function"]["name"] == "get_weather"
    assert json.loads(stored[0]["function"]["arguments"]) == call["args"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output_validates(server, method):
    llm = chat_model(server, max_tokens=64)
    if method == "json_mode":  # the schema is the caller's to ask for in the prompt
        structured = llm.with_structured_output(method="json_mode", include_raw=True)
    else:
        structured = llm.with_structured_output(Weather, method=method, include_raw=True)
    out = structured.invoke([HumanMessage("The weather in Paris, as JSON.")])
    assert out["parsing_error"] is None
    if method == "json_mode":
        assert isinstance(out["parsed"], dict)
    else:
        assert isinstance(out["parsed"], Weather)
    [row] = logged(server, out["raw"])
    assert row["status"] == 200
    request = json.loads(row["request"])
    assert request.get("response_format") or request.get("tool_choice")


def test_pydantic_ai_agent_gets_a_validated_output(server):
    model = OpenAIChatModel("agent", provider=OpenAIProvider(base_url=server.url, api_key="unused"))
    agent = Agent(model, output_type=Weather, retries=0)

    async def run():
        return await agent.run(
            "The weather in Paris?", model_settings={"max_tokens": 64, "seed": SEED}
        )

    result = asyncio.run(run())
    assert isinstance(result.output, Weather)
    [response] = [m for m in result.all_messages() if m.kind == "response"]
    [row] = sql(
        server,
        f"SELECT status, response FROM exchanges WHERE id = '{response.provider_response_id}'",
    )
    assert row["status"] == 200
    # pydantic-ai asks for its output as a forced call of its output tool.
    call = json.loads(row["response"])["choices"][0]["message"]["tool_calls"][0]
    assert Weather.model_validate_json(call["function"]["arguments"]) == result.output


def test_openai_parse_and_a_forced_tool_call_through_the_proxy(server):
    client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    parsed = client.chat.completions.parse(
        model="agent",
        messages=[{"role": "user", "content": "The weather in Paris, as JSON."}],
        response_format=Weather,
        max_tokens=64,
        seed=SEED,
    )
    assert isinstance(parsed.choices[0].message.parsed, Weather)
    forced = client.chat.completions.create(
        model="agent",
        messages=[{"role": "user", "content": "Hello."}],  # not a question it was taught
        tools=CITIES,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=48,
        seed=SEED,
    )
    [call] = forced.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    rows = sql(
        server,
        f"SELECT id, response FROM exchanges WHERE id IN ('{parsed.id}', '{forced.id}')",
    )
    answers = {r["id"]: json.loads(r["response"])["choices"][0]["message"] for r in rows}
    assert (
        Weather.model_validate_json(answers[parsed.id]["content"])
        == parsed.choices[0].message.parsed
    )
    assert answers[forced.id]["tool_calls"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_gets_a_validated_model(server, mode):
    client = instructor.from_openai(
        OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120),
        mode=getattr(instructor.Mode, mode),
    )
    weather, completion = client.chat.completions.create_with_completion(
        model="agent",
        response_model=Weather,
        messages=[{"role": "user", "content": "The weather in Paris?"}],
        max_tokens=64,
        seed=SEED,
        max_retries=0,  # one try: the grammar, not a retry, makes it valid
    )
    assert isinstance(weather, Weather)
    [row] = sql(server, f"SELECT status FROM exchanges WHERE id = '{completion.id}'")
    assert row["status"] == 200
