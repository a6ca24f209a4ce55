"""Every field clients send: OpenAI's chat request field by field (null is absent, hints
accepted and kept from the engine, the unservable refused by name), the Responses API's
translation as the engine receives it and its stream when the engine fails, and legacy
completions and `models.retrieve` against a real local engine."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from litestar.testing import TestClient
from openai import OpenAI

from onjob.cli.process import ServerProcess
from onjob.collector import Collector, CollectorSettings
from onjob.protocol.fields import REFUSED
from onjob.proxy import ProxySettings, create_app

from .conftest import rows
from .fake_engine import chunk, completion, scripted

CHAT = {"model": "agent", "messages": [{"role": "user", "content": "hi"}]}


def streamed(payload: bytes) -> httpx.Response:
    """A stream the proxy reads as it arrives, as an engine's is."""

    async def body():
        yield payload

    return httpx.Response(200, content=body())


def recording_app(tmp_path, answer=None):
    """The proxy in process over a scripted engine that keeps every request it gets."""
    seen: list[tuple[str, dict]] = []

    def engine(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        if answer is not None:
            return answer(body)
        if body.get("stream"):
            usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
            stream = chunk("hi") + chunk("!", finish="stop") + chunk(usage=usage)
            return streamed(stream + b"data: [DONE]\n\n")
        return httpx.Response(200, json=completion())

    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    app = create_app(ProxySettings(), upstream=scripted(engine), collector=collector)
    return app, seen


NULLABLE = [
    "stream",
    "n",
    "stop",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "response_format",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stream_options",
    "parallel_tool_calls",
    "metadata",
    "user",
    "modalities",
    *REFUSED,
]


def test_null_fields_are_absent_and_never_reach_the_engine(tmp_path):
    app, seen = recording_app(tmp_path)
    with TestClient(app) as client:
        resp = client.post("/v1/chat/completions", json={**CHAT, **dict.fromkeys(NULLABLE)})
        assert resp.status_code == 200, resp.text
    ((_, sent),) = seen
    assert not [k for k, v in sent.items() if v is None]
    assert not set(NULLABLE) & set(sent) - {"logprobs"}  # logprobs: the proxy's own, on


def test_hints_are_accepted_and_answer_shaping_fields_reach_the_engine(tmp_path):
    app, seen = recording_app(tmp_path)
    hints = {
        "store": True,
        "service_tier": "auto",
        "prompt_cache_key": "k",
        "safety_identifier": "u1",
        "modalities": ["text"],
        "prediction": {"type": "content", "content": "x"},  # a latency hint
    }
    shaping = {
        "logit_bias": {"42": -100},
        "stop": ["\n", "END"],
        "max_completion_tokens": 7,
        "seed": 3,
        "presence_penalty": 0.5,
        "response_format": {"type": "json_object"},
        "reasoning_effort": "high",  # vLLM takes it (its 0.13 values: low, medium, high)
    }
    with TestClient(app) as client:
        resp = client.post("/v1/chat/completions", json={**CHAT, **hints, **shaping})
        assert resp.status_code == 200, resp.text
    ((_, sent),) = seen
    assert not set(hints) & set(sent)
    assert {k: sent[k] for k in shaping} == shaping


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("verbosity", "low"),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("web_search_options", {}),
        ("functions", [{"name": "f"}]),
        ("function_call", "auto"),
        ("moderation", {"model": "m"}),
    ],
)
def test_fields_no_engine_behind_onjob_honours_are_400s_naming_them(tmp_path, field, value):
    app, seen = recording_app(tmp_path)
    with TestClient(app) as client:
        resp = client.post("/v1/chat/completions", json={**CHAT, field: value})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == field
    assert not seen


