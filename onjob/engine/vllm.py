"""The `vllm serve` command for onjob: runtime LoRA loading on, logprobs and token ids on.

vLLM is not importable on CPU machines; this module only builds and runs its
command line (vLLM's documented CLI), so it is tested by what it builds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..logprobs import TRAINED
from . import tool_parsers
from .settings import EngineSettings

# vLLM accepts only these values for --max-lora-rank.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class LaunchError(Exception):
    """vLLM cannot be started as configured; the message says what to change."""


class VLLMUnavailable(LaunchError):
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
        # onjob's logprobs are the model's own distribution: log-softmax of the logits
        # before temperature, top-p or penalties (the trainer's importance ratios compare
        # them with its forward pass; `onjob.logprobs`). vLLM's default today, pinned
        # against a change.
        "--logprobs-mode",
        TRAINED,
        # A request without temperature / top_p samples at 1.0 / 1.0, as on the local
        # engine: with "auto" vLLM would take them from the model's generation_config.json.
        "--generation-config",
        "vllm",
        "--gpu-memory-utilization",
        str(settings.gpu_memory_utilization),
        "--dtype",
        "auto" if settings.dtype == "float32" else settings.dtype,
    ]
    try:
        parser = tool_parsers.choose(model, settings.tool_call_parser)
    except tool_parsers.UnknownFamily as exc:
        raise LaunchError(str(exc)) from exc
    if parser is not None:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    if settings.reasoning_parser:
        argv += ["--reasoning-parser", settings.reasoning_parser]
    if settings.max_model_len:
        argv += ["--max-model-len", str(settings.max_model_len)]
    if settings.lora_modules:
        argv += ["--lora-modules", *settings.lora_modules]
    _one_api_server(settings.vllm_args)
    argv += settings.vllm_args
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    return argv, env


# vllm serve's flags for API server processes and data-parallel replicas, with aliases.
_FLAGS = {
    "--api-server-count": "--api-server-count",
    "-asc": "--api-server-count",
    "--data-parallel-size": "--data-parallel-size",
    "-dp": "--data-parallel-size",
}


def _one_api_server(args: list[str]) -> None:
    """Refuse vLLM arguments that put several API server processes behind one port: a
    runtime LoRA load reaches only the process that answered it, so an adapter would be
    served by one process and unknown (404) to the others. `--api-server-count` defaults
    to `--data-parallel-size` in recent vLLM."""
    given = {}
    for i, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        if flag in _FLAGS:
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            given[_FLAGS[flag]] = int(value) if value.isdigit() else 1
    replicas = given.get("--data-parallel-size", 1)
    servers = given.get("--api-server-count", replicas)
    if servers > 1:
        flags = " ".join(f"{flag} {n}" for flag, n in given.items())
        raise LaunchError(
            f"{flags}: vLLM would run {servers} API server processes behind one port, and "
            "a LoRA adapter loaded at run time reaches only one of them. Run one API server "
            "per engine (--api-server-count 1) and scale with more engines."
        )


def check_memory(settings: EngineSettings, model: str, card_bytes: int) -> None:
    """Refuse a GPU share that cannot hold the model's weights, before vLLM loads them
    and fails with an out-of-memory error that names none of onjob's settings. Only the
    weights are checked (vLLM itself says when no room is left for the KV cache)."""
    if any(
        a.startswith(("--tensor-parallel", "-tp", "--pipeline-parallel", "-pp"))
        for a in settings.vllm_args
    ):
        return  # the weights are split across cards
    weights = _weights_bytes(Path(model))
    share = settings.gpu_memory_utilization * card_bytes
    if weights and weights >= share:
        raise LaunchError(
            f"{model}'s weights ({_gib(weights)} GiB) do not fit in gpu_memory_utilization "
            f"{settings.gpu_memory_utilization:g} of this {_gib(card_bytes)} GiB GPU "
            f"({_gib(share)} GiB): raise gpu_memory_utilization (--gpu-memory-utilization, "
            "ONJOB_ENGINE_GPU_MEMORY_UTILIZATION) and run the trainer on another card or "
            "host, or serve a smaller model"
        )


def _weights_bytes(model: Path) -> int:
    """The weights' size on the GPU; 0 when unknown (a hub id, no safetensors files)."""
    stored = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return stored
    # vLLM's --dtype auto serves float32 checkpoints in float16.
    dtype = config.get("torch_dtype") or config.get("dtype")
    return stored // 2 if dtype == "float32" else stored


def _card_bytes() -> int | None:
    """The first visible GPU's memory, from nvidia-smi; None when it cannot say."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    if not visible.isdigit() or shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run([*query, "-i", visible], capture_output=True, text=True, timeout=10)
        return int(out.stdout.split()[0]) * 2**20 if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f}"


def run(settings: EngineSettings, model: str) -> int:
    if shutil.which("vllm") is None:
        raise VLLMUnavailable(
            "the vllm command is not installed: `pip install 'onjob[vllm]'` on a GPU host, "
            "or use the local engine (--backend local)"
        )
    argv, env = command(settings, model)
    if (card := _card_bytes()) is not None:
        check_memory(settings, model, card)
    sys.stdout.flush()
    os.execvpe(argv[0], argv, {**os.environ, **env})
