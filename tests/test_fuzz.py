"""Bad input against onjob's HTTP API. schemathesis fuzzes a real `onjob serve` from the
OpenAPI document it serves; hypothesis throws hostile chat bodies (huge, deeply nested,
invalid UTF-8, wrong types, unknown fields, absurd `n` and `max_tokens`) at the app in
process. onjob answers none of them with a 5xx, refuses in OpenAI's error shape, lets no
request past its limits to the engine, and serves and logs on afterwards.

CI runs 30 examples per schemathesis case and 300 per hypothesis run (about 15 s);
`ONJOB_FUZZ_EXAMPLES=2000` runs a long session.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from litestar.testing import TestClient
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from onjob.cli.process import ServerProcess
from onjob.collector import Collector, CollectorSettings, Store
from onjob.protocol import MAX_DEPTH
from onjob.proxy import ProxySettings, create_app

from .conftest import admin_of
from .fake_engine import MODELS, chunk, completion, scripted

EXAMPLES = int(os.environ.get("ONJOB_FUZZ_EXAMPLES", "30"))
SECRET = "sk-fuzz-secret"
AUTH = {"Authorization": f"Bearer {SECRET}"}
MAX_N = 4
MAX_TOKENS = 1000
MAX_BODY = 64 * 1024


def stream_body() -> bytes:
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    return chunk("hi") + chunk(" there", finish="stop") + chunk(usage=usage) + b"data: [DONE]\n\n"


async def streamed():
    yield stream_body()  # a body httpx has not read yet, as an engine's stream is


def legacy_completion() -> dict:
    """A legacy text completion as vLLM sends it, token ids and logprobs on."""
    text = {"index": 0, "text": "hi", "finish_reason": "stop", "token_ids": [7]}
    text["logprobs"] = {"tokens": ["hi"], "token_logprobs": [-0.5]}
    answer = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "fake"}
    return {**answer, "choices": [text], "prompt_token_ids": [1]}


class VllmLike(BaseHTTPRequestHandler):
    """A fast engine on loopback that answers as vLLM does: its one model is `fake`, any
    other name (an adapter it has not loaded) is a 404; `n` choices; a stream when asked."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the proxy's connection pool expects

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.answer(200, "application/json", json.dumps(MODELS).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["model"] != "fake":
            message = f"The model `{body['model']}` does not exist."
            error = {"message": message, "type": "NotFoundError", "param": "model", "code": 404}
            self.answer(404, "application/json", json.dumps({"error": error}).encode())
        elif not self.path.endswith("/chat/completions"):  # a legacy text completion
            answer = legacy_completion()
            if body.get("stream"):
                payload = f"data: {json.dumps(answer)}\n\ndata: [DONE]\n\n".encode()
                self.answer(200, "text/event-stream", payload)
            else:
                self.answer(200, "application/json", json.dumps(answer).encode())
        elif body.get("stream"):
            self.answer(200, "text/event-stream", stream_body())
        else:
            answer = completion(n=body.get("n") or 1)
            self.answer(200, "application/json", json.dumps(answer).encode())

    def answer(self, status: int, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory):
    """The fuzzed server's database, spool and log."""
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def server(server_dir):
    engine = ThreadingHTTPServer(("127.0.0.1", 0), VllmLike)
    engine.daemon_threads = True
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    engine_url = f"http://127.0.0.1:{engine.server_address[1]}/v1"
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__API_KEYS": json.dumps({"fuzz": SECRET})}
    args = ["--engine-url", engine_url, "--db", str(server_dir / "onjob.duckdb")]
    try:
        with ServerProcess(args, env=env, log=server_dir / "server.log") as proc:
            yield proc
    finally:
        engine.shutdown()
        engine.server_close()


OPERATIONS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("GET", "/v1/responses/{response_id}/input_items"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model}"),
    ("POST", "/v1/feedback"),
    ("GET", "/health"),
]


@pytest.fixture(scope="module")
def api_schema(server):
    config = schemathesis.Config.from_dict(
        {"generation": {"with-security-parameters": False}}  # the key comes with every call
    )
    schema = schemathesis.openapi.from_url(
        f"{server.base}/openapi.json", config=config, headers=AUTH
    )
    served = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert served == set(OPERATIONS)  # a new route is fuzzed too once it is listed here
    return schema


