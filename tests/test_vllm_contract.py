"""The local engine against what vLLM's own code does, recorded from its released wheel.

`tests/fixtures/vllm/vllm-0.13.0.json` and `vllm-0.33.0.json` hold what vLLM 0.13.0 (the
oldest release onjob starts) and 0.33.0 (the newest read) answered to each case: whether
`ChatCompletionRequest` accepts a request and whether it is then decoded under a
grammar, what `Hermes2ProToolParser.extract_tool_calls` reads from a model's text, and
the JSON schemas of its answers. `tests/fixtures/vllm/record.py` records them (by hand,
from each release's wheel; `tests/test_real_engines.py` runs on vLLM 0.32 itself). The
local engine accepts what every release accepts, and onjob counts as masked what any
release masks (the proxy cannot tell the release). Where the local engine differs on
purpose, the difference is listed here with its reason and pinned."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from onjob.cli.process import ServerProcess
from onjob.engine import chat
from onjob.engine.vllm import MIN_VERSION
from onjob.logprobs import constrained

RECORDS = [
    json.loads((Path(__file__).parent / f"fixtures/vllm/vllm-{v}.json").read_text())
    for v in ("0.13.0", "0.33.0")
]
RECORD = RECORDS[0]

# Requests vLLM accepts and the local engine refuses, and why.
REFUSED_LOCALLY = {
    # vLLM decodes under its own grammar fields; the local engine has no decoder for them
    # and says so rather than answer unconstrained.
    "structured_outputs_regex": "structured_outputs",
}

# Model texts the local engine reads otherwise than vLLM's Hermes parser, and its reading.
READ_OTHERWISE = {
    # vLLM's regex ends the call at the first `</tool_call>`, inside the argument, and the
    # broken JSON leaves the whole text as content; the local engine's JSON decoder does not.
    "close_tag_inside_argument": (None, [("get_weather", '{"city": "</tool_call>"}')]),
    # vLLM JSON-encodes a string again ('"{\\"city\\": ...}"'), which no client can use as
    # arguments; the local engine passes the string on.
    "arguments_as_string": (None, [("get_weather", '{"city": "Paris"}')]),
}


def test_the_records_are_of_releases_onjob_starts_and_hold_the_same_cases():
    for record in RECORDS:
        major, minor = (int(x) for x in record["vllm"].split(".")[:2])
        assert (major, minor) >= MIN_VERSION
        assert record["requests"].keys() == RECORD["requests"].keys()
        assert record["hermes"].keys() == RECORD["hermes"].keys()


@pytest.mark.parametrize("name", sorted(RECORD["hermes"]))
def test_model_text_is_read_into_tool_calls_as_vllms_hermes_parser_reads_it(name):
    content, calls = chat.parse_tool_calls(RECORD["hermes"][name]["text"])
    read = (content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls])
    for record in RECORDS:
        case = record["hermes"][name]
        if name in READ_OTHERWISE:
            assert read == READ_OTHERWISE[name]
            continue
        assert read == (case["content"], [(c["name"], c["arguments"]) for c in case["calls"]])
        assert bool(calls) == case["tools_called"]


@pytest.mark.parametrize("name", sorted(RECORD["requests"]))
def test_the_local_engine_accepts_what_every_release_accepts_and_refuses_the_rest(engine, name):
    cases = [record["requests"][name] for record in RECORDS]
    body = {**cases[0]["body"], "model": "tiny", "max_tokens": 1}
    r = httpx.post(f"{engine.url}/chat/completions", json=body, timeout=60)
    if name in REFUSED_LOCALLY:
        assert all(case["accepted"] for case in cases)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == REFUSED_LOCALLY[name]
        return
    if all(case["accepted"] for case in cases):
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 400, ([case.get("error") for case in cases], r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("name", sorted(RECORD["requests"]))
def test_a_request_any_release_decodes_under_a_grammar_is_recorded_as_masked(name):
    """`onjob.logprobs.constrained` decides, at the proxy, that an answer's logprobs are the
    masked distribution's: missing one would train on them as raw, and one no release masks
    would be kept from training for nothing."""
    cases = [record["requests"][name] for record in RECORDS]
    if not any(case["accepted"] for case in cases):
        return
    assert constrained(cases[0]["body"]) == any(case.get("masked") for case in cases)


def _closed(schema):
    """`schema` with no field allowed beyond those it names (vLLM's models take extra fields,
    so its own schemas would let any field of the local engine's through)."""
    if isinstance(schema, dict):
        closed = {k: _closed(v) for k, v in schema.items()}
        if "properties" in closed:
            closed["additionalProperties"] = False
        return closed
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


ANSWER = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "What time is it?"}],
    "logprobs": True,
    "top_logprobs": 2,
    "return_token_ids": True,
}
TIME_TOOL = RECORD["requests"]["tools_auto"]["body"]["tools"][1]


@pytest.mark.parametrize(
    "extra",
    [
        {"n": 2, "max_tokens": 4},
        {"tools": [TIME_TOOL], "tool_choice": "required", "max_tokens": 40, "seed": 1},
    ],
    ids=["text", "tool call"],
)
def test_the_local_engines_answers_fit_vllms_response_models(engine, extra):
    """Every field the local engine answers with is one of vLLM's, of vLLM's type
    (`ChatCompletionResponse`, `ChatCompletionStreamResponse`, recorded as JSON schemas)."""
    r = httpx.post(f"{engine.url}/chat/completions", json={**ANSWER, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    streamed = {**ANSWER, **extra, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{engine.url}/chat/completions", json=streamed, timeout=120) as s:
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    for record in RECORDS:
        jsonschema.validate(r.json(), _closed(record["schemas"]["chat.completion"]))
        chunk = _closed(record["schemas"]["chat.completion.chunk"])
        for event in events[:-1]:
            jsonschema.validate(json.loads(event), chunk)


def test_allowed_tools_is_a_400_naming_tool_choice(engine):
    body = {**RECORD["requests"]["tool_choice_allowed_tools"]["body"], "model": "tiny"}
    r = httpx.post(f"{engine.url}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tool_choice"
    assert "allowed_tools" in r.json()["error"]["message"]


def test_through_onjob_serve_allowed_tools_is_the_engines_400_and_reasoning_effort_passes(
    tmp_path, engine
):
    """The proxy forwards both (`onjob.proxy.exchange`): the engine's refusal reaches the
    client as the engine gave it, and a reasoning effort vLLM takes is answered."""
    case = RECORD["requests"]["tool_choice_allowed_tools"]["body"]
    with ServerProcess(["--engine-url", engine.url, "--db", str(tmp_path / "o.duckdb")]) as s:
        client = openai.OpenAI(base_url=s.url, api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="agent",
                messages=case["messages"],
                tools=case["tools"],
                tool_choice=case["tool_choice"],
                max_tokens=1,
            )
        assert refused.value.param == "tool_choice"
        assert "allowed_tools" in refused.value.message
        answer = client.chat.completions.create(
            model="agent", messages=case["messages"], reasoning_effort="low", max_tokens=1
        )
        assert answer.choices[0].finish_reason == "length"
