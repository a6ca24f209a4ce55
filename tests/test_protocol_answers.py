"""The answers as `onjob.protocol` declares them: exact for the typed reading (a field the
declaration does not know refuses it), and checked on the fields they know when an engine
sends more (`checks.known`), every bound kept."""

from __future__ import annotations

import msgspec
import pytest

from onjob.protocol.chat import ChatCompletion, ChatCompletionChunk
from onjob.protocol.checks import known
from onjob.protocol.completion import TextCompletion

# vLLM's whole answer carries fields the declaration leaves out (`refusal`, `service_tier`,
# `kv_transfer_params`, ...).
VLLM_WHOLE = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi", "refusal": None, "annotations": None},
            "logprobs": {"content": [{"token": "hi", "logprob": -0.1, "bytes": [104, 105]}]},
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": [5],
            "routed_experts": None,
        }
    ],
    "service_tier": None,
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    "kv_transfer_params": None,
}


def test_an_answer_with_fields_the_declaration_lacks_is_refused_typed_and_passes_known():
    raw = msgspec.json.encode(VLLM_WHOLE)
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.json.decode(raw, type=ChatCompletion)
    known(VLLM_WHOLE, ChatCompletion)  # the fields it knows are right: no error


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda a: a["choices"][0].update(token_ids=[2**31]), r"choices\[0\]\.token_ids\[0\]"),
        (
            lambda a: a["choices"][0]["logprobs"]["content"][0].update(logprob="x"),
            r"logprobs\.content\[0\]\.logprob",
        ),
        (lambda a: a["choices"][0]["message"].update(content=7), r"message\.content"),
        (lambda a: a["usage"].update(prompt_tokens=-1), r"usage\.prompt_tokens"),
        (lambda a: a.update(object="chat.completion.chunk"), r"\$\.object"),
    ],
)
def test_known_refuses_a_declared_field_of_the_wrong_type_at_any_depth(change, where):
    answer = msgspec.json.decode(msgspec.json.encode(VLLM_WHOLE))
    change(answer)
    with pytest.raises(msgspec.ValidationError, match=where):
        known(answer, ChatCompletion)


def test_an_absent_field_stays_absent_when_an_event_is_read_and_written_again():
    raw = b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m",' \
        b'"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}'  # fmt: skip
    event = msgspec.json.decode(raw, type=ChatCompletionChunk)
    assert msgspec.json.encode(event) == raw


def test_a_legacy_answer_is_checked_on_its_own_declaration():
    legacy = {"choices": [{"text": "a", "logprobs": {"top_logprobs": [None, {"a": -1.0}]}}]}
    known(legacy, TextCompletion)
    legacy["choices"][0]["text"] = ["not", "text"]
    with pytest.raises(msgspec.ValidationError, match=r"choices\[0\]\.text"):
        known(legacy, TextCompletion)
