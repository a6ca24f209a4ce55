"""Bad requests get OpenAI-shaped errors with the right status, and the engine keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

from .test_engine_api import HELLO


def post(engine, body, **kw) -> httpx.Response:
    return httpx.post(f"{engine.url}/chat/completions", timeout=60, **kw, **body)


def assert_openai_error(r: httpx.Response, status: int, *fragments: str) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    for fragment in fragments:
        assert fragment in error["message"]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=2)
    assert "no-such-model" in info.value.message
    assert info.value.body["type"] == "not_found_error"


def test_prompt_longer_than_the_context_is_400(client):
    long = [{"role": "user", "content": "word " * 1500}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=long, max_tokens=2)
    assert "maximum context length is 1024" in info.value.message


def test_completion_that_would_overflow_the_context_is_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=5000)
    assert "in the completion" in info.value.message


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"content": b"{not json"}, "Malformed JSON"),
        ({"content": b""}, "Malformed JSON"),
        (
            {"content": b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff"}]}'},
            "UTF-8",
        ),
        ({"json": {"messages": HELLO}}, "model"),
        ({"json": {"model": "tiny"}}, "messages"),
        ({"json": {"model": "tiny", "messages": []}}, "messages"),
        ({"json": {"model": "tiny", "messages": HELLO, "n": "two"}}, "`n`"),
        ({"json": {"model": "tiny", "messages": HELLO, "n": 0}}, "`n`"),
        ({"json": {"model": "tiny", "messages": HELLO, "temperature": 7}}, "`temperature`"),
        ({"json": {"model": "tiny", "messages": HELLO, "max_tokens": -1}}, "`max_tokens`"),
        ({"json": {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}}, "role"),
        ({"json": {"model": "tiny", "messages": HELLO, "top_logprobs": 2}}, "logprobs"),
        ({"json": [1, 2, 3]}, "Expected `object`"),
    ],
)
def test_malformed_bodies_are_400(engine, body, fragment):
    assert_openai_error(post(engine, body), 400, fragment)


def test_unknown_fields_are_ignored_like_openai(engine):
    r = post(engine, {"json": {"model": "tiny", "messages": HELLO, "max_tokens": 2, "foo": 1}})
    assert r.status_code == 200


def test_body_over_the_limit_is_413(engine):
    huge = b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"a" * (17 << 20)
    assert_openai_error(post(engine, {"content": huge + b'"}]}'}), 413)


def test_unknown_route_is_404_in_openai_shape(engine):
    r = httpx.get(f"{engine.url}/nothing-here", timeout=10)
    assert_openai_error(r, 404)


def test_engine_serves_normally_after_every_error(client):
    r = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3)
    assert r.choices[0].message.role == "assistant"
