"""The trainer is right on every model family people deploy: tiny random models built from
each family's own config class (no hub), with what makes the family different switched
on where a tiny model would hide it (Gemma-2's eager attention and final soft-capping,
Granite's logit scaling and multipliers, sliding windows shorter than a member, Phi-3's
fused projections, Qwen's biases and norms).

Per family: the packed trainer's logprobs equal a plain per-member forward through the
model's own `forward`; they equal what the local engine logged when it sampled the same
tokens; and the adapter the trainer writes loads back into the local engine, which then
logs the logprobs the trained model gives those tokens."""

from __future__ import annotations

import asyncio
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from onjob.engine.batching import Batcher
from onjob.engine.model import LoadedModel
from onjob.engine.sampling import Sampling
from onjob.trainer import BadTargets, TrainSettings
from onjob.trainer.data import Group, Sequence
from onjob.trainer.forward import Head, chunks, pack_limit, sampled_logprobs
from onjob.trainer.loop import train
from onjob.trainer.manifest import FILE as MANIFEST

VOCAB = 49152  # the real tokenizer's, so the engine can load it beside each model
WINDOW = 40  # a sliding window shorter than the long member below


def _configs():
    import transformers as tf

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        initializer_range=0.1,  # logits large enough that soft-capping and scaling show
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {}),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {}),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM, {"sliding_window": WINDOW}),
        "gemma2": (
            tf.Gemma2Config,
            tf.Gemma2ForCausalLM,
            {"sliding_window": WINDOW, "final_logit_softcapping": 2.0},
        ),
        "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, {"sliding_window": WINDOW}),
        "granite": (
            tf.GraniteConfig,
            tf.GraniteForCausalLM,
            {
                "logits_scaling": 4.0,
                "embedding_multiplier": 3.0,
                "residual_multiplier": 0.5,
                "attention_multiplier": 0.2,
            },
        ),
    }, common


FAMILIES = list(_configs()[0])


def _tiny(name: str, tmp_path_factory, tokenizer):
    """(family name, model directory): a tiny random model of the family, saved with the
    real tokenizer."""
    configs, common = _configs()
    config_class, model_class, extra = configs[name]
    torch.manual_seed(0)
    model = model_class(config_class(**common, **extra))
    assert model.config.model_type == name
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return name, path


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory, tokenizer):
    return _tiny(request.param, tmp_path_factory, tokenizer)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory, tokenizer):
    return _tiny("phi3", tmp_path_factory, tokenizer)


def policy(path, *, seed: int = 1, targets: list[str] | None = None):
    """The trainer's model (base + LoRA, no dropout) with a LoRA that really changes it."""
    from onjob.trainer import adapter

    torch.manual_seed(seed)
    model, _ = adapter.load(
        TrainSettings(base_model=path, lora_rank=8, target_modules=targets),
        None,
        "cpu",
        torch.float32,
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    return model


def members(long: int = 60) -> list[Sequence]:
    """Three short answers to one 20-token prompt (packed together) and one long member
    that passes the sliding window and runs alone."""
    prompt = [(17 * i + 5) % 4000 + 100 for i in range(20)]
    out = []
    for i, n in enumerate((5, 8, 3, long)):
        answer = [(31 * i + 7 * j) % 4000 + 100 for j in range(n)]
        tokens, mask = prompt + answer, [False] * 20 + [True] * n
        out.append(Sequence(f"m{i}", tokens, mask, [0.0] * len(tokens), 1.0 - i, 0.0))
    return out


def own_forward_logprobs(model, seqs: list[Sequence]) -> torch.Tensor:
    """Each member alone through the model's own forward: full logits, log-softmax."""
    out = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s.tokens])
            logits = model(input_ids=ids).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            out += [lp[t - 1] for t in range(1, len(s.tokens)) if s.loss_mask[t]]
    return torch.stack(out)