def test_responses_request_reaches_the_engine_as_the_chat_request_it_means(tmp_path):
    app, seen = recording_app(tmp_path)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {
        "model": "agent",
        "instructions": "Be exact.",
        "input": [
            {"type": "message", "role": "developer", "content": "Use tools."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
        "tools": [{"type": "function", "name": "w", "parameters": {}, "strict": True}],
        "tool_choice": {"type": "function", "name": "w"},
        "parallel_tool_calls": False,
        "text": {"format": {"type": "json_schema", "name": "A", "schema": schema, "strict": True}},
        "max_output_tokens": 9,
        "top_p": 0.5,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k",
        "stream_options": {"include_obfuscation": False},
    }
    with TestClient(app) as client:
        resp = client.post("/v1/responses", json=body)
        assert resp.status_code == 200, resp.text
        assert client.get(f"/v1/responses/{resp.json()['id']}").status_code == 404  # store: false
    ((path, sent),) = seen
    assert path.endswith("/chat/completions")
    assert sent["messages"] == [
        {"role": "system", "content": "Be exact."},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    assert sent["tools"] == [
        {"type": "function", "function": {"name": "w", "parameters": {}, "strict": True}}
    ]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "A", "schema": schema, "strict": True},
    }
    assert (sent["max_tokens"], sent["top_p"], sent["parallel_tool_calls"]) == (9, 0.5, False)
    assert sent["logprobs"] is True and sent["return_token_ids"] is True
    answer = resp.json()
    assert answer["output"][0]["content"][0]["text"] == "hello there"
    assert answer["text"]["format"]["type"] == "json_schema" and answer["store"] is False


def test_responses_stream_the_engine_cuts_ends_in_response_failed_and_is_logged(tmp_path):
    cut = chunk("par") + chunk("tial")  # no [DONE]: the engine went away
    app, _ = recording_app(tmp_path, answer=lambda body: streamed(cut))
    with TestClient(app) as client:
        resp = client.post("/v1/responses", json={"model": "agent", "input": "x", "stream": True})
        events = [
            json.loads(line[5:]) for line in resp.text.splitlines() if line.startswith("data:")
        ]
        response_id = events[0]["response"]["id"]
        assert client.get(f"/v1/responses/{response_id}").status_code == 404
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-2:] == ["error", "response.failed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["output"][0]["content"][0]["text"] == "partial"
    (row,) = rows(tmp_path / "onjob.duckdb", "SELECT * FROM exchanges")
    assert (row["id"], row["status"], row["api"]) == (response_id, 502, "responses")
    assert row["api_object"] is None


def test_legacy_completions_and_models_retrieve_against_the_local_engine(tmp_path, engine):
    db = tmp_path / "onjob.duckdb"
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)]) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        whole = client.completions.create(model="agent", prompt="Once upon", max_tokens=5)
        assert whole.object == "text_completion" and whole.choices[0].text
        assert whole.choices[0].logprobs is None  # not asked: stripped
        asked = client.completions.create(
            model="agent", prompt="Once upon", max_tokens=3, logprobs=2, seed=1
        )
        assert len(asked.choices[0].logprobs.token_logprobs) == 3
        pieces = list(
            client.completions.create(model="agent", prompt="Once", max_tokens=4, stream=True)
        )
        assert {p.id for p in pieces} == {pieces[0].id}
        assert client.models.retrieve("agent").id == "agent"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("no-such-model")
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="agent", prompt="x", echo=True, max_tokens=2)
        assert refused.value.body["param"] == "echo"
        # The local engine serves the same routes, as vLLM does.
        direct = OpenAI(base_url=engine.url, api_key="unused", max_retries=0, timeout=120)
        assert direct.models.retrieve("tiny").id == "tiny"
        assert direct.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices[0].text

    logged = rows(db, "SELECT * FROM exchanges WHERE api = 'completions' ORDER BY ts")
    assert [r["id"] for r in logged] == [whole.id, asked.id, pieces[0].id]
    assert len({r["trajectory_id"] for r in logged}) == 3  # each a conversation of its own
    assert all(r["turn"] == 0 and r["prompt_token_ids"] for r in logged)
    assert [len(r["completion_token_ids"][0]) for r in logged] == [5, 3, 4]
    assert [len(r["completion_logprobs"][0]) for r in logged] == [5, 3, 4]
    assert json.loads(logged[0]["request"])["prompt"] == "Once upon"