# Bodies as the schema describes them, and (where there is a body) as it forbids them.
CASES = [
    (method, path, mode)
    for method, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if method == "POST" or mode is GenerationMode.POSITIVE
]


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_no_generated_request_gets_a_5xx_or_an_answer_outside_the_schema(
    api_schema, method, path, mode
):
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=api_schema[path][method].as_strategy(generation_mode=mode))
    def call(case) -> None:
        case.call_and_validate(
            headers=AUTH,
            timeout=30,
            checks=[
                not_a_server_error,
                status_code_conformance,
                content_type_conformance,
                response_schema_conformance,
            ],
        )

    call()


def test_the_fuzzed_server_still_serves_and_logs_everything(server, server_dir):
    chat = {"model": "agent", "messages": [{"role": "user", "content": "still there?"}]}
    reply = httpx.post(f"{server.url}/chat/completions", json=chat, headers=AUTH, timeout=30)
    assert reply.status_code == 200, reply.text
    # Feedback on an id the database does not know makes the server load its spool first.
    missing = {"exchange_id": "chatcmpl-none", "value": 1}
    assert httpx.post(f"{server.url}/feedback", json=missing, headers=AUTH).status_code == 404
    as_admin = admin_of(server)  # the counters are the admin key's alone
    collector = httpx.get(f"{server.base}/health", headers=as_admin).json()["collector"]
    assert collector["spooled"] >= 1 and collector["loaded"] == collector["spooled"]
    assert server.proc.poll() is None
    log = (server_dir / "server.log").read_text(errors="replace")
    assert "Traceback" not in log and "request failed" not in log, log[-4000:]


# --- hostile chat bodies, in process -------------------------------------------------------

CHAT = {"model": "agent", "messages": [{"role": "user", "content": "hi"}]}


def containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    containers,
    max_leaves=12,
)
VALID = {  # right types; `n` and `max_tokens` also beyond their bounds
    "n": st.integers(-3, 3 * MAX_N) | st.sampled_from([10**9, 2**64]),
    "max_tokens": st.integers(-3, 2 * MAX_TOKENS) | st.just(10**18),
    "max_completion_tokens": st.integers(-3, 2 * MAX_TOKENS),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "seed": st.integers(),
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3),
    "logprobs": st.booleans(),
    "tools": st.lists(st.fixed_dictionaries({"type": st.just("function")}), max_size=2),
    "tool_choice": st.sampled_from(["auto", "none"]),
    "metadata": st.dictionaries(st.sampled_from(["trajectory_id", "scenario", "x"]), json_values),
    "user": st.text(max_size=8),
}
# Tool-call arguments are JSON text the stitcher parses: some of it nested very deep.
arguments = (
    st.text()
    | json_values.map(json.dumps)
    | st.sampled_from([10, 10**5]).map(lambda depth: "[" * depth + "]" * depth)
)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.text(max_size=8),
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.text(max_size=8), "arguments": arguments}
            ),
        }
    ),
    max_size=2,
)
text_parts = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text()}), max_size=3
)
valid_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"])},
    optional={
        "content": st.text() | st.none() | text_parts,
        "name": st.text(max_size=8),
        "tool_call_id": st.text(max_size=8),
        "tool_calls": tool_calls,
    },
)
wrong_message = st.one_of(
    json_values,  # not an object
    st.builds(  # one field of the wrong type
        lambda message, key, value: {**message, key: value},
        valid_message,
        st.sampled_from(["role", "content", "name", "tool_call_id", "tool_calls"]),
        json_values,
    ),
    st.builds(  # a content part whose text is not text
        lambda message, value: {**message, "content": [{"type": "text", "text": value}]},
        valid_message,
        json_values,
    ),
    st.builds(  # a tool call whose function is not one
        lambda message, value: {**message, "tool_calls": [{"id": "c", "function": value}]},
        valid_message,
        json_values | st.fixed_dictionaries({"name": json_values, "arguments": json_values}),
    ),
)
# one_of draws its branches evenly: a right branch listed twice is drawn twice as often, so
# most bodies are valid but for one thing, and reach the code past the first refusal.
valid_messages = st.lists(valid_message, min_size=1, max_size=3)
messages = st.one_of(
    valid_messages, valid_messages, st.lists(valid_message | wrong_message, max_size=4), json_values
)
chat_bodies = st.builds(
    lambda model, msgs, common, wrong, unknown: {
        "model": model,
        "messages": msgs,
        **common,
        **wrong,
        **unknown,
    },
    st.one_of(st.just("agent"), st.just("fake"), st.sampled_from(["nope", ""]) | json_values),
    messages,
    st.fixed_dictionaries({}, optional=VALID),
    st.one_of(  # sometimes one field of the wrong type
        st.just({}),
        st.just({}),
        st.dictionaries(st.sampled_from(sorted(VALID)), json_values, min_size=1, max_size=1),
    ),
    st.dictionaries(  # fields onjob does not know: passed on
        st.text(max_size=10).filter(lambda k: k not in VALID and k not in CHAT),
        json_values,
        max_size=3,
    ),
)


