"""Data-parallel training under torchrun: two CPU processes on gloo train the adapter one
process trains, with the weights equal on both ranks after every step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from onjob.trainer import TrainSettings
from onjob.trainer.manifest import Manifest

from .test_trainer import write_snapshot

BIN = Path(sys.executable).parent


@pytest.fixture
def four_groups(tmp_path, tiny_model_dir, tokenizer):
    """Four groups over one prompt, each with its own order of rewards: two steps of
    two groups, each rank one group per step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say yes."}], add_generation_prompt=True, tokenize=False
    )
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    answers = ["Yes.", "No.", "Maybe so.", "I cannot say."]
    completions = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
    rewards = [
        [1.0, 0.0, 0.3, 0.1],
        [0.0, 1.0, 0.2, 0.4],
        [0.5, 0.1, 1.0, 0.0],
        [0.2, 0.9, 0.0, 0.6],
    ]
    groups = [(f"g{i}", prompt, completions, r) for i, r in enumerate(rewards)]
    return write_snapshot(tmp_path / "s.parquet", groups, model)


def _train(cmd: list[str], snap: Path, out: Path, settings: Path) -> Manifest:
    args = ["train", "--snapshot", str(snap), "--out", str(out), "--settings", str(settings)]
    done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=600, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return Manifest.read(out)


def _env() -> dict:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread per rank: a shared host


def test_two_ranks_on_gloo_train_what_one_process_trains(tmp_path, tiny_model_dir, four_groups):
    settings = tmp_path / "train.json"
    settings.write_text(
        TrainSettings(
            base_model=tiny_model_dir,
            learning_rate=2e-3,
            groups_per_step=2,
            lora_rank=8,
            seed=3,
            kl_own_prompts=0,
        ).model_dump_json()
    )
    one = _train([str(BIN / "onjob")], four_groups, tmp_path / "one", settings)
    two = _train(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "onjob.cli"],
        four_groups,
        tmp_path / "two",
        settings,
    )

    # The weights were equal on both ranks after the last step, as every step's update
    # was the same on each (the manifest records the largest difference rank 0 saw).
    assert two.metrics.ranks == 2 and one.metrics.ranks == 1
    assert two.metrics.ranks_weight_gap == 0.0
    # Each step's loss is one process's on the same groups: the two ranks' halves summed.
    assert [h.step for h in two.history] == [1, 2]
    for a, b in zip(one.history, two.history, strict=True):
        assert a.loss == pytest.approx(b.loss, rel=1e-5, abs=1e-7)
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
        assert a.tokens == b.tokens and a.reward_mean == pytest.approx(b.reward_mean)
    # And so is the adapter it wrote: the same weights, up to the order of float sums.
    w1 = load_file(tmp_path / "one" / "adapter_model.safetensors")
    w2 = load_file(tmp_path / "two" / "adapter_model.safetensors")
    assert w1.keys() == w2.keys()
    moved = max(w1[k].abs().max().item() for k in w1 if "lora_B" in k)
    assert moved > 1e-4  # the steps did move the adapter (lora_B starts at zero)
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=1e-4, atol=1e-6)
