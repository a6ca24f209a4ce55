"""Each streamed chat event as the client hears it and as the log keeps it, in process
(Litestar's test client) with the engine scripted at the HTTP boundary: an event of the
shape vLLM sends is read typed, any other the general way, and both say the same."""

from __future__ import annotations

import json

import httpx
import pytest
from litestar.testing import TestClient

from .fake_engine import scripted
from .test_proxy_faults import CHAT, app_for, rows, stream_until_error

HEAD = {"id": "chatcmpl-vllm", "object": "chat.completion.chunk", "created": 7, "model": "fake"}


def _logprobs(token: str) -> dict:
    return {"content": [{"token": token, "logprob": -0.5, "bytes": [104], "top_logprobs": []}]}


# As vLLM streams a tool call (fields it leaves unset are absent, not null), and one event
# with a field no declaration knows, which must reach the client as the engine sent it.
EVENTS = [
    {
        **HEAD,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "prompt_token_ids": [1, 2, 3],
    },
    {
        **HEAD,
        "choices": [
            {
                "index": 0,
                "delta": {"content": "Hel"},
                "logprobs": _logprobs("Hel"),
                "token_ids": [11],
            }
        ],
    },
    {
        **HEAD,
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "find_city", "arguments": ""},
                        }
                    ]
                },
                "logprobs": _logprobs("<"),
                "token_ids": [12],
            }
        ],
    },
    {
        **HEAD,
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"town":"X"}'}}]},
                "logprobs": _logprobs("{"),
                "token_ids": [13],
            }
        ],
    },
    {
        **HEAD,
        "kv_transfer_params": {"remote": None},  # declared nowhere: the general path
        "choices": [
            {
                "index": 0,
                "delta": {"content": "lo"},
                "logprobs": _logprobs("lo"),
                "token_ids": [14],
                "finish_reason": "tool_calls",
                "stop_reason": None,
            }
        ],
    },
    {
        **HEAD,
        "choices": [],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "total_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    },
]


def _engine(events: list[bytes]):
    async def stream():
        for event in events:
            yield event

    def chat(request):
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=stream())

    return scripted(chat)


def _sse(events: list[dict]) -> list[bytes]:
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def _heard(client, **asked) -> list[dict]:
    body = {**CHAT, "stream": True, **asked}
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        return [json.loads(x[6:]) for x in resp.iter_lines() if x.startswith("data: {")]


def test_streamed_events_reach_the_client_as_the_engine_sent_them_less_what_onjob_asked_for(
    tmp_path,
):
    with TestClient(app_for(tmp_path, _engine(_sse(EVENTS)))) as client:
        plain = _heard(client)
        asked = _heard(
            client,
            logprobs=True,
            return_token_ids=True,
            stream_options={"include_usage": True},
        )

    # Not asked: the sampler's fields are out, the usage event (onjob's own) is not sent;
    # the id is the exchange's and the model the alias; what the engine left out stays out
    # and what it sent as null stays null; the undeclared field passes as it came.
    assert len(plain) == 5 and len({e["id"] for e in plain}) == 1
    assert plain[0]["id"].startswith("chatcmpl-") and plain[0]["id"] != "chatcmpl-vllm"
    assert all(e["model"] == "agent" and e["created"] == 7 for e in plain)
    assert "prompt_token_ids" not in plain[0]
    assert all("token_ids" not in c and c["logprobs"] is None for e in plain for c in e["choices"])
    assert "finish_reason" not in plain[1]["choices"][0]
    assert plain[0]["choices"][0]["finish_reason"] is None
    assert plain[2]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "find_city"
    assert plain[4]["kv_transfer_params"] == {"remote": None}
    assert plain[4]["choices"][0]["stop_reason"] is None
    assert all("usage" not in e for e in plain)

    # Asked: each field as the engine sent it.
    assert len(asked) == 6
    assert asked[0]["prompt_token_ids"] == [1, 2, 3]
    assert [e["choices"][0]["token_ids"] for e in asked[1:5]] == [[11], [12], [13], [14]]
    assert asked[1]["choices"][0]["logprobs"] == _logprobs("Hel")
    assert asked[5]["usage"] == EVENTS[5]["usage"] and asked[5]["choices"] == []

    # Both logged alike, the typed events and the general one in one answer.
    logged = rows(
        tmp_path,
        "SELECT id, prompt_token_ids, completion_token_ids, completion_logprobs, usage, "
        "response FROM exchanges ORDER BY ts",
    )
    assert [r["id"] for r in logged] == [plain[0]["id"], asked[0]["id"]]
    for row in logged:
        assert row["prompt_token_ids"] == [1, 2, 3]
        assert row["completion_token_ids"] == [[11, 12, 13, 14]]
        assert row["completion_logprobs"] == [[-0.5] * 4]
        assert json.loads(row["usage"]) == EVENTS[5]["usage"]
        (choice,) = json.loads(row["response"])["choices"]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] == "Hello"
        assert choice["message"]["tool_calls"] == [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "find_city", "arguments": '{"town":"X"}'},
            }
        ]


@pytest.mark.parametrize(
    "event, said",
    [
        (b'data: {"id":"c","choices":[{"delta":{"content":"\xff"}}]}\n\n', "malformed"),
        (b'data: {"id":"c","choices":[{"index":0,"token_ids":[-4]}]}\n\n', "malformed"),
        (b'data: {"id":"c","model":"other","choices":[]}\n\n', "answered as `other`"),
    ],
    ids=["not-utf8", "negative-token-id", "another-model"],
)
def test_a_streamed_event_the_log_cannot_keep_ends_the_stream_with_an_error_and_is_logged(
    tmp_path, event, said
):
    events = [_sse(EVENTS[:2])[0], _sse(EVENTS[:2])[1], event, b"data: [DONE]\n\n"]
    with TestClient(app_for(tmp_path, _engine(events))) as http:
        heard, error = stream_until_error(http)
        assert said in str(error)
        assert heard == "Hel"
    (row,) = rows(tmp_path, "SELECT status, error, completion_token_ids FROM exchanges")
    assert row["status"] == 502 and said in row["error"]
    assert row["completion_token_ids"] == [[11]]
