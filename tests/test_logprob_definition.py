"""One logprob definition (`onjob.logprobs`): every exchange records the one its engine
used, what the engine states or else what `proxy.engine_logprobs` declares, so that the
trainer can refuse groups sampled under another (tests/test_trainer.py)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from litestar.testing import TestClient
from openai import OpenAI

from onjob.cli.process import ServerProcess
from onjob.collector import Collector, CollectorSettings
from onjob.judge import sampling
from onjob.logprobs import Untrainable, untrainable
from onjob.proxy import ProxySettings, create_app

from .conftest import admin_of, rows
from .fake_engine import chunk, completion, scripted

ASK = {"model": "agent", "messages": [{"role": "user", "content": "hi"}]}


def vllm_like():
    """An engine whose model list states no definition, as vLLM's does not."""

    def chat(request: httpx.Request) -> httpx.Response:
        if b'"stream":true' in request.content.replace(b" ", b""):

            async def events():  # streamed as an engine streams, not one buffered body
                for event in (chunk("hi"), chunk(finish="stop"), b"data: [DONE]\n\n"):
                    yield event

            return httpx.Response(
                200, content=events(), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=completion())

    return scripted(chat)


def test_an_engine_that_states_no_definition_is_logged_under_the_declared_one(tmp_path):
    db = tmp_path / "onjob.duckdb"
    collector = Collector(CollectorSettings(db=db))
    settings = ProxySettings(aliases={"agent": None}, engine_logprobs="processed_logprobs")
    with TestClient(create_app(settings, upstream=vllm_like(), collector=collector)) as client:
        assert client.post("/v1/chat/completions", json=ASK).status_code == 200
        streamed = client.post("/v1/chat/completions", json={**ASK, "stream": True})
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
    logged = rows(db, "SELECT stream, logprobs_mode FROM exchanges ORDER BY ts")
    assert [(r["stream"], r["logprobs_mode"]) for r in logged] == [
        (False, "processed_logprobs"),
        (True, "processed_logprobs"),
    ]


def test_constrained_requests_to_an_engine_that_does_not_say_are_marked_as_grammar_masked(
    tmp_path,
):
    """vLLM takes its "raw" logprobs after a grammar's mask: a JSON response_format or a
    forced tool call from an engine that does not state its definition is not raw."""
    db = tmp_path / "onjob.duckdb"
    collector = Collector(CollectorSettings(db=db))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    strict = [{"type": "function", "function": {**tools[0]["function"], "strict": True}}]
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}
    # What vLLM also decodes under a grammar (vllm/entrypoints/openai/protocol.py
    # `ChatCompletionRequest.to_sampling_params`, serving_chat.py's structural-tag tool
    # parsers under VLLM_ENFORCE_STRICT_TOOL_CALLING).
    asks = {
        "free": {},
        "json": {"response_format": {"type": "json_object"}},
        "required": {"tools": tools, "tool_choice": "required"},
        "named": {"tools": tools, "tool_choice": {"type": "function", "function": {"name": "f"}}},
        "auto": {"tools": tools, "tool_choice": "auto"},
        "strict_auto": {"tools": strict, "tool_choice": "auto"},
        "strict_unset": {"tools": strict},
        "strict_none": {"tools": strict, "tool_choice": "none"},
        "one_call": {"tools": tools, "parallel_tool_calls": False},
        "tag": {"response_format": tag},
        "structured_outputs": {"structured_outputs": {"regex": "[a-z]+"}},
        "guided_json": {"guided_json": {"type": "object"}},
        "guided_choice": {"guided_choice": ["a", "b"]},
    }
    settings = ProxySettings(aliases={"agent": None})
    with TestClient(create_app(settings, upstream=vllm_like(), collector=collector)) as client:
        for name, more in asks.items():
            body = {**ASK, "metadata": {"scenario": name}, **more}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
    logged = rows(
        db,
        "SELECT json_extract_string(request, '$.metadata.scenario') AS ask, logprobs_mode "
        "FROM exchanges",
    )
    assert {r["ask"]: r["logprobs_mode"] for r in logged} == {
        "free": "raw_logprobs",
        "json": "raw_logprobs+grammar",
        "required": "raw_logprobs+grammar",
        "named": "raw_logprobs+grammar",
        "auto": "raw_logprobs",
        "strict_auto": "raw_logprobs+grammar",
        "strict_unset": "raw_logprobs+grammar",
        "strict_none": "raw_logprobs",
        "one_call": "raw_logprobs+grammar",
        "tag": "raw_logprobs+grammar",
        "structured_outputs": "raw_logprobs+grammar",
        "guided_json": "raw_logprobs+grammar",
        "guided_choice": "raw_logprobs+grammar",
    }
    # And none of them is trained on (`onjob.logprobs.untrainable`).
    masked = rows(db, "SELECT untrainable FROM exchanges WHERE logprobs_mode LIKE '%+grammar'")
    assert {r["untrainable"] for r in masked} == {"masked"}