def nested(depth: int, closed: bool) -> bytes:
    inner = b"[" * depth + (b"]" * depth if closed else b"")
    return b'{"model":"agent","messages":[{"role":"user","content":"x","deep":' + inner + b"}]}"


raw_bodies = st.one_of(
    json_values.map(lambda value: json.dumps(value).encode()),  # any JSON, mostly not an object
    st.builds(
        nested,
        st.sampled_from([10, MAX_DEPTH - 3, MAX_DEPTH, 200, 990, 5000, 10**5]),
        st.booleans(),
    ),
    st.binary(max_size=64).map(  # bytes that are not UTF-8, inside a string
        lambda junk: b'{"model":"agent","messages":[{"role":"user","content":"' + junk + b'"}]}'
    ),
    st.integers(1, 2 * MAX_BODY).map(  # up to twice the body limit
        lambda size: json.dumps(
            {**CHAT, "messages": [{"role": "user", "content": "x" * size}]}
        ).encode()
    ),
    st.binary(max_size=256),
    st.builds(  # pretty-printed, with any line break between tokens: one spool line still
        lambda body, brk, ascii: (
            json.dumps(body, indent=1, ensure_ascii=ascii).encode().replace(b"\n", brk)
        ),
        chat_bodies,
        st.sampled_from([b"\n", b"\r", b"\r\n", b"\n\n\t"]),
        st.booleans(),
    ),
    st.just(  # line and paragraph separators, raw inside strings (JSON allows them there)
        json.dumps(
            {
                **CHAT,
                "messages": [{"role": "user", "content": "a\u2028b\u2029c\u0085d"}],
                "x": "\u2028",
            },
            ensure_ascii=False,
        ).encode()
    ),
)


