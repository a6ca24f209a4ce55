"""Structured outputs and forced tool calls in the local engine, over real HTTP with the
official openai client: answers decoded under a grammar parse and validate, and their
logprobs stay the raw model's."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import jsonschema
import openai
import pytest
import torch
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel
from transformers import AutoModelForCausalLM

from .conftest import TOOL_QUESTION, TOOLS, teach
from .test_engine_api import forward_logprobs

CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
            "required": ["zone"],
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in [*TOOLS, CLOCK]}
JSON_QUESTION = [{"role": "user", "content": "Weather in Paris as JSON."}]
JSON_ANSWER = '{"city": "Paris", "temp_c": 18}'
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}},
    "required": ["city", "temp_c"],
    "additionalProperties": False,
}


class Verdict(BaseModel):
    """Bounded fields only: a random tiny model would fill a free string forever."""

    verdict: Literal["yes", "no", "maybe"]
    sure: bool
    votes: int


@pytest.fixture(scope="module")
def json_engine(tmp_path_factory, tokenizer):
    """A tiny model taught to answer JSON_QUESTION with JSON_ANSWER, served as `jsonbot`."""
    from onjob.cli.process import EngineProcess

    out = teach(tokenizer, [(JSON_QUESTION, None, JSON_ANSWER)], tmp_path_factory.mktemp("json"))
    with EngineProcess(["--model", str(out), "--served-model-name", "jsonbot"]) as e:
        yield e


def _client(engine) -> OpenAI:
    return OpenAI(base_url=engine.url, api_key="x", max_retries=0, timeout=120)


def test_parse_returns_an_object_of_the_pydantic_model(client):
    r = client.chat.completions.parse(
        model="tiny",
        messages=[{"role": "user", "content": "Is it raining?"}],
        response_format=Verdict,
        max_tokens=120,
        n=3,
        seed=5,
    )
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Verdict)
        jsonschema.validate(json.loads(choice.message.content), Verdict.model_json_schema())


def test_json_object_and_json_schema_answers_parse(json_engine):
    client = _client(json_engine)
    for response_format in (
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}},
        {
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": WEATHER, "strict": True},
        },
    ):
        r = client.chat.completions.create(
            model="jsonbot",
            messages=JSON_QUESTION,
            response_format=response_format,
            temperature=0,
            max_tokens=40,
        )
        answer = json.loads(r.choices[0].message.content)
        assert answer == json.loads(JSON_ANSWER)
        assert r.choices[0].finish_reason == "stop"
    # A schema the taught answer does not fit: the grammar wins over the model's habit.
    other = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model="jsonbot",
        messages=JSON_QUESTION,
        response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": other}},
        temperature=0,
        max_tokens=20,
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), other)


def test_named_tool_choice_calls_that_function_with_valid_arguments(tool_engine):
    client = _client(tool_engine)
    r = client.chat.completions.create(
        model="toolbot",
        messages=TOOL_QUESTION,
        tools=[*TOOLS, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=60,
        seed=3,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_time"])


def test_required_tool_choice_makes_calls_and_parallel_false_makes_one(tool_engine):
    client = _client(tool_engine)
    for parallel in (True, False):
        r = client.chat.completions.create(
            model="toolbot",
            messages=[{"role": "user", "content": "Hello there."}],
            tools=[*TOOLS, CLOCK],
            tool_choice="required",
            parallel_tool_calls=parallel,
            max_tokens=120,
            n=3,
            seed=8,
        )
        for choice in r.choices:
            if choice.finish_reason == "length":
                continue  # a free string argument the untaught prompt never closed
            assert choice.finish_reason == "tool_calls"
            calls = choice.message.tool_calls
            assert calls and (parallel or len(calls) == 1)
            for call in calls:
                jsonschema.validate(
                    json.loads(call.function.arguments), SCHEMAS[call.function.name]
                )
    # The taught question, forced: the model's own call, token for token.
    r = client.chat.completions.create(
        model="toolbot", messages=TOOL_QUESTION, tools=TOOLS, tool_choice="required", temperature=0
    )
    (call,) = r.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )


def test_streamed_tool_call_arrives_as_openai_streams_it(tool_engine):
    client = _client(tool_engine)
    for tool_choice in ("auto", {"type": "function", "function": {"name": "get_weather"}}):
        chunks = list(
            client.chat.completions.create(
                model="toolbot",
                messages=TOOL_QUESTION,
                tools=TOOLS,
                tool_choice=tool_choice,
                temperature=0,
                stream=True,
            )
        )
        deltas = [
            tc
            for c in chunks
            if c.choices and c.choices[0].delta.tool_calls
            for tc in c.choices[0].delta.tool_calls
        ]
        first, *fragments = deltas
        assert first.id.startswith("call_") and first.type == "function"
        assert first.function.name == "get_weather" and first.function.arguments == ""
        assert len(fragments) > 1, "the arguments come in pieces, as they are decoded"
        assert all(f.id is None and f.function.name is None for f in fragments)
        arguments = "".join(f.function.arguments for f in fragments)
        assert json.loads(arguments) == {"city": "Paris"}
        assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # The openai client's stream helper assembles the same call from the events.
    with client.chat.completions.stream(
        model="toolbot", messages=TOOL_QUESTION, tools=TOOLS, temperature=0
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in events
    assert "tool_calls.function.arguments.done" in events
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_a_schema_the_grammar_cannot_compile_is_a_400_naming_the_param(client):
    bad = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {"name": "b", "schema": bad}},
        )
    assert caught.value.param == "response_format"
    assert "cannot be decoded under" in caught.value.message
    tool = {"type": "function", "function": {"name": "f", "parameters": bad}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            tools=[tool],
            tool_choice="required",
        )
    assert caught.value.param == "tools"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "missing"}},
        )
    assert caught.value.param == "tool_choice"
    # The engine goes on serving.
    assert client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2
    ).choices


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def test_logprobs_under_a_schema_are_the_raw_models_not_the_masked(client, reference):
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Is it raining?"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "v", "schema": Verdict.model_json_schema()},
        },
        max_tokens=120,
        logprobs=True,
        temperature=0.7,
        seed=13,
        extra_body={"return_token_ids": True},
    )
    choice = r.choices[0]
    Verdict.model_validate_json(choice.message.content)
    ids = choice.model_extra["token_ids"]
    got = torch.tensor([e.logprob for e in choice.logprobs.content])
    expected = forward_logprobs(reference, r.model_extra["prompt_token_ids"], ids)
    assert torch.allclose(got, expected, atol=1e-4)
    # `{` is the only token the grammar allows first: masked, its logprob would be 0.
    assert choice.logprobs.content[0].token == "{" and got[0] < -1


def test_a_constrained_request_leaves_its_batch_neighbours_unconstrained(engine):
    free = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 40,
        "seed": 21,
        "extra_body": {"return_token_ids": True, "ignore_eos": True},
    }
    schema = {"type": "json_schema", "json_schema": {"name": "v", "schema": WEATHER}}

    async def run():
        client = AsyncOpenAI(base_url=engine.url, api_key="x", max_retries=0, timeout=120)
        alone = await client.chat.completions.create(**free)
        together = await asyncio.gather(
            client.chat.completions.create(**free),
            *(
                client.chat.completions.create(
                    model="tiny", messages=JSON_QUESTION, response_format=schema, max_tokens=40
                )
                for _ in range(3)
            ),
        )
        return alone, together

    alone, (free_again, *constrained) = asyncio.run(run())
    ids = alone.choices[0].model_extra["token_ids"]
    assert free_again.choices[0].model_extra["token_ids"] == ids
    for r in constrained:
        assert r.choices[0].message.content.startswith('{"city": "')


def test_an_argument_string_holding_the_closing_tag_stays_inside_its_call():
    """Under a grammar a free string may hold anything, `</tool_call>` included: the call
    ends where its JSON does, streamed or not."""
    from onjob.engine import chat

    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a</tool_call>b}"}}\n'
        "</tool_call>"
    )
    _, (call,) = chat.parse_tool_calls(text)
    assert json.loads(call["function"]["arguments"]) == {"city": "a</tool_call>b}"}
    reader = chat.ToolCallStream()
    deltas = [d for i in range(len(text)) for d in reader.feed(text[i], i == len(text) - 1)[1]]
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    streamed = "".join(d["function"]["arguments"] for d in deltas)
    assert json.loads(streamed) == {"city": "a</tool_call>b}"}


def test_a_forced_call_cut_inside_its_closing_tag_is_still_the_call():
    """Sampled, the bundled model once closed its arguments and was cut by `max_tokens`
    one token short of `</tool_call>`: the call was whole, so it is returned; a free
    answer cut the same way is text, as vLLM's Hermes parser leaves it. Streamed, its
    arguments are the call's, not the tag's first characters."""
    from onjob.engine import chat

    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Hamburg"}}\n</tool_call'
    _, (call,) = chat.parse_tool_calls(text, cut=True)
    assert json.loads(call["function"]["arguments"]) == {"city": "Hamburg"}
    reader = chat.ToolCallStream()
    deltas = [d for i in range(len(text)) for d in reader.feed(text[i], i == len(text) - 1)[1]]
    assert json.loads("".join(d["function"]["arguments"] for d in deltas)) == {"city": "Hamburg"}
    assert chat.parse_tool_calls(text) == (text, [])
    assert chat.parse_tool_calls(text[: text.index("}}") + 1], cut=True) == (
        text[: text.index("}}") + 1],
        [],
    )