def test_packed_logprobs_equal_each_members_own_forward(family):
    name, path = family
    model = policy(path)
    seqs = members()
    group = Group("g", "turn", seqs)
    limit = pack_limit(model, max_tokens=WINDOW)
    plan = chunks(group, limit)
    assert [len(c) for c in plan] == [3, 1]  # the short ones packed, the long one alone
    with torch.no_grad():
        head = Head.of(model.get_base_model())
        packed = torch.cat([sampled_logprobs(model, head, c, "cpu") for c in plan])
    reference = own_forward_logprobs(model, seqs)
    assert packed.shape == reference.shape == (16 + 60,)
    assert (packed - reference).abs().max().item() < 1e-5, name


def engine_samples(loaded: LoadedModel, prompt: list[int], n: int, adapter=None, seed=0):
    """`n` completions the local engine samples for `prompt`: (token ids, logprobs) each."""

    async def run():
        batcher = Batcher(loaded)
        batcher.start()
        try:
            sampling = Sampling(max_tokens=10, temperature=1.0, seed=seed, ignore_eos=True)
            gen = batcher.submit(prompt, adapter, n, sampling)
            got = [([], []) for _ in range(n)]
            async for event in gen.events():
                got[event.index][0].append(event.token_id)
                got[event.index][1].append(event.logprob)
            return got
        finally:
            batcher.stop()

    return asyncio.run(run())


def test_trained_on_engine_samples_and_served_back_by_the_engine(family, tmp_path):
    """The engine samples a group; the trainer's logprobs at step 0 equal the engine's; the
    adapter it writes loads into the engine, whose logged logprobs then equal the trained
    model's own forward on the same tokens."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    name, path = family
    loaded = LoadedModel.load(path, name=name)
    # 36 prompt tokens and 10 sampled: past the sliding window (40) where a family has one.
    prompt = [(13 * i + 3) % 4000 + 100 for i in range(36)]
    samples = engine_samples(loaded, prompt, 4)
    rows = [
        {
            "group_id": "g1",
            "kind": "turn",
            "member_id": f"m{i}",
            "position": i,
            "reward": reward,
            "checkpoint": None,
            "prompt_ids": [prompt],
            "completion_ids": [ids],
            "logprobs": [lps],
        }
        for i, ((ids, lps), reward) in enumerate(zip(samples, [1.0, 0.0, 0.5, 0.2], strict=True))
    ]
    snapshot = tmp_path / "s.parquet"
    pq.write_table(pa.Table.from_pylist(rows), snapshot)
    settings = TrainSettings(base_model=path, lora_rank=8, learning_rate=0.02, epochs=2)
    manifest = train(snapshot, tmp_path / "ckpt", settings, progress=False, echo=lambda _: None)
    assert manifest.metrics.logprob_gap_step0_max < 1e-5, name
    assert manifest.precision.head_dtype == "torch.float32"
    written = json.loads((tmp_path / "ckpt" / "adapter_config.json").read_text())
    layers = {n.rsplit(".", 1)[-1] for n, _ in loaded.model.named_modules()}
    assert set(written["target_modules"]) >= {"o_proj", "down_proj"}
    assert set(written["target_modules"]) <= layers  # Phi-3: qkv_proj, gate_up_proj

    loaded.load_adapter("trained", str(tmp_path / "ckpt"))
    served = engine_samples(loaded, prompt, 2, adapter="trained", seed=7)
    trained = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(path), tmp_path / "ckpt"
    )
    base = AutoModelForCausalLM.from_pretrained(path)
    for ids, lps in served:
        seq = Sequence("s", prompt + ids, [False] * len(prompt) + [True] * len(ids), [], 0, 0)
        assert torch.allclose(own_forward_logprobs(trained, [seq]), torch.tensor(lps), atol=1e-5)
        assert not torch.allclose(own_forward_logprobs(base, [seq]), torch.tensor(lps), atol=1e-3)
    assert manifest.steps == 2 and json.loads((tmp_path / "ckpt" / MANIFEST).read_text())[
        "groups"
    ] == ["g1"]


def test_a_target_the_family_does_not_have_is_refused(phi3):
    """Phi-3 has no `q_proj` (it is fused into `qkv_proj`): peft would train the rest and
    say nothing."""
    _, path = phi3
    with pytest.raises(BadTargets, match=r"\['q_proj', 'gate_proj'\].*qkv_proj"):
        policy(path, targets=["q_proj", "o_proj", "gate_proj"])
