"""Trainer settings (composed into the server's settings in `deploy`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# LoRA targets per architecture family (`config.model_type`): every attention and MLP
# projection, under the names the family uses (vLLM serves adapters on these). Phi-3
# fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`: the Llama names would
# silently miss them. Other families fall back to peft's "all-linear".
# The fitted learning rate (`TrainSettings.rate_for`): bench/trainer/learn_offline.py's best for
# SmolLM2-135M (CISPO, rank 16), scaled by the width it was measured at.
FITTED_RATE, FITTED_WIDTH = 5e-4, 576

_LLAMA = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TARGETS = {
    **{
        family: _LLAMA
        for family in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "granite")
    },
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
}


class TrainSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    base_model: Path | None = Field(None, description="model directory (default: bundled)")
    checkpoints_dir: Path = Field(Path("checkpoints"), description="where adapters are written")

    # Which groups a snapshot takes.
    max_groups: int = Field(64, ge=1, description="groups per training run")
    min_spread: float = Field(1e-6, ge=0, description="skip groups whose rewards span less")
    max_staleness: int = Field(
        1, ge=0, description="train on groups sampled up to this many checkpoints back"
    )

    # The objective. CISPO by default: on the offline benchmark (docs/benchmarks.md) PPO's
    # clip, against a sampler the policy leaves within a run, stopped most of the learning.
    loss: Literal["ppo", "cispo"] = Field(
        "cispo", description="cispo: ratio-weighted, capped at the top; ppo: clipped"
    )
    eps_low: float = Field(0.2, ge=0, le=1, description="ppo: the ratio's clip below 1")
    eps_high: float = Field(0.2, ge=0, description="ppo: the ratio's clip above 1")
    cispo_max_weight: float = Field(
        5.0, gt=0, description="cispo: the cap on a token's ratio weight (no floor)"
    )
    dual_clip: float = Field(
        3.0,
        gt=1,
        description="with a negative advantage, a token's loss stops growing past this ratio",
    )
    normalize_std: bool = Field(
        False,
        description="divide advantages by the group's std (off: Dr. GRPO, judge noise stays small)",
    )
    std_floor: float = Field(
        0.1, ge=0, description="with normalize_std: the smallest std advantages are divided by"
    )
    max_logprob_gap: float = Field(
        1.0,
        gt=0,
        description="skip a group whose mean |policy - sampler| logprob per token, when first "
        "seen, is above this (nats): another model, tokenizer or template sampled it",
    )
    kl_beta: float = Field(0.0, ge=0, description="KL to the base model (k3); 0 = off")
    kl_budget: float | None = Field(
        None,
        gt=0,
        description="the run's trust region: KL per token (k3) to the base model and to the "
        "run's starting policy that no step it keeps exceeds (a step past it is undone and "
        "the learning rate halved; the third stops the run). None: half of "
        "loop.max_kl_to_base where the server starts the run, else unbounded",
    )
    kl_own_prompts: int = Field(
        4,
        ge=0,
        description="distinct prompts the policy answers itself (32 tokens each) for its KL "
        "to the base model and to the run's start on its own samples: what the trust region "
        "holds and the release's KL guard reads (kl_to_base_own); 0 = the sampler's tokens "
        "alone, reweighted",
    )

    # The optimisation.
    learning_rate: float | None = Field(
        None,
        gt=0,
        description="none: fitted to the model's width, 5e-4 x 576 / hidden_size (the rate "
        "bench/trainer/learn_offline.py measured best for SmolLM2-135M, hidden size 576, with a "
        "rank-16 LoRA; about 7e-5 for a 4096-wide 8B model)",
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description="optimizer steps over which the learning rate rises linearly to "
        "learning_rate (step k of n at k/n of it); 0 = the full rate from the first step",
    )
    keep_optimizer_state: bool = Field(
        True,
        description="continue the parent checkpoint's AdamW moments (saved beside each "
        "adapter as optimizer.pt) instead of starting each run's optimizer from nothing",
    )
    epochs: int = Field(1, ge=1, description="passes over the snapshot")
    groups_per_step: int = Field(2, ge=1, description="groups accumulated per optimizer step")
    max_batch_tokens: int = Field(
        1024,
        ge=64,
        description="tokens per packed forward (attention memory grows with its square)",
    )
    max_tokens_per_member: int = Field(
        16384,
        ge=64,
        description="skip (and say) members longer than this: one member is one forward",
    )
    max_grad_norm: float = Field(1.0, gt=0)
    gradient_checkpointing: bool = Field(False, description="less memory, more compute")
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(
        None,
        ge=1,
        description="torch CPU threads; none: in the loop, half the host's cores (at least "
        "1), a local engine serving on the others while the run trains (docs/training.md, "
        '"Sharing the host"); a run of its own (`onjob train`), torch\'s choice',
    )
    nice: int = Field(
        0,
        ge=0,
        le=19,
        description="the run's CPU priority below the server's and the engine's (Unix nice): "
        "training is batch work, serving is not",
    )
    idle: bool = Field(
        False,
        description="the run at the CPU's idle priority (Linux SCHED_IDLE: it runs only "
        "while nothing else would); the loop sets it when it trains beside an engine on this "
        "host that keeps its own threads (vLLM), whose every batch would otherwise wait for "
        "the core the run holds",
    )
    seed: int = 0
    max_minutes_per_day: float | None = Field(
        None,
        ge=0,
        description="training minutes per UTC day (the runs recorded since 00:00 UTC); when "
        "spent, the loop starts no run until 00:00 UTC and the groups wait (none: no limit)",
    )

    # A warm start for what the policy rarely samples: supervised passes on each group's
    # best member (rejection-sampling fine-tuning) before the GRPO steps.
    sft_epochs: int = Field(0, ge=0, description="supervised passes on best members first")
    sft_learning_rate: float = Field(1e-4, gt=0)

    # The adapter. The trainer's forwards run without dropout (LoRA's or the model's): the
    # importance ratio must be exactly 1 before the first step.
    lora_rank: Literal[1, 8, 16, 32, 64, 128, 256] = Field(16, description="vLLM's allowed ranks")
    lora_alpha: int = Field(32, ge=1)
    target_modules: list[str] | None = Field(None, description="default: per architecture")
    max_lora_rank: int = Field(
        64,
        ge=1,
        description="the serving engine's max_lora_rank: a larger lora_rank is refused here, "
        "not when the engine loads the adapter",
    )

    wandb_project: str | None = Field(None, description="log to W&B when wandb is installed")

    # Where runs happen and where checkpoints go beyond this host.
    runner: Literal["local", "job"] = Field(
        "local",
        description='"local": each run is a child process of the server; "job": the server '
        "submits the snapshot to trainer.bucket and waits for a training job on another host "
        "(`onjob train --jobs s3://...`) to publish the checkpoint",
    )
    bucket: str | None = Field(
        None,
        description="s3://name/prefix: training jobs' snapshots (snapshots/) and published "
        "checkpoints (checkpoints/, which engines' adapter_bucket names); with it every "
        "checkpoint is published, whichever runner trained it. The endpoint and credentials "
        "come from boto3's usual chain (AWS_ENDPOINT_URL for MinIO or another S3 API)",
    )
    job_timeout_s: float = Field(
        6 * 3600.0,
        gt=0,
        description='runner "job": how long the server waits for a submitted run\'s checkpoint',
    )
    served_base: str | None = Field(
        None,
        description="the model engines are started with (`onjob engine --model`, vLLM's "
        "`model` argument), written as each adapter's base_model_name_or_path: vLLM's LoRA "
        "resolver and the local engine's load an adapter by name only when it equals their "
        "own; unset: the base model's directory as the trainer sees it",
    )

    @model_validator(mode="after")
    def _job_needs_a_bucket(self) -> TrainSettings:
        if self.runner == "job" and not self.bucket:
            raise ValueError('trainer.runner = "job" needs trainer.bucket (s3://name/prefix)')
        return self

    @model_validator(mode="after")
    def _rank_the_engine_serves(self) -> TrainSettings:
        if self.lora_rank > self.max_lora_rank:
            raise ValueError(
                f"trainer.lora_rank {self.lora_rank} is above trainer.max_lora_rank "
                f"{self.max_lora_rank} (the engine's --max-lora-rank): the engine would "
                "refuse the adapter"
            )
        return self

    def rate_for(self, hidden_size: int) -> float:
        """The learning rate a run uses: the set one, or the one fitted to the model's width
        (Adam's steps on a LoRA's matrices move a layer's output in proportion to its width,
        so wider models take proportionally smaller rates)."""
        return self.learning_rate or FITTED_RATE * FITTED_WIDTH / hidden_size
