"""Engine settings: defaults, then `ONJOB_ENGINE_*` variables, then command-line flags."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONJOB_ENGINE_", extra="ignore")

    backend: Literal["local", "vllm"] = "local"
    model: str | None = Field(None, description="local model directory; the bundled model if unset")
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8001
    max_batch_size: int = Field(16, ge=1, description="rows (choices) decoded together")
    max_model_len: int | None = None
    default_max_tokens: int = Field(512, ge=1)
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, ge=1, description="torch threads (default: torch's choice)")
    lora_modules: list[str] = Field(default_factory=list, description="NAME=PATH loaded at start")
    # vLLM only.
    max_lora_rank: int = 64
    max_loras: int = 4
    gpu_memory_utilization: float = 0.9
    vllm_args: list[str] = Field(default_factory=list)
