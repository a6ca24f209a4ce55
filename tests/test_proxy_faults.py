"""The proxy in process (Litestar's test client), with the engine scripted at the HTTP
boundary: every fault has a defined answer in OpenAI's shape, and nothing is lost."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from litestar.testing import TestClient

from onjob.cli.process import free_port
from onjob.collector import Collector, CollectorSettings, Store
from onjob.proxy import ProxySettings, create_app
from onjob.proxy.lean import LeanUpstream
from onjob.proxy.upstream import Upstream

from .fake_engine import (
    RawEngine,
    chunk,
    completion,
    scripted,
    send_chunk,
    send_chunked_head,
)

CHAT = {"model": "agent", "messages": [{"role": "user", "content": "hi"}]}
# The client that speaks to a real socket (the proxy's one engine client).
SOCKET_CLIENTS = pytest.mark.parametrize("client_kind", [LeanUpstream])


def app_for(tmp_path, upstream: Upstream, tracer=None, **proxy):
    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    return create_app(ProxySettings(**proxy), upstream=upstream, collector=collector, tracer=tracer)


def rows(tmp_path, sql: str) -> list[dict]:
    store = Store(tmp_path / "onjob.duckdb")
    try:
        return store.dicts(sql)
    finally:
        store.close()


def assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["message"]
    return error


def stream_until_error(http) -> tuple[str, openai.APIError]:
    """A streamed chat request through the `openai` client that must end in an error: the
    text heard before it, and the error."""
    client = openai.OpenAI(
        base_url="http://testserver.local/v1", api_key="x", http_client=http, max_retries=0
    )
    heard = []
    with pytest.raises(openai.APIError) as raised:
        for c in client.chat.completions.create(
            model="agent", messages=CHAT["messages"], stream=True
        ):
            heard.append(c.choices[0].delta.content or "")
    return "".join(heard), raised.value


def ok_engine(seen: list | None = None):
    def chat(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if seen is not None:
            seen.append(body)
        return httpx.Response(200, json=completion(n=body.get("n", 1)))

    return scripted(chat)


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(tmp_path):
    with TestClient(app_for(tmp_path, ok_engine(), max_body_bytes=4096)) as client:
        post = client.post
        error = assert_openai_error(post("/v1/chat/completions", content=b"{not json"), 400)
        assert "Malformed JSON" in error["message"]
        assert_openai_error(post("/v1/chat/completions", json=[1, 2]), 400)
        error = assert_openai_error(post("/v1/chat/completions", json={"model": "agent"}), 400)
        assert error["param"] == "messages"
        assert_openai_error(post("/v1/chat/completions", json={**CHAT, "metadata": 3}), 400)
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 10_000}]}
        assert_openai_error(post("/v1/chat/completions", json=big), 413)
        error = assert_openai_error(post("/v1/chat/completions", json={**CHAT, "model": "x"}), 404)
        assert "agent" in error["message"] and error["param"] == "model"
        assert post("/v1/chat/completions", json=CHAT).status_code == 200
    # Requests that never reached the engine are not exchanges; the good one is logged.
    assert [r["status"] for r in rows(tmp_path, "SELECT status FROM exchanges")] == [200]


@SOCKET_CLIENTS
def test_engine_unreachable_is_502_and_the_failed_exchange_is_logged(tmp_path, client_kind):
    upstream = client_kind(f"http://127.0.0.1:{free_port()}/v1", connect_timeout=2)
    with TestClient(app_for(tmp_path, upstream)) as client:
        error = assert_openai_error(client.post("/v1/chat/completions", json=CHAT), 502)
        assert "cannot reach the engine" in error["message"]
        # /v1/models still lists the configured aliases.
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["agent"]


def test_failed_exchange_after_discovery_is_logged_and_not_a_turn(tmp_path):
    calls = []

    def chat(request):
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json=completion())

    with TestClient(app_for(tmp_path, scripted(chat))) as client:
        assert_openai_error(client.post("/v1/chat/completions", json=CHAT), 502)
        retry = client.post("/v1/chat/completions", json=CHAT)
        assert retry.status_code == 200
    logged = rows(tmp_path, "SELECT status, error, turn, trajectory_id FROM exchanges ORDER BY ts")
    assert [r["status"] for r in logged] == [502, 200]
    assert "cannot reach the engine" in logged[0]["error"]
    # The retry is turn 0 of a conversation; the failed attempt made no trajectory.
    assert logged[1]["turn"] == 0
    trajectories = rows(tmp_path, "SELECT id, n_turns FROM trajectories")
    assert trajectories == [{"id": logged[1]["trajectory_id"], "n_turns": 1}]


def silent(conn, body):
    time.sleep(5)


@SOCKET_CLIENTS
@pytest.mark.parametrize("stream", [False, True])
def test_engine_that_goes_silent_is_504(tmp_path, stream, client_kind):
    engine = RawEngine(silent)
    try:
        upstream = client_kind(engine.url, read_timeout=0.5)
        with TestClient(app_for(tmp_path, upstream)) as client:
            resp = client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
            error = assert_openai_error(resp, 504)
            assert "in time" in error["message"]
    finally:
        engine.close()
    logged = rows(tmp_path, "SELECT id, status FROM exchanges")
    assert [r["status"] for r in logged] == [504]
    assert resp.headers["X-Onjob-Exchange-Id"] == logged[0]["id"]  # the client can refer to it


def test_engine_timeout_through_httpx_is_504(tmp_path):
    def chat(request):
        raise httpx.ReadTimeout("slow", request=request)

    with TestClient(app_for(tmp_path, scripted(chat))) as client:
        assert_openai_error(client.post("/v1/chat/completions", json=CHAT), 504)


def test_engine_error_status_is_passed_on(tmp_path):
    answers = [
        httpx.Response(
            400,
            json={
                "error": {"message": "context too long", "type": "x", "param": None, "code": 400}
            },
        ),
        httpx.Response(503, text="<html>overloaded</html>", headers={"Content-Type": "text/html"}),
    ]

    with TestClient(app_for(tmp_path, scripted(lambda r: answers.pop(0)))) as client:
        first = client.post("/v1/chat/completions", json=CHAT)
        assert assert_openai_error(first, 400)["message"] == "context too long"
        assert first.headers["X-Onjob-Exchange-Id"].startswith("chatcmpl-")
        error = assert_openai_error(client.post("/v1/chat/completions", json=CHAT), 503)
        assert "overloaded" in error["message"]
    logged = rows(tmp_path, "SELECT status FROM exchanges ORDER BY ts")
    assert [r["status"] for r in logged] == [400, 503]


def test_engine_garbage_is_502(tmp_path):
    def chat(request):
        return httpx.Response(200, content=b"this is not json")

    with TestClient(app_for(tmp_path, scripted(chat))) as client:
        error = assert_openai_error(client.post("/v1/chat/completions", json=CHAT), 502)
        assert "not a chat completion" in error["message"]


async def _cut_after_two(request):
    yield b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"fake",'
    yield b'"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    yield chunk("Hello")
    yield chunk(" wor")
    raise httpx.ReadError("connection reset by peer")


def cut_by_httpx():
    return scripted(
        lambda r: httpx.Response(
            200, headers={"Content-Type": "text/event-stream"}, content=_cut_after_two(r)
        )
    ), None


def _cut(conn, body):
    send_chunked_head(conn)
    send_chunk(conn, chunk("Hello"))
    send_chunk(conn, chunk(" wor"))
    conn.close()  # no terminating chunk: the body is incomplete


def cut_by_socket():
    engine = RawEngine(_cut)
    return LeanUpstream(engine.url), engine


@pytest.mark.parametrize("make", [cut_by_httpx, cut_by_socket], ids=["httpx", "lean"])
def test_stream_cut_by_engine_returns_error_event_and_logs_partial(tmp_path, make):
    upstream, engine = make()
    try:
        with TestClient(app_for(tmp_path, upstream)) as http:
            received, error = stream_until_error(http)
            assert "cut" in str(error)
            assert received == "Hello wor"
            # The server is still there.
            assert http.get("/health").status_code == 200
    finally:
        if engine:
            engine.close()
    (row,) = rows(tmp_path, "SELECT status, error, response, completion_token_ids FROM exchanges")
    assert row["status"] == 502 and "cut" in row["error"]
    assert json.loads(row["response"])["choices"][0]["message"]["content"] == "Hello wor"
    assert row["completion_token_ids"] == [[42, 42]]


def test_logprobs_token_ids_and_usage_reach_the_client_only_when_asked(tmp_path):
    seen: list[dict] = []

    async def stream(request):
        yield chunk("a")
        yield chunk("b", finish="stop")
        yield chunk(usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7})
        yield b"data: [DONE]\n\n"

    def chat(request):
        body = json.loads(request.content)
        seen.append(body)
        if body.get("stream"):
            return httpx.Response(
                200, headers={"Content-Type": "text/event-stream"}, content=stream(request)
            )
        return httpx.Response(200, json=completion(n=body.get("n", 1)))

    with TestClient(app_for(tmp_path, scripted(chat))) as client:
        plain = client.post(
            "/v1/chat/completions", json={**CHAT, "metadata": {"scenario": "s1"}, "n": 2}
        ).json()
        asked = client.post(
            "/v1/chat/completions", json={**CHAT, "logprobs": True, "return_token_ids": True}
        ).json()
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
        ) as resp:
            streamed = [json.loads(x[6:]) for x in resp.iter_lines() if x.startswith("data: {")]

    # The engine was always asked for logprobs and token ids, under the engine's model name.
    assert all(b["logprobs"] and b["return_token_ids"] and b["model"] == "fake" for b in seen)
    assert "metadata" not in seen[0]
    assert seen[2]["stream_options"] == {"include_usage": True}
    assert len(plain["choices"]) == 2
    assert all(c["logprobs"] is None and "token_ids" not in c for c in plain["choices"])
    assert "prompt_token_ids" not in plain and plain["model"] == "agent"
    assert asked["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5
    assert asked["choices"][0]["token_ids"] == [7, 8, 9] and asked["prompt_token_ids"]
    assert streamed[-1]["usage"]["total_tokens"] == 7
    assert all(c["id"] == streamed[0]["id"] for c in streamed)

    logged = rows(
        tmp_path,
        "SELECT id, prompt_token_ids, completion_token_ids, completion_logprobs, usage, "
        "json_extract_string(metadata, '$.scenario') AS scenario FROM exchanges ORDER BY ts",
    )
    assert [r["id"] for r in logged] == [plain["id"], asked["id"], streamed[0]["id"]]
    assert logged[0]["completion_token_ids"] == [[7, 8, 9], [7, 8, 9]]
    assert logged[0]["completion_logprobs"][1] == [-0.5, -1.0, -1.5]
    assert logged[0]["prompt_token_ids"] == [1, 2, 3, 4, 5] and logged[0]["scenario"] == "s1"
    assert logged[2]["completion_token_ids"] == [[42, 42]]
    assert json.loads(logged[2]["usage"])["total_tokens"] == 7


def test_stream_options_never_reach_the_engine_on_a_request_that_is_not_streamed(tmp_path):
    """vLLM refuses `stream_options` without `stream: true` (its request validator's
    message below), and some clients send them on every request."""
    seen: list[dict] = []

    def vllm_chat(request):
        body = json.loads(request.content)
        seen.append(body)
        if body.get("stream_options") and not body.get("stream"):
            message = "Stream options can only be defined when `stream=True`."
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return httpx.Response(400, json={"error": error})
        return httpx.Response(200, json=completion())

    usage = {"stream_options": {"include_usage": True}}
    with TestClient(app_for(tmp_path, scripted(vllm_chat))) as client:
        for body in ({**CHAT, **usage}, {**CHAT, **usage, "stream": False}):
            resp = client.post("/v1/chat/completions", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["total_tokens"] == 8
    assert len(seen) == 2 and not any("stream_options" in b for b in seen)
    statuses = rows(tmp_path, "SELECT status FROM exchanges")
    assert [r["status"] for r in statuses] == [200, 200]


def test_api_keys_are_required_and_recorded(tmp_path):
    keys = {"billing-bot": "sk-billing", "support-bot": "sk-support"}
    with TestClient(app_for(tmp_path, ok_engine(), api_keys=keys)) as client:
        missing = client.post("/v1/chat/completions", json=CHAT)
        assert assert_openai_error(missing, 401)["type"] == "authentication_error"
        wrong = {"Authorization": "Bearer sk-nope"}
        assert_openai_error(client.post("/v1/chat/completions", json=CHAT, headers=wrong), 401)
        assert_openai_error(client.get("/v1/models"), 401)
        good = {"Authorization": "Bearer sk-support"}
        answer = client.post("/v1/chat/completions", json=CHAT, headers=good)
        assert answer.status_code == 200
        exchange_id = answer.json()["id"]
        fb = {"exchange_id": exchange_id, "value": 1}
        assert_openai_error(client.post("/v1/feedback", json=fb), 401)
        assert client.post("/v1/feedback", json=fb, headers=good).status_code == 200
    assert rows(tmp_path, "SELECT api_key_id FROM exchanges") == [{"api_key_id": "support-bot"}]
    assert rows(tmp_path, "SELECT api_key_id FROM feedback") == [{"api_key_id": "support-bot"}]


def test_feedback_checks_what_it_points_at(tmp_path):
    with TestClient(app_for(tmp_path, ok_engine())) as client:
        answer = client.post("/v1/chat/completions", json=CHAT)
        exchange_id = answer.headers["X-Onjob-Exchange-Id"]
        assert exchange_id == answer.json()["id"]
        # Posted right away: the exchange may still be in the spool, not yet in DuckDB.
        fb = client.post("/v1/feedback", json={"exchange_id": exchange_id, "value": 0.5})
        assert fb.status_code == 200 and fb.json()["trajectory_id"].startswith("traj_")
        by_trajectory = {"trajectory_id": fb.json()["trajectory_id"], "value": -1, "comment": "no"}
        assert client.post("/v1/feedback", json=by_trajectory).status_code == 200
        assert_openai_error(client.post("/v1/feedback", json={"value": 1}), 400)
        assert_openai_error(client.post("/v1/feedback", json={"exchange_id": exchange_id}), 400)
        unknown = client.post("/v1/feedback", json={"exchange_id": "chatcmpl-nope", "value": 1})
        assert assert_openai_error(unknown, 404)["param"] == "exchange_id"
        unknown = client.post("/v1/feedback", json={"trajectory_id": "traj_nope", "value": 1})
        assert_openai_error(unknown, 404)
    logged = rows(tmp_path, "SELECT exchange_id, value, comment FROM feedback ORDER BY ts")
    assert logged == [
        {"exchange_id": exchange_id, "value": 0.5, "comment": None},
        {"exchange_id": None, "value": -1.0, "comment": "no"},
    ]


def test_one_span_per_request_with_genai_attributes(tmp_path):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    calls = []

    def chat(request):
        calls.append(1)
        if len(calls) == 2:
            return httpx.Response(500, json={"error": {"message": "boom"}})
        return httpx.Response(200, json=completion())

    with TestClient(app_for(tmp_path, scripted(chat), tracer=tracer)) as client:
        ok = client.post("/v1/chat/completions", json={**CHAT, "temperature": 0.5}).json()
        client.post("/v1/chat/completions", json=CHAT)
    spans = exporter.get_finished_spans()
    assert len(spans) == 2
    attrs = spans[0].attributes
    assert spans[0].name == "chat agent"
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "agent"
    assert attrs["gen_ai.response.model"] == "fake"
    assert attrs["gen_ai.response.id"] == ok["id"]
    assert attrs["gen_ai.request.temperature"] == 0.5
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (5, 3)
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert spans[0].end_time > spans[0].start_time
    assert spans[1].attributes["error.type"] == "500"
    assert not spans[1].status.is_ok


def test_hot_routes_answer_as_litestar_routes_do(tmp_path):
    """`POST /v1/chat/completions` is answered in front of Litestar (`proxy/front.py`); the
    same path with a trailing slash goes through Litestar's router to the same handler.
    Both answer alike: status, headers, body, for answers, streams and each kind of error."""

    def engine(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content).get("stream"):

            async def events():
                yield chunk("hi", finish="stop") + b"data: [DONE]\n\n"

            return httpx.Response(200, content=events())
        return httpx.Response(200, json=completion())

    app = app_for(tmp_path, scripted(engine), api_keys={"k1": "secret"}, max_body_bytes=4096)
    key = {"Authorization": "Bearer secret"}
    cases = [
        (json.dumps(CHAT), key),
        (json.dumps({**CHAT, "stream": True}), key),
        (json.dumps(CHAT), {}),  # 401
        ("{not json", key),  # 400
        (json.dumps({**CHAT, "n": 99}), key),  # 400 naming the field
        (json.dumps({**CHAT, "pad": "x" * 5000}), key),  # 413: past max_body_bytes
    ]
    varying = {"x-onjob-exchange-id", "date"}
    with TestClient(app) as client:
        for body, headers in cases:
            answers = []
            for path in ("/v1/chat/completions", "/v1/chat/completions/"):
                r = client.post(path, content=body, headers={**headers, "Content-Type": "x"})
                shown = {k: v for k, v in r.headers.items() if k not in varying}
                text = r.text.replace(r.headers.get("x-onjob-exchange-id", "-"), "ID")
                answers.append((r.status_code, shown, text))
            assert answers[0] == answers[1], body[:40]
            assert answers[0][0] in (200, 400, 401, 413)


# -- The engine client refuses what h11 refuses (issue 34) ----------------------------------


def _dripping(conn, body: bytes) -> None:
    """A whole answer one byte every 0.1 s: never silent for the read timeout."""
    payload = json.dumps(completion()).encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
    conn.sendall(b"Content-Length: %d\r\n\r\n" % len(payload))
    for byte in payload:
        time.sleep(0.1)
        try:
            conn.sendall(bytes([byte]))
        except OSError:
            return


def _oversize(conn, body: bytes) -> None:
    payload = json.dumps(completion(content="x" * 200_000)).encode()
    try:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        conn.sendall(b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
    except OSError:
        pass


def _two_answers(conn, body: bytes) -> None:
    first = json.dumps(completion(content="first")).encode()
    second = json.dumps(completion(content="second")).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    conn.sendall(head % len(first) + first + head % len(second) + second)


@pytest.mark.parametrize(
    ("client_kind", "behaviour", "status", "words"),
    [
        (LeanUpstream, _dripping, 504, "within 1 s"),
        (LeanUpstream, _oversize, 502, "larger than 100000 bytes"),
        (LeanUpstream, _two_answers, 502, "after its complete answer"),
    ],
    ids=["lean-drip", "lean-oversize", "lean-pipelined"],
)
def test_engine_client_faults_are_openai_errors_and_logged_failures(
    tmp_path, client_kind, behaviour, status, words
):
    engine = RawEngine(behaviour)
    try:
        upstream = client_kind(
            engine.url, read_timeout=0.5, answer_timeout=1.0, max_answer_bytes=100_000
        )
        with TestClient(app_for(tmp_path, upstream)) as client:
            resp = client.post("/v1/chat/completions", json=CHAT)
            error = assert_openai_error(resp, status)
            assert words in error["message"]
    finally:
        engine.close()
    logged = rows(tmp_path, "SELECT id, status, error, response FROM exchanges")
    assert [r["status"] for r in logged] == [status]
    assert words in logged[0]["error"]
    assert "second" not in logged[0]["response"]  # nothing of a second answer is kept
    assert resp.headers["X-Onjob-Exchange-Id"] == logged[0]["id"]


@SOCKET_CLIENTS
def test_a_stream_past_max_answer_bytes_ends_with_an_error_event_and_is_logged(
    tmp_path, client_kind
):
    def endless(conn, body):
        send_chunked_head(conn)
        try:
            for _ in range(10_000):
                send_chunk(conn, chunk("word "))
        except OSError:
            pass

    engine = RawEngine(endless)
    try:
        upstream = client_kind(engine.url, read_timeout=2, max_answer_bytes=50_000)
        with TestClient(app_for(tmp_path, upstream)) as client:
            resp = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    finally:
        engine.close()
    assert resp.status_code == 200
    events = [line for line in resp.text.split("\n\n") if line]
    assert (
        "larger than 50000 bytes"
        in json.loads(events[-1].removeprefix("data: "))["error"]["message"]
    )
    (logged,) = rows(tmp_path, "SELECT status, error FROM exchanges")
    assert logged["status"] == 502 and "max_answer_bytes" in logged["error"]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_more_messages_than_max_messages_is_a_400_naming_it(tmp_path, api):
    seen = []
    many = [{"role": "user", "content": "ab"}] * 11
    if api == "chat":
        path, body, param = "/v1/chat/completions", {**CHAT, "messages": many}, "messages"
    else:
        path, body, param = "/v1/responses", {"model": "agent", "input": many}, "input"
    with TestClient(app_for(tmp_path, ok_engine(seen), max_messages=10)) as client:
        error = assert_openai_error(client.post(path, json=body), 400)
        assert error["param"] == param and "at most 10" in error["message"]
        short = {**body, param: many[:10]}
        assert client.post(path, json=short).status_code == 200
    assert [len(b["messages"]) for b in seen] == [10]  # the refused one never reached it
