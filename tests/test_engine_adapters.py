"""LoRA adapters through vLLM's runtime endpoints, on a real engine process."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from openai import AsyncOpenAI, NotFoundError, OpenAI
from peft import PeftModel
from transformers import AutoModelForCausalLM

from onjob.cli.process import EngineProcess

from .conftest import make_adapter
from .test_engine_api import HELLO, forward_logprobs

GREEDY = dict(
    messages=HELLO,
    max_tokens=10,
    temperature=0,
    logprobs=True,
    extra_body={"return_token_ids": True, "ignore_eos": True},
)


@pytest.fixture(scope="module")
def second_adapter_dir(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("adapter-b")
    return make_adapter(tiny_model_dir, out, seed=5, r=4, targets=["k_proj", "up_proj"])


@pytest.fixture(scope="module")
def foreign_adapter_dir(tmp_path_factory):
    """An adapter trained for a model of another size: must be refused."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    peft_model = get_peft_model(
        LlamaForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj"])
    )
    path = tmp_path_factory.mktemp("foreign-adapter")
    peft_model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with EngineProcess(["--model", str(tiny_model_dir), "--served-model-name", "tiny"]) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(engine):
    return OpenAI(base_url=engine.url, api_key="x", max_retries=0, timeout=120)


def load(engine, name, path) -> httpx.Response:
    return httpx.post(
        f"{engine.url}/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(path)},
        timeout=60,
    )


def unload(engine, name) -> httpx.Response:
    return httpx.post(f"{engine.url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def logprobs_of(response) -> torch.Tensor:
    return torch.tensor([e.logprob for e in response.choices[0].logprobs.content])


def test_adapter_lifecycle_changes_then_restores_the_outputs(
    engine, client, tiny_model_dir, tiny_adapter_dir
):
    base = client.chat.completions.create(model="tiny", **GREEDY)

    r = load(engine, "a1", tiny_adapter_dir)
    assert r.status_code == 200, r.text
    assert "a1" in r.text
    listed = {m.id: m.model_extra for m in client.models.list().data}
    assert listed["a1"]["parent"] == "tiny"
    assert listed["a1"]["root"] == str(tiny_adapter_dir)

    adapted = client.chat.completions.create(model="a1", **GREEDY)
    assert adapted.model == "a1"
    base_ids = base.choices[0].model_extra["token_ids"]
    adapter_ids = adapted.choices[0].model_extra["token_ids"]
    assert adapter_ids != base_ids or not torch.allclose(logprobs_of(adapted), logprobs_of(base))

    # The adapter's logprobs are the adapter model's: check against peft in this process.
    reference = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_adapter_dir
    ).eval()
    expected = forward_logprobs(reference, adapted.model_extra["prompt_token_ids"], adapter_ids)
    assert torch.allclose(logprobs_of(adapted), expected, atol=1e-4)

    # The base model is untouched while the adapter is loaded, and after unloading.
    again = client.chat.completions.create(model="tiny", **GREEDY)
    assert again.choices[0].model_extra["token_ids"] == base_ids
    assert torch.allclose(logprobs_of(again), logprobs_of(base), atol=1e-5)
    # The LoRA layers, switched off for the base model's batches, are on again for the
    # adapter's (they are switched only when a batch needs the other state).
    readapted = client.chat.completions.create(model="a1", **GREEDY)
    assert readapted.choices[0].model_extra["token_ids"] == adapter_ids
    assert torch.allclose(logprobs_of(readapted), logprobs_of(adapted), atol=1e-5)

    assert unload(engine, "a1").status_code == 200
    with pytest.raises(NotFoundError):
        client.chat.completions.create(model="a1", **GREEDY)
    after = client.chat.completions.create(model="tiny", **GREEDY)
    assert after.choices[0].model_extra["token_ids"] == base_ids
    assert torch.allclose(logprobs_of(after), logprobs_of(base), atol=1e-5)
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_requests_for_several_adapters_in_flight_together_match_solo_runs(
    engine, client, tiny_adapter_dir, second_adapter_dir
):
    assert load(engine, "mix-a", tiny_adapter_dir).status_code == 200
    assert load(engine, "mix-b", second_adapter_dir).status_code == 200
    try:
        names = ["tiny", "mix-a", "mix-b"]
        # Seeded sampling: every choice has its own generator, so batching must not change it.
        ask = {**GREEDY, "temperature": 1.0, "seed": 4}
        solo = {m: client.chat.completions.create(model=m, **ask) for m in names}
        outputs = {m: solo[m].choices[0].model_extra["token_ids"] for m in names}
        for a, b in [("tiny", "mix-a"), ("tiny", "mix-b"), ("mix-a", "mix-b")]:
            assert not torch.allclose(logprobs_of(solo[a]), logprobs_of(solo[b]), atol=1e-3)

        async def together():
            aclient = AsyncOpenAI(base_url=engine.url, api_key="x", max_retries=0, timeout=120)
            return await asyncio.gather(
                *(aclient.chat.completions.create(model=m, **ask) for m in names * 3)
            )

        for r in asyncio.run(together()):
            assert r.choices[0].model_extra["token_ids"] == outputs[r.model]
            assert torch.allclose(logprobs_of(r), logprobs_of(solo[r.model]), atol=1e-4)
    finally:
        unload(engine, "mix-a")
        unload(engine, "mix-b")


def test_adapter_errors_are_clear_and_the_engine_keeps_serving(
    engine, client, tmp_path, tiny_adapter_dir, foreign_adapter_dir
):
    missing = load(engine, "ghost", tmp_path / "nowhere")
    assert missing.status_code == 400
    assert "adapter_config.json" in missing.json()["error"]["message"]

    foreign = load(engine, "foreign", foreign_adapter_dir)
    assert foreign.status_code == 400
    assert "does not fit" in foreign.json()["error"]["message"]

    assert load(engine, "dup", tiny_adapter_dir).status_code == 200
    try:
        twice = load(engine, "dup", tiny_adapter_dir)
        assert twice.status_code == 400
        assert "already been loaded" in twice.json()["error"]["message"]
    finally:
        unload(engine, "dup")

    gone = unload(engine, "never-loaded")
    assert gone.status_code == 404
    assert gone.json()["error"]["type"] == "not_found_error"

    bad_body = httpx.post(f"{engine.url}/load_lora_adapter", json={"lora_name": "x"}, timeout=10)
    assert bad_body.status_code == 400
    assert "lora_path" in bad_body.json()["error"]["message"]

    assert [m.id for m in client.models.list().data] == ["tiny"]
    ok = client.chat.completions.create(model="tiny", **GREEDY)
    assert ok.choices[0].finish_reason == "length"


def test_unloading_an_adapter_mid_stream_ends_that_stream_with_an_error_event(
    engine, client, tiny_adapter_dir
):
    assert load(engine, "short-lived", tiny_adapter_dir).status_code == 200
    body = {
        "model": "short-lived",
        "messages": HELLO,
        "max_tokens": 900,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{engine.url}/chat/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert '"role":"assistant"' in first
        assert unload(engine, "short-lived").status_code == 200
        rest = [line for line in lines if line.startswith("data: ")]
    errors = [json.loads(line[6:]) for line in rest if '"error"' in line]
    assert errors and "unloaded during generation" in errors[0]["error"]["message"]
    assert rest[-1] == "data: [DONE]"
    ok = client.chat.completions.create(model="tiny", **GREEDY)
    assert ok.usage.completion_tokens == 10
