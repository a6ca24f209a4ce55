"""The `vllm serve` command for onjob: runtime LoRA loading on, logprobs and token ids on.

vLLM is not importable on CPU machines; this module only builds and runs its
command line (vLLM's documented CLI), so it is tested by what it builds.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
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


# The oldest vLLM onjob starts: 0.11 and 0.12 drop a streamed chunk's token ids and
# logprobs whenever a tool or reasoning parser holds its text back (onjob always starts a
# tool parser), so streamed answers were recorded short (docs/engines.md).
MIN_VERSION = (0, 13)

# Without --max-model-len vLLM takes the model's whole context, and refuses to start
# when the KV cache of one sequence that long does not fit (Llama-3.1-8B at 131,072
# tokens: 16 GiB). onjob caps the default here; `max_model_len` raises it.
DEFAULT_MAX_MODEL_LEN = 32768

# Variables vLLM reads that would undo what onjob sets up, removed from its environment:
# VLLM_API_KEY makes it demand a token onjob never sends (every request 401, the replica
# DOWN); an inherited VLLM_LORA_RESOLVER_* makes it load unknown adapter names by itself
# from a directory onjob knows nothing of (vllm/envs.py, vllm/lora/resolver.py). The
# resolver is onjob's to switch on, from `adapter_cache_dir` alone (`command`).
_STRIPPED = ("VLLM_API_KEY",)
_STRIPPED_PREFIXES = ("VLLM_LORA_RESOLVER_",)

# vLLM's general plugins that resolve adapter names: its filesystem resolver (a directory)
# and onjob's (`vllm_plugin.py`: that directory filled from the bucket). With VLLM_PLUGINS
# unset vLLM loads every installed plugin; a list the user set gets these added.
RESOLVER_PLUGINS = ("lora_filesystem_resolver", "onjob_adapters")
BUCKET_VARIABLE = "ONJOB_ENGINE_ADAPTER_BUCKET"


def environment(base: Mapping[str, str], extra: Mapping[str, str]) -> tuple[dict, list[str]]:
    """vLLM's environment: `base` (onjob's own) without what would undo onjob's set-up,
    plus `extra`; and the names removed, to say so."""
    removed = sorted(k for k in base if k in _STRIPPED or k.startswith(_STRIPPED_PREFIXES))
    env = {k: v for k, v in base.items() if k not in removed}
    plugins = env.get("VLLM_PLUGINS")
    if "VLLM_LORA_RESOLVER_CACHE_DIR" in extra and plugins is not None:
        named = [p for p in plugins.split(",") if p]
        env["VLLM_PLUGINS"] = ",".join([*named, *(p for p in RESOLVER_PLUGINS if p not in named)])
    return {**env, **extra}, removed


def installed_version() -> str | None:
    """The vLLM that `vllm serve` will run: its package's metadata in this environment,
    else what `vllm --version` prints (a vllm command installed elsewhere)."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        out = subprocess.run(["vllm", "--version"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[-1].strip() if out.returncode == 0 and lines else None


def check_version(version: str | None) -> None:
    """Refuse a vLLM older than MIN_VERSION, or one whose version cannot be read."""
    minimum = ".".join(map(str, MIN_VERSION))
    found = re.match(r"\s*v?(\d+)\.(\d+)", version or "")
    if found is None:
        raise LaunchError(
            f"cannot tell which vLLM is installed (`vllm --version` said {version!r}); "
            f"onjob needs vLLM >= {minimum}: `pip install 'onjob[vllm]'`"
        )
    if (int(found[1]), int(found[2])) < MIN_VERSION:
        raise LaunchError(
            f"vLLM {version.strip()} is older than {minimum}, the first release that keeps a "
            "streamed chunk's token ids and logprobs when its tool or reasoning parser holds "
            "the text back: streamed answers would be recorded short. Upgrade: "
            "`pip install 'onjob[vllm]'`"
        )