IN_PROCESS = settings(
    max_examples=EXAMPLES * 10,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def within_limits(body: dict) -> bool:
    def within(key: str, most: int) -> bool:
        value = body.get(key)
        return value is None or (type(value) is int and 1 <= value <= most)

    return (
        within("n", MAX_N)
        and within("max_tokens", MAX_TOKENS)
        and within("max_completion_tokens", MAX_TOKENS)
    )


def test_hostile_chat_bodies_get_200_or_an_openai_4xx_and_none_passes_the_limits(tmp_path):
    seen: list[dict] = []

    def engine(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if body.get("stream"):
            return httpx.Response(
                200, content=streamed(), headers={"Content-Type": "text/event-stream"}
            )
        return httpx.Response(200, json=completion(n=body.get("n") or 1))

    proxy = ProxySettings(max_n=MAX_N, max_tokens_limit=MAX_TOKENS, max_body_bytes=MAX_BODY)
    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    answered = []
    with TestClient(create_app(proxy, upstream=scripted(engine), collector=collector)) as client:

        def post(raw: bytes) -> None:
            reply = client.post("/v1/chat/completions", content=raw)
            assert reply.status_code == 200 or 400 <= reply.status_code < 500, reply.text
            if reply.status_code != 200:
                error = reply.json()["error"]
                assert set(error) == {"message", "type", "param", "code"}, error
                assert error["code"] == reply.status_code
            elif reply.headers["content-type"].startswith("application/json"):
                answered.append(reply.json()["id"])
            else:
                answered.append(reply.headers["X-Onjob-Exchange-Id"])

        @IN_PROCESS
        @given(chat_bodies)
        def chat_body(body: dict) -> None:
            post(json.dumps(body).encode())

        @IN_PROCESS
        @given(raw_bodies)
        def raw_body(raw: bytes) -> None:
            post(raw)

        chat_body()
        raw_body()
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert [body for body in seen if not within_limits(body)] == []
    assert [body for body in seen if type(body.get("stream")) not in (bool, type(None))] == []
    # Whatever was answered was logged, and loading it into DuckDB tripped on none of it.
    store = Store(tmp_path / "onjob.duckdb")
    try:
        logged = {row["id"] for row in store.dicts("SELECT id FROM exchanges")}
    finally:
        store.close()
    assert set(answered) < logged and len(logged) == len(answered) + 1


@pytest.mark.parametrize(
    ("field", "value", "status"),
    [
        ("n", MAX_N + 1, 400),
        ("n", 0, 400),
        ("n", True, 400),
        ("n", 1.5, 400),
        ("n", MAX_N, 200),
        ("max_tokens", MAX_TOKENS + 1, 400),
        ("max_tokens", -1, 400),
        ("max_completion_tokens", 10**30, 400),
        ("max_tokens", MAX_TOKENS, 200),
        ("stream", "yes", 400),
        ("temperature", "hot", 400),
        ("temperature", 0, 200),
        ("tools", {"type": "function"}, 400),
        ("stop", ["ok", 3], 400),
        ("metadata", [], 400),
        ("messages", [{"role": "user", "content": 42}], 400),
        ("messages", [{"role": "user", "content": [{"type": "text", "text": 1}]}], 400),
        ("messages", [{"role": "assistant", "tool_calls": {"id": "x"}}], 400),
        ("messages", [{"role": ["user"]}], 400),
        ("frobnicate", {"any": ["unknown", "field"]}, 200),
    ],
)
def test_each_bound_and_type_is_enforced_and_named(tmp_path, field, value, status):
    proxy = ProxySettings(max_n=MAX_N, max_tokens_limit=MAX_TOKENS)
    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    upstream = scripted(lambda request: httpx.Response(200, json=completion(n=MAX_N)))
    with TestClient(create_app(proxy, upstream=upstream, collector=collector)) as client:
        reply = client.post("/v1/chat/completions", json={**CHAT, field: value})
    assert reply.status_code == status, reply.text
    if status == 400:
        assert reply.json()["error"]["param"].startswith(field)


DEEP_ARGUMENTS = {
    **CHAT,
    "messages": [
        {"role": "user", "content": "list it"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "function": {"name": "f", "arguments": "[" * 10**5 + "]" * 10**5}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ],
}


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        (nested(MAX_DEPTH + 1, True), 400, f"deeper than {MAX_DEPTH}"),
        (nested(10**5, True), 400, f"deeper than {MAX_DEPTH}"),
        (nested(10**5, False), 400, f"deeper than {MAX_DEPTH}"),
        (b'{"model":"agent","messages":[{"role":"user","content":"\xff\xfe"}]}', 400, "UTF-8"),
        (b'{"model":"agent","messages":[{"role":"user","content":"\\ud800"}]}', 400, "Malformed"),
        (
            b'{"model":"agent","messages":[{"role":"user","content":"x"}],"n":1e999}',
            400,
            "Malformed",
        ),
        # Text, however deep the JSON inside it: the stitcher keeps it as it is.
        (json.dumps(DEEP_ARGUMENTS).encode(), 200, "chat.completion"),
    ],
)
def test_deep_nesting_and_bad_encodings_are_refused_not_500(tmp_path, raw, status, fragment):
    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    upstream = scripted(lambda request: httpx.Response(200, json=completion()))
    with TestClient(create_app(ProxySettings(), upstream=upstream, collector=collector)) as client:
        reply = client.post("/v1/chat/completions", content=raw)
        assert reply.status_code == status, reply.text
        assert fragment in reply.text
        ok = client.post("/v1/chat/completions", content=nested(MAX_DEPTH - 3, True))
        assert ok.status_code == 200, ok.text


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


ROUTES_BODIES = {  # route: a body with `deep` placed where the route's own fields can nest
    "/v1/chat/completions": lambda deep: (
        b'{"model":"agent","messages":[{"role":"user","content":"x"}],"deep":' + deep + b"}"
    ),
    "/v1/completions": lambda deep: b'{"model":"agent","prompt":"x","deep":' + deep + b"}",
    "/v1/responses": lambda deep: (
        b'{"model":"agent","input":[{"role":"user","content":"x","deep":' + deep + b"}]}"
    ),
}


@pytest.mark.parametrize("route", list(ROUTES_BODIES))
def test_every_openai_route_refuses_the_same_depth(tmp_path, route):
    def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):
            return httpx.Response(200, json=completion())
        return httpx.Response(200, json=legacy_completion())

    body = ROUTES_BODIES[route]
    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    app = create_app(ProxySettings(), upstream=scripted(engine), collector=collector)
    with TestClient(app) as client:
        for depth in (MAX_DEPTH + 1, 10**5):
            reply = client.post(route, content=body(_deep(depth)))
            assert reply.status_code == 400, reply.text
            assert f"deeper than {MAX_DEPTH}" in reply.json()["error"]["message"]
        within = client.post(route, content=body(_deep(MAX_DEPTH - 4)))
        assert within.status_code == 200, within.text
        # Feedback's and the admin API's bodies are typed: a field they do not know, deep
        # or not, is refused before it is walked (msgspec's `forbid_unknown_fields`).
        deep = b'{"exchange_id":"x","deep":' + _deep(10**5) + b"}"
        reply = client.post("/v1/feedback", content=deep)
        assert reply.status_code == 400 and "unknown field" in reply.text


