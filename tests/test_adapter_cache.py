"""The local engine's adapters past its cache size (`max_cpu_loras`): the least recently
used idle one is taken out of the model and loaded again from its path when next asked
for, and answers as itself; one that cannot be loaded again fails its request, and never
answers with other weights. A real tiny model, real peft adapters, the real batcher.
(`tests/test_real_engines.py` holds vLLM and the local engine, as processes, to the same
answers past their caches.)"""

from __future__ import annotations

import asyncio
import shutil

import pytest

from onjob.engine.batching import Batcher
from onjob.engine.errors import GenerationFailed
from onjob.engine.model import LoadedModel
from onjob.engine.sampling import Sampling

from .conftest import make_adapter

PROMPT = [(11 * i + 5) % 900 + 100 for i in range(12)]
TARGETS = ["q_proj", "v_proj", "o_proj"]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_model_dir) -> dict[str, str]:
    out = tmp_path_factory.mktemp("cache-adapters")
    return {
        f"a{i}": str(make_adapter(tiny_model_dir, out / f"a{i}", seed=20 + i, r=4, targets=TARGETS))
        for i in range(3)
    }


def answers(loaded: LoadedModel, asks: list[str | None], max_tokens: int = 6) -> list:
    """Each ask in turn (an adapter, or None for the base model): its greedy token ids and
    logprobs, or the error it got."""

    async def run():
        batcher = Batcher(loaded)
        batcher.start()
        got = []
        try:
            for adapter in asks:
                sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
                gen = batcher.submit(PROMPT, adapter, 1, sampling)
                try:
                    events = [e async for e in gen.events()]
                except GenerationFailed as exc:
                    got.append(exc)
                    continue
                got.append(([e.token_id for e in events], [e.logprob for e in events]))
        finally:
            batcher.stop()
        return got

    return asyncio.run(run())


def loaded_with(tiny_model_dir, adapters: dict[str, str], size: int | None) -> LoadedModel:
    loaded = LoadedModel.load(tiny_model_dir, name="tiny", max_resident=size)
    for name, path in adapters.items():
        loaded.load_adapter(name, path)
    return loaded


def same(a, b) -> bool:
    return a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1], b[1], strict=True)) < 1e-5


def test_adapters_past_the_cache_are_taken_out_and_answer_as_themselves_when_asked_again(
    tiny_model_dir, adapters
):
    names = list(adapters)
    solo = answers(loaded_with(tiny_model_dir, adapters, None), names)
    reference = dict(zip(names, solo, strict=True))
    # The three differ: an answer by the wrong adapter would show.
    assert not same(reference["a0"], reference["a1"]) and not same(reference["a1"], reference["a2"])

    loaded = loaded_with(tiny_model_dir, adapters, 2)
    assert list(loaded.resident) == ["a1", "a2"] and set(loaded.adapters) == set(names)
    # a0 a1 a2 a0 a1 a2: with room for two, every one is asked for after it was taken out.
    got = answers(loaded, names + names)
    for name, answer in zip(names + names, got, strict=True):
        assert same(answer, reference[name]), name
    assert loaded.reloads == 6 and len(loaded.resident) == 2
    base = answers(loaded, [None])[0]
    assert all(not same(base, reference[n]) for n in names)


def test_an_adapter_that_cannot_be_loaded_again_fails_its_request_and_nothing_else(
    tiny_model_dir, adapters, tmp_path
):
    gone = shutil.copytree(adapters["a0"], tmp_path / "a0")
    loaded = loaded_with(tiny_model_dir, {"a0": str(gone), "a1": adapters["a1"]}, 1)
    assert list(loaded.resident) == ["a1"]
    shutil.rmtree(gone)  # a checkpoint deleted while it was out of the model
    failed, other = answers(loaded, ["a0", "a1"])
    assert isinstance(failed, GenerationFailed)
    assert "'a0' could not be loaded again" in failed.message and str(gone) in failed.message
    reference = answers(loaded_with(tiny_model_dir, {"a1": adapters["a1"]}, None), ["a1"])[0]
    assert same(other, reference)
    assert "a0" in loaded.adapters  # still served: its files may come back


def test_an_adapter_generating_keeps_its_weights_while_others_are_loaded(tiny_model_dir, adapters):
    """Room for one: a second adapter's request arrives while the first is generating. The
    first keeps its weights to its last token (the model holds one more meanwhile)."""
    solo = loaded_with(tiny_model_dir, {"a0": adapters["a0"], "a1": adapters["a1"]}, None)
    long_a0, short_a1 = answers(solo, ["a0"], 40)[0], answers(solo, ["a1"])[0]
    loaded = loaded_with(tiny_model_dir, {"a0": adapters["a0"], "a1": adapters["a1"]}, 1)

    async def together():
        batcher = Batcher(loaded)
        batcher.start()
        try:
            first = batcher.submit(PROMPT, "a0", 1, Sampling(40, 0.0, ignore_eos=True))
            events = first.events()
            head = [await anext(events)]  # a0 is in the batch, generating
            second = batcher.submit(PROMPT, "a1", 1, Sampling(6, 0.0, ignore_eos=True))
            other = [e async for e in second.events()]
            rest = [e async for e in events]
            return head + rest, other
        finally:
            batcher.stop()

    a0, a1 = asyncio.run(together())
    assert same(([e.token_id for e in a0], [e.logprob for e in a0]), long_a0)
    assert same(([e.token_id for e in a1], [e.logprob for e in a1]), short_a1)
