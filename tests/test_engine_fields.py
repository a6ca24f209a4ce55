"""Every field of OpenAI's chat request, as the local engine takes it: honoured, ignored
where the answer does not depend on it, or refused with a 400 naming it; `null` is absent."""

from __future__ import annotations

import httpx
import msgspec
import openai
import pytest
from openai.types.chat.completion_create_params import CompletionCreateParamsBase

from onjob.protocol import ChatCompletionRequest
from onjob.protocol.fields import REFUSED

HELLO = [{"role": "user", "content": "Say hello."}]


def test_every_field_of_openais_chat_request_is_declared():
    """A field the engine does not declare would be ignored silently: a new one in the
    openai client must be sorted into honoured, ignored or refused."""
    declared = {f.name for f in msgspec.structs.fields(ChatCompletionRequest)}
    assert set(CompletionCreateParamsBase.__annotations__) <= declared


def test_null_fields_are_taken_as_absent(engine):
    nullable = [
        f.name
        for f in msgspec.structs.fields(ChatCompletionRequest)
        if f.name not in ("model", "messages")
    ]
    body = {"model": "tiny", "messages": HELLO, **dict.fromkeys(nullable), "max_tokens": 3}
    r = httpx.post(f"{engine.url}/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"
    assert len(r.json()["choices"]) == 1


def test_refused_fields_are_a_400_naming_them(client):
    values = {
        "audio": {"voice": "alloy", "format": "wav"},
        "functions": [{"name": "f", "parameters": {"type": "object"}}],
        "function_call": "auto",
        "moderation": {"model": "omni-moderation-latest"},
        "web_search_options": {},
        "reasoning_effort": "minimal",  # vLLM 0.13 takes low, medium and high only
        "verbosity": "low",
        "modalities": ["text", "audio"],
    }
    assert set(REFUSED) <= set(values)
    for name, value in values.items():
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="tiny", messages=HELLO, max_tokens=2, extra_body={name: value}
            )
        assert caught.value.param == name


def test_vllms_grammar_fields_are_a_400_not_an_unconstrained_answer(client):
    """vLLM decodes under these (and masks its logprobs; `onjob.logprobs.constrained`); the
    local engine has no decoder for them, so it says so rather than answer unconstrained."""
    values = {
        "structured_outputs": {"regex": "[a-z]+"},
        "guided_json": {"type": "object"},
        "guided_regex": "[a-z]+",
        "guided_choice": ["yes", "no"],
        "guided_grammar": 'root ::= "a"',
    }
    for name, value in values.items():
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="tiny", messages=HELLO, max_tokens=2, extra_body={name: value}
            )
        assert caught.value.param == name
        assert "not supported by the local engine" in caught.value.message


def test_an_image_part_is_a_400_not_dropped_unseen(client):
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        }
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    assert caught.value.param == "messages[0].content[1]"


def test_ill_typed_fields_are_a_400_naming_their_path(client):
    for extra, param in (
        ({"n": "two"}, "n"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
        ({"logit_bias": {"not-a-token": 1}}, "logit_bias"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="tiny", messages=HELLO, max_tokens=2, extra_body=extra
            )
        assert caught.value.param == param


def test_ignored_fields_leave_the_answer_as_it_was(client):
    ask = {"model": "tiny", "messages": HELLO, "max_tokens": 8, "seed": 4}
    plain = client.chat.completions.create(**ask)
    noted = client.chat.completions.create(
        **ask,
        user="u-1",
        store=True,
        metadata={"k": "v"},
        safety_identifier="s",
        prompt_cache_key="p",
        service_tier="auto",
        modalities=["text"],
    )
    assert noted.choices[0].message.content == plain.choices[0].message.content


def test_logit_bias_steers_sampling_and_leaves_logprobs_raw(client):
    ask = {"model": "tiny", "messages": HELLO, "max_tokens": 6, "seed": 2, "logprobs": True}
    plain = client.chat.completions.create(**ask, extra_body={"return_token_ids": True})
    token = 1000
    biased = client.chat.completions.create(
        **ask,
        logit_bias={str(token): 100},
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    ids = biased.choices[0].model_extra["token_ids"]
    assert ids == [token] * 6
    # The logprob is the raw model's: the bias changed the draw, not the distribution reported.
    assert biased.choices[0].logprobs.content[0].logprob < -1
    assert plain.choices[0].model_extra["token_ids"] != ids


def test_frequency_and_presence_penalties_push_a_repeated_token_down(client):
    """A bias of 5 makes one token the greedy choice every time; a frequency penalty of 2
    per occurrence (or a presence penalty past the bias) lets others through."""
    token = 1000

    def ids(**penalties):
        r = client.chat.completions.create(
            model="tiny",
            messages=HELLO,
            max_tokens=8,
            temperature=0,
            logit_bias={str(token): 5},
            extra_body={"return_token_ids": True, "ignore_eos": True},
            **penalties,
        )
        return r.choices[0].model_extra["token_ids"]

    assert ids() == [token] * 8
    assert 1 <= ids(frequency_penalty=2).count(token) <= 3
    assert ids(presence_penalty=2).count(token) == 8  # 5 - 2 still leads
    assert ids(presence_penalty=2, frequency_penalty=2).count(token) <= 2
