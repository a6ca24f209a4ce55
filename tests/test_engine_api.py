"""The local engine over real HTTP with the official openai client: vLLM's contract."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from openai import AsyncOpenAI
from transformers import AutoModelForCausalLM

from .conftest import TOOL_ANSWER, TOOL_QUESTION, TOOLS

HELLO = [{"role": "user", "content": "Say hello."}]


def forward_logprobs(model, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    """Per-token logprobs of `completion_ids` after `prompt_ids`, from one separate forward."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def test_plain_completion_has_openai_shape_and_usage(client):
    r = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=8, seed=1)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.model == "tiny"
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5
    assert 1 <= r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_max_tokens_and_max_completion_tokens_cap_the_answer(client):
    for kwargs in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
        r = client.chat.completions.create(
            model="tiny", messages=HELLO, extra_body={"ignore_eos": True}, **kwargs
        )
        assert r.usage.completion_tokens == 3
        assert r.choices[0].finish_reason == "length"


def test_seed_makes_sampling_reproducible_and_temperature_zero_is_greedy(client):
    def ask(**kw):
        return client.chat.completions.create(
            model="tiny", messages=HELLO, max_tokens=12, extra_body={"return_token_ids": True}, **kw
        )

    a, b = ask(seed=7, temperature=1.0), ask(seed=7, temperature=1.0)
    assert a.choices[0].model_extra["token_ids"] == b.choices[0].model_extra["token_ids"]
    c = ask(seed=8, temperature=1.0)
    assert c.choices[0].model_extra["token_ids"] != a.choices[0].model_extra["token_ids"]
    g1, g2 = ask(temperature=0), ask(temperature=0, seed=123)
    assert g1.choices[0].model_extra["token_ids"] == g2.choices[0].model_extra["token_ids"]


def test_n_returns_distinct_choices_sharing_one_prompt(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=HELLO,
        n=4,
        max_tokens=10,
        seed=3,
        extra_body={"return_token_ids": True},
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    ids = [tuple(c.model_extra["token_ids"]) for c in r.choices]
    assert len(set(ids)) > 1
    assert r.usage.completion_tokens == sum(len(i) for i in ids)


def test_streaming_sends_chunks_then_usage_and_matches_text(client):
    stream = client.chat.completions.create(
        model="tiny",
        messages=HELLO,
        max_tokens=10,
        seed=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes and finishes[-1] in ("stop", "length")
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens >= 1
    same = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=10, seed=5)
    assert content == same.choices[0].message.content


def test_stream_ends_with_done_marker_over_raw_http(engine):
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{engine.url}/chat/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)