# From 0.20, vLLM's `mistral` tool parser with a Mistral tekken tokenizer of v11 or later
# decodes every chat request under a Lark grammar, tools or not (vllm/parser/mistral.py
# `adjust_request`, called for every request by vllm/renderers/online_renderer.py; 0.19
# has no such grammar): every answer's logprobs would be the masked distribution's.
MISTRAL_GRAMMAR_SINCE = (0, 20)


def check_mistral_grammar(settings: EngineSettings, model: str, version: str | None) -> None:
    """Refuse what would decode every request under vLLM's Mistral grammar (above): the
    `mistral` tool parser, vLLM >= 0.20, and the Mistral tokenizer (vLLM's choice for a
    model with `tekken.json` unless `--tokenizer-mode` says otherwise) of v11 or later,
    or one whose version cannot be read (a hub id)."""
    found = re.match(r"\s*v?(\d+)\.(\d+)", version or "")
    if found is None or (int(found[1]), int(found[2])) < MISTRAL_GRAMMAR_SINCE:
        return
    try:
        parser = tool_parsers.choose(model, settings.tool_call_parser)
    except tool_parsers.UnknownFamily:
        return  # refused by `command` with its own message
    if parser != "mistral" or _flag(settings.vllm_args, "--tokenizer-mode") not in (
        None,
        "auto",
        "mistral",
    ):
        return
    tekken = _tekken_version(Path(model))
    if tekken is not None and tekken < 11:
        return
    which = f"a v{tekken} tekken tokenizer" if tekken else "a tokenizer onjob cannot read"
    raise LaunchError(
        f"vLLM {version.strip()} with the `mistral` tool parser and {model} ({which}) "
        "decodes every chat request under a grammar, so every answer's logprobs would be "
        "the masked distribution's and none could be trained on. Start vLLM with the "
        "Hugging Face tokenizer (add `--tokenizer-mode hf` to vllm_args, "
        "ONJOB_ENGINE_VLLM_ARGS), or use vLLM 0.13 to 0.19."
    )


def _tekken_version(model: Path) -> int | None:
    """The version of the model's `tekken.json` (its `config.version`, "v11"), 0 when the
    model has none (a directory without it: vLLM's HF tokenizer), None when unknown."""
    if not model.is_dir():
        return None
    try:
        config = json.loads((model / "tekken.json").read_text())
    except FileNotFoundError:
        return 0
    except (OSError, ValueError):
        return None
    found = re.fullmatch(r"v(\d+)", str((config.get("config") or {}).get("version", "")))
    return int(found[1]) if found else None


def _flag(args: list[str], name: str) -> str | None:
    """The value of `name` in `args` (`--name value` or `--name=value`), or None."""
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag == name:
            return value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return None


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
    if length := max_model_len(settings, model):
        argv += ["--max-model-len", str(length)]
    if settings.lora_modules:
        argv += ["--lora-modules", *settings.lora_modules]
    _one_api_server(settings.vllm_args)
    argv += settings.vllm_args
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    if settings.adapter_cache_dir is not None:
        # The resolver, opted into: a name vLLM does not serve is looked up in this
        # directory (and fetched into it from the bucket) on its first request.
        env["VLLM_LORA_RESOLVER_CACHE_DIR"] = str(settings.adapter_cache_dir)
        if settings.adapter_bucket:
            env[BUCKET_VARIABLE] = settings.adapter_bucket
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


def _config(model: Path) -> dict:
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    # Multimodal checkpoints keep the language model's numbers in `text_config`.
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def max_model_len(settings: EngineSettings, model: str) -> int | None:
    """The context vLLM is started with: `max_model_len` when set, else the model's own
    capped at DEFAULT_MAX_MODEL_LEN; None (vLLM's choice) when the model's is unknown."""
    if settings.max_model_len:
        return settings.max_model_len
    context = _config(Path(model)).get("max_position_embeddings")
    if isinstance(context, int) and context > DEFAULT_MAX_MODEL_LEN:
        return DEFAULT_MAX_MODEL_LEN
    return None