def test_responses_stream_tool_calls_as_vllm_streams_them(tmp_path):
    """vLLM sends a call's id and name first, then its arguments in fragments: each becomes
    a `function_call` item and `function_call_arguments.delta` events, in order."""

    def delta(**fields) -> bytes:
        body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake"}
        body["choices"] = [{"index": 0, "delta": fields, "finish_reason": None}]
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    head = {"index": 0, "id": "call_9", "type": "function"}
    stream = (
        delta(role="assistant", content="Let me check.")
        + delta(tool_calls=[{**head, "function": {"name": "w", "arguments": ""}}])
        + delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}])
        + delta(tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}])
        + chunk(finish="tool_calls")
        + b"data: [DONE]\n\n"
    )
    app, _ = recording_app(tmp_path, answer=lambda body: streamed(stream))
    body = {
        "model": "agent",
        "input": "w?",
        "stream": True,
        "tools": [{"type": "function", "name": "w"}],
    }
    with TestClient(app) as client:
        resp = client.post("/v1/responses", json=body)
        events = [
            json.loads(line[5:]) for line in resp.text.splitlines() if line.startswith("data:")
        ]
        stored = client.get(f"/v1/responses/{events[0]['response']['id']}").json()
    kinds = [e["type"] for e in events]
    assert kinds[2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[-3]
    assert (done["name"], done["arguments"], done["output_index"]) == ("w", '{"city": "Paris"}', 1)
    final = events[-1]["response"]
    assert final["output"][1] == {
        "id": done["item_id"],
        "type": "function_call",
        "status": "completed",
        "call_id": "call_9",
        "name": "w",
        "arguments": '{"city": "Paris"}',
    }
    assert stored == final


def test_a_keys_store_false_responses_are_logged_but_never_judged_when_its_settings_say_so(
    tmp_path,
):
    from onjob.collector import Store
    from onjob.judge import JudgeSettings
    from onjob.judge.tables import turn_candidates

    keys = {"private": "sk-private", "open": "sk-open"}
    settings = ProxySettings(api_keys=keys, untrained_unstored_keys=["private"])
    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    app = create_app(
        settings,
        upstream=scripted(lambda r: httpx.Response(200, json=completion())),
        collector=collector,
    )
    sent = {}
    with TestClient(app) as client:
        for key, secret in keys.items():
            for store in (False, True):
                body = {"model": "agent", "input": f"{key} {store}", "store": store}
                resp = client.post(
                    "/v1/responses", json=body, headers={"Authorization": f"Bearer {secret}"}
                )
                assert resp.status_code == 200, resp.text
                sent[resp.json()["id"]] = (key, store)
    logged = {
        r["id"]: r["source"]
        for r in rows(tmp_path / "onjob.duckdb", "SELECT id, source FROM exchanges")
    }
    assert {sent[i]: source for i, source in logged.items()} == {
        ("private", False): "unstored",  # logged, kept out of learning
        ("private", True): "production",
        ("open", False): "production",  # store: false alone still teaches
        ("open", True): "production",
    }
    store = Store(tmp_path / "onjob.duckdb")
    try:
        judged = {c.id for c in turn_candidates(store, JudgeSettings())}
    finally:
        store.close()
    assert judged and all(sent[i] != ("private", False) for i in judged)


def _bounded_fields(schema: dict) -> dict[str, dict]:
    """The document's numeric bounds per field of a request schema."""
    out = {}
    for name, prop in schema["properties"].items():
        for option in prop.get("anyOf", [prop]):
            bounds = {k: option[k] for k in option if "imum" in k}
            if bounds:
                out[name] = bounds
    return out


@pytest.mark.parametrize(
    ("path", "schema_name", "base"),
    [
        ("/v1/chat/completions", "ChatCompletionRequest", CHAT),
        ("/v1/completions", "CompletionRequest", {"model": "agent", "prompt": "hi"}),
    ],
)
def test_the_documented_bounds_are_the_bounds_the_proxy_checks(tmp_path, path, schema_name, base):
    """`/openapi.json` and the hot path's checks are one declaration: every bound the
    document states is refused one step outside (a 400 naming the field, nothing sent to
    the engine) and accepted on the bound; a wrong type is refused the same way."""
    app, seen = recording_app(tmp_path, answer=lambda body: httpx.Response(200, json=completion()))
    with TestClient(app) as client:
        doc = client.get("/openapi.json").json()
        bounds = _bounded_fields(doc["components"]["schemas"][schema_name])
        assert {"temperature", "top_p", "n", "max_tokens"} <= set(bounds), bounds
        for field, limits in bounds.items():
            step = 1 if field in ("n", "max_tokens", "max_completion_tokens", "logprobs",
                                  "top_logprobs") else 0.25  # fmt: skip
            for key, value in limits.items():
                outside = value - step if "inimum" in key else value + step
                if key == "exclusiveMinimum":
                    outside = value
                sent = len(seen)
                resp = client.post(path, json={**base, field: outside})
                assert resp.status_code == 400, (field, key, outside, resp.text)
                assert resp.json()["error"]["param"] == field, resp.text
                assert len(seen) == sent, (field, "reached the engine")
                if key != "exclusiveMinimum":
                    ok = client.post(path, json={**base, field: value})
                    assert len(seen) == sent + 1, (field, value, ok.text)  # forwarded
        for field, wrong in (("temperature", "hot"), ("stream", "yes"), ("seed", True)):
            resp = client.post(path, json={**base, field: wrong})
            assert resp.status_code == 400 and resp.json()["error"]["param"] == field, resp.text


def test_the_proxy_and_the_engine_check_the_same_sampling_bounds(tmp_path):
    """One declaration (`onjob.protocol`): every bound the proxy documents and checks
    on a chat request is the engine's bound for that field, so the proxy never forwards a
    value the engine would refuse, nor refuses one it would take. `n` and `max_tokens` are
    the server's settings, not the protocol's."""
    import msgspec

    from onjob.protocol import ChatCompletionRequest

    app, _ = recording_app(tmp_path, answer=lambda body: httpx.Response(200, json=completion()))
    with TestClient(app) as client:
        proxy = _bounded_fields(
            client.get("/openapi.json").json()["components"]["schemas"]["ChatCompletionRequest"]
        )
    (_, defs) = msgspec.json.schema_components([ChatCompletionRequest])
    engine = _bounded_fields(defs["ChatCompletionRequest"])
    settings = {"n", "max_tokens", "max_completion_tokens"}
    shared = set(proxy) - settings
    assert {"temperature", "top_p", "top_logprobs", "presence_penalty"} <= shared, proxy
    assert {f: proxy[f] for f in shared} == {f: engine[f] for f in shared}
