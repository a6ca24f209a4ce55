"""The `vllm serve` command for onjob: runtime LoRA loading on, logprobs and token ids on.

vLLM is not importable on CPU machines; this module only builds and runs its
command line (vLLM's documented CLI), so it is tested by what it builds.
"""

from __future__ import annotations

import os
import shutil
import sys

from .settings import EngineSettings

# vLLM accepts only these values for --max-lora-rank.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class VLLMUnavailable(RuntimeError):
    pass


def lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts that holds adapters of rank `rank`."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's maximum {LORA_RANKS[-1]}")


def command(settings: EngineSettings, model: str) -> tuple[list[str], dict[str, str]]:
    """argv and the extra environment for `vllm serve`."""
    name = settings.served_model_name or model
    argv = [
        "vllm",
        "serve",
        model,
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--served-model-name",
        name,
        "--enable-lora",
        "--max-lora-rank",
        str(lora_rank(settings.max_lora_rank)),
        "--max-loras",
        str(settings.max_loras),
        "--max-logprobs",
        "20",
        "--gpu-memory-utilization",
        str(settings.gpu_memory_utilization),
        "--dtype",
        "auto" if settings.dtype == "float32" else settings.dtype,
    ]
    if settings.max_model_len:
        argv += ["--max-model-len", str(settings.max_model_len)]
    if settings.lora_modules:
        argv += ["--lora-modules", *settings.lora_modules]
    argv += settings.vllm_args
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    return argv, env


def run(settings: EngineSettings, model: str) -> int:
    argv, env = command(settings, model)
    if shutil.which("vllm") is None:
        raise VLLMUnavailable(
            "the vllm command is not installed: `pip install 'onjob[vllm]'` on a GPU host, "
            "or use the local engine (--backend local)"
        )
    sys.stdout.flush()
    os.execvpe(argv[0], argv, {**os.environ, **env})