def test_an_engine_that_states_its_definition_is_taken_at_its_word(tmp_path, engine):
    """The local engine's model list says raw_logprobs: a wrong declaration does not win."""
    db = tmp_path / "onjob.duckdb"
    declared = {"ONJOB_PROXY__ENGINE_LOGPROBS": "processed_logprobs"}
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)], env=declared) as server:
        deadline = time.monotonic() + 30
        while True:  # the pool's first health check reads the model list
            answer = httpx.get(f"{server.base}/admin/status", headers=admin_of(db), timeout=10)
            [state] = answer.json()["engines"]
            if state["logprobs"] == "raw_logprobs" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert state["logprobs"] == "raw_logprobs"
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        client.chat.completions.create(**ASK, max_tokens=4)
        # Under a grammar too: the local engine records the unmasked logprobs, and says so.
        client.chat.completions.create(**ASK, max_tokens=4, response_format={"type": "json_object"})
    logged = rows(db, "SELECT logprobs_mode FROM exchanges")
    assert [r["logprobs_mode"] for r in logged] == ["raw_logprobs"] * 2


def test_include_reasoning_false_is_refused_and_true_is_not_forwarded(tmp_path):
    """vLLM 0.33 leaves token ids and logprobs out under `include_reasoning: false` when a
    reasoning parser runs (vllm/entrypoints/openai/serving_chat.py): nothing to train on."""
    sent = []

    def chat(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json=completion())

    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    app = create_app(
        ProxySettings(aliases={"agent": None}), upstream=scripted(chat), collector=collector
    )
    with TestClient(app) as client:
        refused = client.post("/v1/chat/completions", json={**ASK, "include_reasoning": False})
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "include_reasoning"
        assert "token ids and logprobs" in refused.json()["error"]["message"]
        taken = client.post("/v1/chat/completions", json={**ASK, "include_reasoning": True})
        assert taken.status_code == 200
    assert len(sent) == 1 and "include_reasoning" not in sent[0]


def test_a_sample_without_a_given_definition_records_the_engines_own_or_none(engine):
    """The canary's paired samples (`deploy.canary.paired_round`) are drawn without a
    definition: they record what the engine states (the local engine), and none for an
    engine that does not say (vLLM), never a definition they were not sampled under."""
    body = {
        "model": "tiny",
        "messages": ASK["messages"],
        "max_tokens": 3,
        "n": 2,
        "logprobs": True,
        "return_token_ids": True,
    }

    async def draw(client: httpx.AsyncClient):
        async with client:
            return await sampling.sample(client, body)

    local = asyncio.run(draw(httpx.AsyncClient(base_url=engine.url, timeout=120)))
    assert local.logprobs_mode == "raw_logprobs"
    assert (
        untrainable(
            local.logprobs_mode, local.completion_token_ids, local.completion_logprobs, local.usage
        )
        is None
    )
    silent = asyncio.run(draw(vllm_like().client))
    assert silent.logprobs_mode is None
    assert (
        untrainable(
            silent.logprobs_mode, silent.completion_token_ids, silent.completion_logprobs, None
        )
        == Untrainable.DEFINITION
    )