def test_stop_string_truncates_text(client):
    ask = dict(
        model="tiny", messages=HELLO, max_tokens=20, seed=21, extra_body={"ignore_eos": True}
    )
    text = client.chat.completions.create(**ask).choices[0].message.content
    start = next(
        i
        for i in range(len(text) // 3, len(text) - 1)
        if text[i : i + 2].strip() == text[i : i + 2]
    )
    stop = text[start : start + 2]
    cut = client.chat.completions.create(**ask, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]


def test_logprobs_match_a_separate_forward_pass(client, reference):
    r = client.chat.completions.create(
        model="tiny",
        messages=HELLO,
        max_tokens=16,
        logprobs=True,
        top_logprobs=3,
        seed=11,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = r.choices[0]
    token_ids = choice.model_extra["token_ids"]
    entries = choice.logprobs.content
    assert len(entries) == len(token_ids) == 16
    assert all(len(e.top_logprobs) == 3 for e in entries)
    assert all(e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in entries)
    expected = forward_logprobs(reference, r.model_extra["prompt_token_ids"], token_ids)
    got = torch.tensor([e.logprob for e in entries])
    assert torch.allclose(got, expected, atol=1e-4)
    assert abs(got.sum().item() - expected.sum().item()) < 1e-3


def test_logprobs_are_the_raw_distributions_whatever_the_temperature_and_top_p(client, reference):
    """onjob's one definition (`onjob.logprobs`, vLLM's `raw_logprobs`): the model's own
    log-softmax, before temperature and top-p, which is what the trainer computes."""
    r = client.chat.completions.create(
        model="tiny",
        messages=HELLO,
        max_tokens=12,
        logprobs=True,
        temperature=0.4,
        top_p=0.5,
        seed=5,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    token_ids = r.choices[0].model_extra["token_ids"]
    got = torch.tensor([e.logprob for e in r.choices[0].logprobs.content])
    expected = forward_logprobs(reference, r.model_extra["prompt_token_ids"], token_ids)
    assert torch.allclose(got, expected, atol=1e-4)
    card = client.models.list().data[0]
    assert card.model_extra["logprobs"] == "raw_logprobs"


def test_logprobs_stay_exact_when_requests_of_different_lengths_share_a_batch(engine, reference):
    prompts = [
        [{"role": "user", "content": "Hi."}],
        [{"role": "user", "content": "Tell me a long story about a dragon " * 8}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count."}],
        HELLO,
    ]

    async def run():
        client = AsyncOpenAI(base_url=engine.url, api_key="x", max_retries=0, timeout=120)
        return await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="tiny",
                    messages=m,
                    max_tokens=12 + 3 * i,
                    n=2,
                    logprobs=True,
                    extra_body={"return_token_ids": True, "ignore_eos": True},
                )
                for i, m in enumerate(prompts)
            )
        )

    for r in asyncio.run(run()):
        for choice in r.choices:
            ids = choice.model_extra["token_ids"]
            expected = forward_logprobs(reference, r.model_extra["prompt_token_ids"], ids)
            got = torch.tensor([e.logprob for e in choice.logprobs.content])
            assert torch.allclose(got, expected, atol=1e-4)


def test_streaming_chunks_carry_logprobs_and_token_ids(client):
    stream = client.chat.completions.create(
        model="tiny",
        messages=HELLO,
        max_tokens=6,
        stream=True,
        logprobs=True,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].model_extra["prompt_token_ids"]
    ids = [
        t for c in chunks if c.choices for t in (c.choices[0].model_extra.get("token_ids") or [])
    ]
    lps = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert len(ids) == len(lps) == 6


def test_tool_schemas_reach_the_prompt(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=TOOL_QUESTION,
        tools=TOOLS,
        max_tokens=2,
        extra_body={"return_token_ids": True},
    )
    from transformers import AutoTokenizer

    from onjob import bundled

    tok = AutoTokenizer.from_pretrained(bundled.prepared_path())
    prompt = tok.decode(r.model_extra["prompt_token_ids"])
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    assert "What is the weather in Paris?" in prompt


@pytest.fixture(scope="module")
def tool_engine(tool_model_dir):
    from onjob.cli.process import EngineProcess

    with EngineProcess(["--model", str(tool_model_dir), "--served-model-name", "toolbot"]) as e:
        yield e


def test_tool_call_in_output_comes_back_as_openai_tool_calls(tool_engine):
    from openai import OpenAI

    client = OpenAI(base_url=tool_engine.url, api_key="x", max_retries=0)
    r = client.chat.completions.create(
        model="toolbot", messages=TOOL_QUESTION, tools=TOOLS, temperature=0, max_tokens=40
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    # Without tools in the request the same text is plain content.
    plain = client.chat.completions.create(
        model="toolbot",
        messages=TOOL_QUESTION,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=40,
    )
    assert plain.choices[0].message.tool_calls is None

    # Streaming delivers the same call (its name first, then its arguments in pieces).
    chunks = list(
        client.chat.completions.create(
            model="toolbot",
            messages=TOOL_QUESTION,
            tools=TOOLS,
            temperature=0,
            max_tokens=40,
            stream=True,
        )
    )
    calls = [
        tc
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for tc in c.choices[0].delta.tool_calls
    ]
    assert [c.function.name for c in calls if c.function.name] == ["get_weather"]
    assert json.loads("".join(c.function.arguments for c in calls)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # The call and the tool's result render back into a follow-up turn.
    follow = client.chat.completions.create(
        model="toolbot",
        messages=[
            *TOOL_QUESTION,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18}'},
        ],
        tools=TOOLS,
        max_tokens=4,
        extra_body={"return_token_ids": True},
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tool_engine_dir(tool_engine))
    prompt = tok.decode(follow.model_extra["prompt_token_ids"])
    assert TOOL_ANSWER in prompt and '{"temp_c": 18}' in prompt


def tool_engine_dir(engine) -> str:
    return engine.args[engine.args.index("--model") + 1]


def test_models_lists_the_base_model(client):
    models = client.models.list().data
    assert models[0].id == "tiny"
    assert models[0].model_extra["parent"] is None
    assert models[0].model_extra["max_model_len"] == 1024