def _kv_bytes_per_token(model: Path) -> int:
    """K and V of every layer for one token, in the 16 bits vLLM serves them in; 0 when the
    config does not say (a hub id, an attention vLLM sizes otherwise). Every layer is
    counted at full length: a model with sliding-window layers needs less."""
    c = _config(model)
    layers, heads = c.get("num_hidden_layers"), c.get("num_attention_heads")
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or (c.get("hidden_size") or 0) // (heads or 1)
    if not all(isinstance(v, int) and v > 0 for v in (layers, kv_heads, head_dim)):
        return 0
    return 2 * layers * kv_heads * head_dim * 2


def check_memory(
    settings: EngineSettings, model: str, card_bytes: int, free_bytes: int | None = None
) -> None:
    """Refuse, before vLLM loads anything and fails with an error that names none of
    onjob's settings, what vLLM itself refuses at start: a GPU share that cannot hold the
    weights plus the KV cache of one sequence of the context it is started with, and a
    share larger than the memory free now (a trainer or an old engine holding the card)."""
    share = settings.gpu_memory_utilization * card_bytes
    if free_bytes is not None and free_bytes < share:
        raise LaunchError(
            f"gpu_memory_utilization {settings.gpu_memory_utilization:g} of this "
            f"{_gib(card_bytes)} GiB GPU is {_gib(share)} GiB, but only {_gib(free_bytes)} "
            "GiB are free (another process holds the rest: a trainer, or an engine left "
            "running; `nvidia-smi` names it), and vLLM takes its whole share at start: "
            "free the card or lower gpu_memory_utilization (--gpu-memory-utilization, "
            "ONJOB_ENGINE_GPU_MEMORY_UTILIZATION)"
        )
    if any(
        a.startswith(("--tensor-parallel", "-tp", "--pipeline-parallel", "-pp"))
        for a in settings.vllm_args
    ):
        return  # the weights and the cache are split across cards
    weights = _weights_bytes(Path(model))
    length = max_model_len(settings, model) or _config(Path(model)).get("max_position_embeddings")
    per_token = _kv_bytes_per_token(Path(model))
    kv = per_token * length if isinstance(length, int) else 0
    if weights and weights + kv >= share:
        fits = int((share - weights) // per_token) if per_token and share > weights else 0
        raise LaunchError(
            f"{model}'s weights ({_gib(weights)} GiB) and the KV cache of one "
            f"{length or 0}-token sequence ({_gib(kv)} GiB) do not fit in "
            f"gpu_memory_utilization {settings.gpu_memory_utilization:g} of this "
            f"{_gib(card_bytes)} GiB GPU ({_gib(share)} GiB): raise gpu_memory_utilization "
            "(--gpu-memory-utilization, ONJOB_ENGINE_GPU_MEMORY_UTILIZATION) and run the "
            "trainer on another card or host, "
            + (f"lower max_model_len (--max-model-len; at most ~{fits} fits), " if fits else "")
            + "or serve a smaller model"
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


def _card_bytes() -> tuple[int, int] | None:
    """The first visible GPU's memory, total and free, from nvidia-smi; None when it
    cannot say."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    if not visible.isdigit() or shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run([*query, "-i", visible], capture_output=True, text=True, timeout=10)
        total, free = out.stdout.replace(",", " ").split()[:2]
        return (int(total) * 2**20, int(free) * 2**20) if out.returncode == 0 else None
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
    version = installed_version()
    check_version(version)
    argv, extra = command(settings, model)
    check_mistral_grammar(settings, model, version)
    if (card := _card_bytes()) is not None:
        check_memory(settings, model, *card)
    if settings.adapter_cache_dir is not None:  # vLLM refuses a resolver directory that is not
        settings.adapter_cache_dir.mkdir(parents=True, exist_ok=True)
    env, removed = environment(os.environ, extra)
    if removed:
        print(
            f"onjob engine: not passed to vLLM: {', '.join(removed)} (onjob sends no API key "
            "to its engine; adapters by name come from --adapter-cache-dir alone)",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)
