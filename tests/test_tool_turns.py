"""Tool turns in the local engine, over real HTTP with the official openai client: a
forced call cut by `max_tokens` still comes back as its complete calls, an answer that
may make one call ends with it, and requests with one prompt share one prefill."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from .conftest import TOOL_QUESTION, TOOLS


def _client(engine) -> OpenAI:
    return OpenAI(base_url=engine.url, api_key="x", max_retries=0, timeout=120)


def _never_end(tokenizer) -> dict:
    """A logit bias that keeps the model from ending its answer while anything else is
    allowed: the taught model then writes past its one call."""
    return {str(tokenizer.convert_tokens_to_ids("<|im_end|>")): -100}


def _whole(client) -> int:
    """Completion tokens of the taught call, its end of answer included."""
    r = client.chat.completions.create(
        model="toolbot", messages=TOOL_QUESTION, tools=TOOLS, tool_choice="required", temperature=0
    )
    assert r.choices[0].finish_reason == "tool_calls"
    return r.usage.completion_tokens


def test_a_forced_call_cut_by_max_tokens_returns_its_complete_calls(tool_engine, tokenizer):
    client = _client(tool_engine)
    whole = _whole(client)
    # Parallel calls allowed and the end of answer biased away: the grammar lets the model
    # start a second call, and `max_tokens` cuts it a few tokens in.
    r = client.chat.completions.create(
        model="toolbot",
        messages=TOOL_QUESTION,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=whole + 6,
        logit_bias=_never_end(tokenizer),
        extra_body={"return_token_ids": True},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length"  # cut, and said so
    assert choice.message.content is None
    assert [
        (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls
    ] == [("get_weather", {"city": "Paris"})]
    assert r.usage.completion_tokens == whole + 6


def test_one_call_allowed_ends_the_answer_after_its_first_call(tool_engine, tokenizer):
    client = _client(tool_engine)
    whole = _whole(client)
    for tool_choice in ("auto", "required"):
        r = client.chat.completions.create(
            model="toolbot",
            messages=TOOL_QUESTION,
            tools=TOOLS,
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=whole + 40,
            logit_bias=_never_end(tokenizer),
            extra_body={"return_token_ids": True},
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", tool_choice
        assert len(choice.message.tool_calls) == 1
        # Nothing was generated past the call: the tokens a trainer learns from are the
        # call's own (under "auto" the model went on writing until max_tokens before).
        assert r.usage.completion_tokens <= whole, tool_choice
        text = tokenizer.decode(choice.model_extra["token_ids"])
        assert text.rstrip().endswith("</tool_call>"), (tool_choice, text)


def test_requests_with_one_prompt_share_one_prefill_and_draw_the_same(client):
    """A request whose prompt (and model) is the last prefilled one reuses that prefill:
    it reports its prompt as cached and draws, for the same seed, exactly what a fresh
    prefill draws; a request with `n` shares it too, choice 0 seeded as a lone request."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "One prompt, a group of alternatives."}],
        "max_tokens": 8,
        "temperature": 1.0,
        "logprobs": True,
        "seed": 21,
        "extra_body": {"return_token_ids": True},
    }

    def drawn(choice) -> tuple[list[int], list[float]]:
        return choice.model_extra["token_ids"], [t.logprob for t in choice.logprobs.content]

    fresh = client.chat.completions.create(**body)
    assert fresh.usage.prompt_tokens_details is None  # prefilled
    again = client.chat.completions.create(**body)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens
    assert drawn(again.choices[0]) == drawn(fresh.choices[0])
    group = client.chat.completions.create(**body, n=4)
    assert group.usage.prompt_tokens_details.cached_tokens == group.usage.prompt_tokens
    ids, logprobs = drawn(group.choices[0])
    assert ids == drawn(fresh.choices[0])[0]
    assert logprobs == pytest.approx(drawn(fresh.choices[0])[1], abs=1e-4)  # a batch of 4
    # Another prompt is prefilled afresh, and then the first one is no longer kept.
    other = {**body, "messages": [{"role": "user", "content": "Another prompt."}]}
    assert client.chat.completions.create(**other).usage.prompt_tokens_details is None
    assert client.chat.completions.create(**body).usage.prompt_tokens_details is None
