"""The agent frameworks people use, unchanged, against a real `onjob serve` in front of
the local engine: LangChain's `ChatOpenAI` and pydantic-ai here; the openai client's
Responses API and the Agents SDK in tests/test_responses_api.py.

The tiny models are not capable, so these assert on the protocol and on what landed in
DuckDB (read through `/admin/sql` while the server runs); where an answer's content must
be right, a forced tool call or a schema makes it so, decoded under a grammar."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from onjob.cli.process import ServerProcess

from .conftest import TOOL_QUESTION


class Weather(BaseModel):
    city: str
    celsius: int


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
    resp = httpx.post(f"{server.base}/admin/sql", json={"query": query}, timeout=30)
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
        base_url=server.url, api_key="unused", model="agent", max_retries=0, timeout=120, **kw
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
        return await agent.run("The weather in Paris?", model_settings={"max_tokens": 64})

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