DUPLICATED = [  # (route, body, the key named)
    (
        "/v1/chat/completions",
        b'{"model":"agent","messages":[{"role":"user","content":"FIRST m"}],'
        b'"messages":[{"role":"user","content":"SECOND m"}]}',
        "messages",
    ),
    (
        "/v1/chat/completions",
        b'{"model":"agent","messages":[{"role":"user","content":"FIRST","content":"SECOND"}]}',
        "content",
    ),
    (
        "/v1/chat/completions",
        b'{"model":"agent","messages":[{"role":"user","content":"x"},{"role":"assistant",'
        b'"tool_calls":[{"id":"c","type":"function","function":{"name":"a","name":"b",'
        b'"arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]}',
        "name",
    ),
    (
        "/v1/chat/completions",
        b'{"model":"agent","messages":[{"role":"user","content":"x"}],'
        b'"metadata":{"trajectory_id":"a" , "trajectory_id"\n:"b"}}',
        "trajectory_id",
    ),
    (  # the second value hidden behind a colon written as an escape
        "/v1/chat/completions",
        b'{"model":"agent","messages":[{"role":"user","content":"a\\u003ab"}],"model":"other"}',
        "model",
    ),
    ("/v1/completions", b'{"model":"agent","prompt":"FIRST","prompt":"SECOND"}', "prompt"),
    ("/v1/responses", b'{"model":"agent","input":"FIRST","input":"SECOND"}', "input"),
]


@pytest.mark.parametrize(("route", "raw", "key"), DUPLICATED)
def test_a_key_sent_twice_is_refused_naming_it_before_the_engine_sees_anything(
    tmp_path, route, raw, key
):
    seen = []

    def engine(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion())

    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    app = create_app(ProxySettings(), upstream=scripted(engine), collector=collector)
    with TestClient(app) as client:
        reply = client.post(route, content=raw)
    assert reply.status_code == 400, reply.text
    assert f"The key `{key}` appears twice" in reply.json()["error"]["message"]
    assert not seen


ONE_READING = [  # bodies whose colons mislead a count, each key once: answered as sent
    b'{"model":"agent","messages":[{"role":"user","content":"a \\u003a b"}]}',
    b'{"model":"agent","messages":[{"role":"user","content":"x: \\": y","name\\\\":"n"}]}',
    b'{"model":"agent","messages":[{"role":"user","content":"see http://x.example/a:b"},'
    b'{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f",'
    b'"arguments":"{\\"a\\": \\"1:2\\"}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]}',
    b'{\n "model" : "agent",\n "messages" : [ { "role" :\t"user" , "content" : "x" } ]\n}',
]


@pytest.mark.parametrize("raw", ONE_READING)
def test_what_the_engine_saw_is_what_the_log_shows(tmp_path, raw):
    seen = []

    def engine(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=completion())

    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    app = create_app(ProxySettings(), upstream=scripted(engine), collector=collector)
    with TestClient(app) as client:
        reply = client.post("/v1/chat/completions", content=raw)
        assert reply.status_code == 200, reply.text
    [sent] = seen
    store = Store(tmp_path / "onjob.duckdb")
    try:
        [row] = store.dicts(
            "SELECT request->>'$.messages[0].content' AS first, "
            "json_extract(request, '$.messages') AS messages FROM exchanges_full"
        )
    finally:
        store.close()
    assert row["first"] == sent["messages"][0]["content"]
    assert json.loads(row["messages"]) == sent["messages"]


# -- The engine side: whatever the engine answers, the client gets it or a 502, and the
# exchange is logged with the status the client got.

ANSWER_PATHS = [  # where a broken engine breaks a whole answer (the proxy reads each)
    ("choices",),
    ("choices", 0),
    ("choices", 0, "index"),
    ("choices", 0, "message"),
    ("choices", 0, "message", "content"),
    ("choices", 0, "message", "role"),
    ("choices", 0, "message", "tool_calls"),
    ("choices", 0, "token_ids"),
    ("choices", 0, "token_ids", 0),
    ("choices", 0, "logprobs"),
    ("choices", 0, "logprobs", "content", 0, "logprob"),
    ("choices", 0, "finish_reason"),
    ("prompt_token_ids",),
    ("prompt_token_ids", 0),
    ("usage",),
    ("usage", "completion_tokens"),
    ("model",),
    ("created",),
]
CHUNK_PATHS = [tuple("delta" if p == "message" else p for p in path) for path in ANSWER_PATHS] + [
    ("choices", 0, "delta", "tool_calls", 0, "function", "arguments")
]
engine_values = (
    json_values
    | st.sampled_from([2**31, 2**40, -1, -(2**63), 10**30, 1e308, "7", [1, "2"], ["a"]])
    | st.lists(st.integers(-(2**40), 2**40), max_size=3)
)


def mutated(value: dict, path: tuple, new) -> dict:
    """`value` with the field at `path` set to `new`; where the path leads through something
    that is no container of the kind (a list where a key was wanted), that is replaced."""
    value = json.loads(json.dumps(value))
    at = value
    for key, after in itertools.pairwise(path):
        fresh = {} if isinstance(after, str) else [{}]
        if isinstance(at, list):
            at = at[key] if key < len(at) and isinstance(at[key], dict | list) else fresh
        else:
            if not isinstance(at.get(key), dict | list):
                at[key] = fresh
            at = at[key]
    last = path[-1]
    if isinstance(at, list):
        at[last if last < len(at) else 0 :] = [new]
    else:
        at[last] = new
    return value


def test_a_broken_engine_answer_is_relayed_or_a_502_and_always_logged(tmp_path):
    answers: list[bytes] = []

    def engine(request: httpx.Request) -> httpx.Response:
        body = answers.pop()
        if json.loads(request.content).get("stream"):

            async def unread():  # as an engine's stream is: not read yet
                yield body

            headers = {"Content-Type": "text/event-stream"}
            return httpx.Response(200, content=unread(), headers=headers)
        return httpx.Response(200, content=body, headers={"Content-Type": "application/json"})

    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    got: dict[str, int] = {}  # exchange id: the status the client got
    with TestClient(
        create_app(ProxySettings(), upstream=scripted(engine), collector=collector)
    ) as client:

        def ask(body: bytes, stream: bool) -> None:
            answers.append(body)
            reply = client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
            assert reply.status_code in (200, 502), reply.text
            exchange = reply.headers["X-Onjob-Exchange-Id"]
            if stream:
                assert reply.status_code == 200
                events = [e for e in reply.text.split("\n\n") if e]
                ended = events[-1] == "data: [DONE]"
                assert ended or '"error"' in events[-1], reply.text
                got[exchange] = 200 if ended else 502
            else:
                if reply.status_code == 502:
                    assert "engine" in reply.json()["error"]["message"]
                got[exchange] = reply.status_code

        # A logprob past float32's range (the column's type) once refused its whole spool line.
        huge_logprob = (("choices", 0, "logprobs", "content", 0, "logprob"), 1e308)

        @IN_PROCESS
        @given(st.sampled_from(ANSWER_PATHS), engine_values)
        @example(*huge_logprob)
        def whole(path: tuple, value) -> None:
            ask(json.dumps(mutated(completion(), path, value)).encode(), stream=False)

        @IN_PROCESS
        @given(st.sampled_from(CHUNK_PATHS), engine_values)
        @example(*huge_logprob)
        def one_event(path: tuple, value) -> None:
            broken = json.loads(chunk(" there")[len(b"data: ") :])
            body = chunk("hi") + b"data: " + json.dumps(mutated(broken, path, value)).encode()
            usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
            ask(body + b"\n\n" + chunk(usage=usage) + b"data: [DONE]\n\n", stream=True)

        @IN_PROCESS
        @given(st.integers(0, len(json.dumps(completion())) - 1), st.booleans())
        def truncated(size: int, stream: bool) -> None:
            whole_ = json.dumps(completion()).encode()
            ask(stream_body()[: size % len(stream_body())] if stream else whole_[:size], stream)

        whole()
        one_event()
        truncated()
    store = Store(tmp_path / "onjob.duckdb")
    try:
        logged = {r["id"]: r["status"] for r in store.dicts("SELECT id, status FROM exchanges")}
    finally:
        store.close()
    assert logged == got
    assert 502 in got.values() and 200 in got.values()
