"""`onjob engine --backend vllm`: the `vllm serve` command it builds."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from pydantic import ValidationError

from onjob.engine import EngineSettings, vllm

from . import conftest

QWEN25 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "torch_dtype": "bfloat16"}
LLAMA31 = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
}
# SmolLM2, Llama 2, Llama 3.0: llama-type models with no tool-call format vLLM names.
PLAIN_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}


def model_dir(tmp_path, name: str, config: dict):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_command_enables_runtime_lora_and_logprobs(tmp_path):
    settings = EngineSettings(
        backend="vllm", port=9000, max_lora_rank=16, max_loras=3, max_cpu_loras=5
    )
    model = str(model_dir(tmp_path, "Qwen2.5-7B-Instruct", QWEN25))
    argv, env = vllm.command(settings, model)
    assert argv[:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    assert "--enable-lora" in argv
    assert flag(argv, "--port") == "9000"
    assert flag(argv, "--max-lora-rank") == "16"
    assert flag(argv, "--max-loras") == "3"
    assert flag(argv, "--max-cpu-loras") == "5"
    assert flag(argv, "--max-logprobs") == "20"
    assert flag(argv, "--host") == "127.0.0.1"
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def test_an_adapter_cache_smaller_than_a_batch_of_adapters_is_refused_by_name():
    with pytest.raises(ValueError, match=r"max_cpu_loras \(2\) must be at least max_loras \(3\)"):
        EngineSettings(backend="vllm", max_loras=3, max_cpu_loras=2)
    assert EngineSettings(backend="local", max_loras=3, max_cpu_loras=2).max_cpu_loras == 2


def test_logprobs_are_the_raw_distribution_and_sampling_defaults_are_not_the_models(tmp_path):
    model = str(model_dir(tmp_path, "m", QWEN25))
    argv, _ = vllm.command(EngineSettings(backend="vllm"), model)
    # log-softmax of the logits before temperature / top-p, as the local engine reports.
    assert flag(argv, "--logprobs-mode") == "raw_logprobs"
    # No temperature / top_p from generation_config.json for requests that omit them.
    assert flag(argv, "--generation-config") == "vllm"
    # Users first: onjob's own requests carry a background `priority`, honoured only so.
    assert flag(argv, "--scheduling-policy") == "priority"


@pytest.mark.parametrize(
    ("name", "config", "parser"),
    [
        ("Qwen2.5-7B-Instruct", QWEN25, "hermes"),
        ("Qwen3-8B", {"model_type": "qwen3"}, "hermes"),
        ("Qwen3-30B-A3B", {"model_type": "qwen3_moe"}, "hermes"),
        ("Qwen3-Coder-30B-A3B-Instruct", {"model_type": "qwen3_moe"}, "qwen3_coder"),
        ("Llama-3.1-8B-Instruct", LLAMA31, "llama3_json"),
        ("Llama-3.2-3B-Instruct", LLAMA31, "llama3_json"),
        ("Llama-4-Scout-17B-16E-Instruct", {"model_type": "llama4"}, "llama4_pythonic"),
        ("Mistral-7B-Instruct-v0.3", {"model_type": "mistral"}, "mistral"),
        ("Mixtral-8x7B-Instruct-v0.1", {"model_type": "mixtral"}, "mistral"),
        # The family comes from config.json, whatever the directory is called.
        ("base", QWEN25, "hermes"),
        (
            "base",
            {"model_type": "qwen3_moe", "_name_or_path": "Qwen/Qwen3-Coder-480B"},
            "qwen3_coder",
        ),
    ],
)
def test_tool_call_parser_is_chosen_from_the_models_family(tmp_path, name, config, parser):
    argv, _ = vllm.command(EngineSettings(backend="vllm"), str(model_dir(tmp_path, name, config)))
    assert "--enable-auto-tool-choice" in argv
    assert flag(argv, "--tool-call-parser") == parser


@pytest.mark.parametrize(
    ("hub_id", "parser"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "hermes"),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3_coder"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3_json"),
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", "llama3_json"),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "llama4_pythonic"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral"),
    ],
)
def test_a_hub_id_without_a_local_config_is_placed_by_its_name(hub_id, parser):
    argv, _ = vllm.command(EngineSettings(backend="vllm"), hub_id)
    assert flag(argv, "--tool-call-parser") == parser


@pytest.mark.parametrize("config", [PLAIN_LLAMA, {"model_type": "gemma2"}, {"model_type": "phi3"}])
def test_a_model_of_no_known_family_is_refused_at_start_naming_the_setting(tmp_path, config):
    model = str(model_dir(tmp_path, "SmolLM2-135M-Instruct", config))
    with pytest.raises(vllm.LaunchError, match="tool_call_parser") as refused:
        vllm.command(EngineSettings(backend="vllm"), model)
    assert "--tool-call-parser" in str(refused.value) and '"none"' in str(refused.value)


def test_a_configured_parser_wins_and_none_turns_tool_calling_off(tmp_path):
    llama = str(model_dir(tmp_path, "smol", PLAIN_LLAMA))
    argv, _ = vllm.command(EngineSettings(backend="vllm", tool_call_parser="pythonic"), llama)
    assert flag(argv, "--tool-call-parser") == "pythonic" and "--enable-auto-tool-choice" in argv
    qwen = str(model_dir(tmp_path, "qwen", QWEN25))
    argv, _ = vllm.command(EngineSettings(backend="vllm", tool_call_parser="none"), qwen)
    assert "--tool-call-parser" not in argv and "--enable-auto-tool-choice" not in argv


def test_a_reasoning_parser_is_passed_only_when_set(tmp_path):
    model = str(model_dir(tmp_path, "Qwen3-8B", {"model_type": "qwen3"}))
    argv, _ = vllm.command(EngineSettings(backend="vllm"), model)
    assert "--reasoning-parser" not in argv
    argv, _ = vllm.command(EngineSettings(backend="vllm", reasoning_parser="qwen3"), model)
    assert flag(argv, "--reasoning-parser") == "qwen3"


def test_vllm_takes_half_the_gpu_by_default_leaving_the_rest_to_the_trainer(tmp_path):
    model = str(model_dir(tmp_path, "m", QWEN25))
    argv, _ = vllm.command(EngineSettings(backend="vllm"), model)
    assert flag(argv, "--gpu-memory-utilization") == "0.5"
    argv, _ = vllm.command(EngineSettings(backend="vllm", gpu_memory_utilization=0.9), model)
    assert flag(argv, "--gpu-memory-utilization") == "0.9"
    for impossible in (0, 1.2):
        with pytest.raises(ValidationError, match="gpu_memory_utilization"):
            EngineSettings(backend="vllm", gpu_memory_utilization=impossible)


def _weights(path, gib: float, dtype: str = "bfloat16"):
    """A model directory whose (sparse) safetensors files hold `gib` GiB."""
    (path / "config.json").write_text(json.dumps({**QWEN25, "torch_dtype": dtype}))
    with open(path / "model-00001-of-00001.safetensors", "wb") as f:
        f.truncate(int(gib * 2**30))
    return str(path)


def test_a_gpu_share_too_small_for_the_weights_is_refused_before_vllm_starts(tmp_path):
    model = _weights(tmp_path, 15.2)  # a 7B model in bfloat16
    card = 24 * 2**30
    with pytest.raises(vllm.LaunchError, match=r"gpu_memory_utilization 0\.5") as refused:
        vllm.check_memory(EngineSettings(backend="vllm"), model, card)
    assert "15.2 GiB" in str(refused.value) and "24.0 GiB" in str(refused.value)
    vllm.check_memory(EngineSettings(backend="vllm", gpu_memory_utilization=0.9), model, card)
    vllm.check_memory(EngineSettings(backend="vllm"), model, 80 * 2**30)  # an H100 shares
    # Split across cards by tensor parallelism: not one card's business.
    tp = EngineSettings(backend="vllm", vllm_args=["--tensor-parallel-size", "2"])
    vllm.check_memory(tp, model, card)


def test_float32_weights_count_at_the_16_bits_vllm_serves_them_in(tmp_path):
    model = _weights(tmp_path, 20, dtype="float32")  # 10 GiB on the GPU
    vllm.check_memory(EngineSettings(backend="vllm"), model, 24 * 2**30)


@pytest.mark.parametrize(("rank", "allowed"), [(1, 1), (4, 8), (8, 8), (20, 32), (300, 320)])
def test_lora_rank_rounds_up_to_a_value_vllm_accepts(rank, allowed):
    assert vllm.lora_rank(rank) == allowed


def test_lora_rank_above_vllms_maximum_is_refused():
    with pytest.raises(ValueError, match="maximum"):
        vllm.lora_rank(1024)


def test_preloaded_adapters_and_context_length_are_passed_on(tmp_path):
    settings = EngineSettings(
        backend="vllm", lora_modules=["a=/ckpt/a", "b=/ckpt/b"], max_model_len=4096
    )
    argv, _ = vllm.command(settings, str(model_dir(tmp_path, "m", QWEN25)))
    i = argv.index("--lora-modules")
    assert argv[i + 1 : i + 3] == ["a=/ckpt/a", "b=/ckpt/b"]
    assert flag(argv, "--max-model-len") == "4096"


def onjob_engine(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onjob.cli", "engine", "--backend", "vllm", *args],
        capture_output=True,
        text=True,
    )


def test_cli_dry_run_prints_the_command_and_env(tmp_path):
    model = str(model_dir(tmp_path, "Qwen2.5-7B-Instruct", QWEN25))
    out = onjob_engine(
        "--dry-run", "--build", "gpu", "--model", model, "--port", "8123", "--max-lora-rank", "10",
        "--gpu-memory-utilization", "0.6", "--reasoning-parser", "qwen3",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout)
    assert words[0] == "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
    assert words[2:6] == ["-m", "vllm.entrypoints.openai.api_server", "--model", model]
    assert flag(words, "--max-lora-rank") == "16"
    assert flag(words, "--port") == "8123"
    assert flag(words, "--gpu-memory-utilization") == "0.6"
    assert flag(words, "--tool-call-parser") == "hermes"
    assert flag(words, "--reasoning-parser") == "qwen3"


def test_cli_refuses_a_model_of_no_known_family_once_at_start(tmp_path):
    model = str(model_dir(tmp_path, "smol", PLAIN_LLAMA))
    out = onjob_engine("--dry-run", "--model", model)
    assert out.returncode == 1 and out.stdout == ""
    assert "--tool-call-parser" in out.stderr and "Traceback" not in out.stderr
    out = onjob_engine("--dry-run", "--model", model, "--tool-call-parser", "none")
    assert out.returncode == 0 and "--enable-auto-tool-choice" not in out.stdout


def test_cli_without_vllm_installed_says_how_to_get_it(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "onjob.cli", "engine", "--backend", "vllm", "--model", "/m"],
        capture_output=True,
        text=True,
        env={**os.environ, "ONJOB_CACHE_DIR": str(tmp_path)},  # no vLLM virtualenv there
    )
    assert out.returncode == 1
    assert "`onjob engine install vllm`" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--api-server-count", "4"],
        ["--api-server-count=2"],
        ["-asc", "2"],
        # Recent vLLM starts one API server per data-parallel replica by default.
        ["--data-parallel-size", "2"],
        ["-dp=8"],
        ["-dp", "2", "--api-server-count", "2"],
    ],
)
def test_several_api_servers_behind_one_port_are_refused(tmp_path, args):
    """A runtime LoRA load reaches one API server process; the others would 404 on it."""
    model = str(model_dir(tmp_path, "m", QWEN25))
    with pytest.raises(vllm.LaunchError, match="one API server per engine"):
        vllm.command(EngineSettings(backend="vllm", vllm_args=args), model)


@pytest.mark.parametrize(
    "args",
    [
        ["--api-server-count", "1", "--enable-prefix-caching", "--tensor-parallel-size", "2"],
        ["--data-parallel-size", "2", "--api-server-count", "1"],
    ],
)
def test_one_api_server_and_other_vllm_args_pass_through(tmp_path, args):
    model = str(model_dir(tmp_path, "m", QWEN25))
    argv, _ = vllm.command(EngineSettings(backend="vllm", vllm_args=args), model)
    assert argv[-len(args) :] == args


def test_the_production_command_in_the_docs_is_what_dry_run_prints():
    out = onjob_engine(
        "--dry-run", "--build", "gpu", "--model", "/models/Qwen2.5-7B-Instruct", "--dtype",
        "bfloat16",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    docs = (Path(__file__).resolve().parents[1] / "docs" / "vllm.md").read_text()
    assert out.stdout.strip() in docs, "docs/vllm.md shows an old command"


LLAMA31_8B = {  # meta-llama/Llama-3.1-8B-Instruct's config.json, the numbers that size it
    **LLAMA31,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
}


def test_a_long_context_model_gets_a_capped_context_unless_one_is_set(tmp_path):
    """vLLM takes the model's whole context when --max-model-len is not given."""
    llama = str(model_dir(tmp_path, "llama", LLAMA31_8B))
    argv, _ = vllm.command(EngineSettings(backend="vllm"), llama)
    assert flag(argv, "--max-model-len") == str(vllm.DEFAULT_MAX_MODEL_LEN) == "32768"
    argv, _ = vllm.command(EngineSettings(backend="vllm", max_model_len=131072), llama)
    assert flag(argv, "--max-model-len") == "131072"
    # A context no longer than the cap, or unknown: vLLM's own choice.
    qwen = str(model_dir(tmp_path, "qwen", {**QWEN25, "max_position_embeddings": 32768}))
    assert "--max-model-len" not in vllm.command(EngineSettings(backend="vllm"), qwen)[0]


def test_the_memory_check_counts_the_kv_cache_of_one_max_length_sequence(tmp_path):
    """vLLM refuses to start when one sequence of max_model_len does not fit beside the
    weights (vllm/v1/core/kv_cache_utils.py `check_enough_kv_cache_memory`). Llama-3.1-8B
    keeps 128 KiB of K and V per token: 16 GiB at 131,072 tokens, 4 GiB at 32,768."""
    (tmp_path / "m").mkdir()
    model = _weights(tmp_path / "m", 15.0)
    (tmp_path / "m" / "config.json").write_text(json.dumps(LLAMA31_8B))
    card = 40 * 2**30  # an A100 40 GB
    whole = EngineSettings(backend="vllm", gpu_memory_utilization=0.7, max_model_len=131072)
    with pytest.raises(vllm.LaunchError, match="KV cache of one 131072-token") as refused:
        vllm.check_memory(whole, model, card)
    assert "16.0 GiB" in str(refused.value) and "--max-model-len; at most ~" in str(refused.value)
    # The default context (32,768: 4 GiB) fits in the same share.
    vllm.check_memory(EngineSettings(backend="vllm", gpu_memory_utilization=0.7), model, card)


def test_a_share_larger_than_the_free_memory_is_refused_naming_the_setting(tmp_path):
    """vLLM takes its whole share at start and refuses when less is free: a restart while
    the trainer holds half the card."""
    model = _weights(tmp_path, 1.0)
    card = 80 * 2**30
    with pytest.raises(vllm.LaunchError, match=r"only 30\.0 GiB are free") as refused:
        vllm.check_memory(EngineSettings(backend="vllm"), model, card, free_bytes=30 * 2**30)
    assert "gpu_memory_utilization" in str(refused.value)
    vllm.check_memory(EngineSettings(backend="vllm"), model, card, free_bytes=41 * 2**30)


FAKE_VLLM = """#!/bin/sh
# A stand-in for vLLM's interpreter: says which vLLM it has when probed (`-c`), or
# records how it was started.
if [ "$1" = "-c" ]; then echo "[\\"vllm\\", \\"$FAKE_VLLM_VERSION\\"]"; exit 0; fi
env > "$FAKE_VLLM_ENV"
exit 0
"""


def _fake_vllm(tmp_path, version: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").write_text(FAKE_VLLM)
    (bin_dir / "python").chmod(0o755)
    return {
        **os.environ,
        "ONJOB_ENGINE_VLLM_PYTHON": str(bin_dir / "python"),
        "FAKE_VLLM_VERSION": version,
        "FAKE_VLLM_ENV": str(tmp_path / "env"),
        "VLLM_API_KEY": "sk-inherited",
        "VLLM_LORA_RESOLVER_CACHE_DIR": "/somewhere",
        "VLLM_PLUGINS": "lora_filesystem_resolver",
    }


def _start(tmp_path, env: dict) -> subprocess.CompletedProcess:
    model = str(model_dir(tmp_path, "Qwen2.5-7B-Instruct", QWEN25))
    return subprocess.run(
        [sys.executable, "-m", "onjob.cli", "engine", "--backend", "vllm", "--model", model],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_vllm_without_the_streamed_token_fix_is_refused_at_start(tmp_path):
    out = _start(tmp_path, _fake_vllm(tmp_path, "0.12.0"))
    assert out.returncode == 1
    assert "vLLM 0.12.0 is older than 0.13" in out.stderr
    assert not (tmp_path / "env").exists()  # vllm serve never ran


def test_vllm_runs_without_the_inherited_api_key_and_lora_resolver(tmp_path):
    out = _start(tmp_path, _fake_vllm(tmp_path, "0.13.0"))
    assert out.returncode == 0, out.stderr
    started = dict(
        line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line
    )
    assert "VLLM_API_KEY" not in started
    assert not [k for k in started if k.startswith("VLLM_LORA_RESOLVER_")]
    assert started["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert started["VLLM_PLUGINS"] == "lora_filesystem_resolver"  # not onjob's to judge
    assert "not passed to vLLM: VLLM_API_KEY, VLLM_LORA_RESOLVER_CACHE_DIR" in out.stderr


MISTRAL = {"model_type": "mistral", "architectures": ["MistralForCausalLM"]}


def _mistral(tmp_path, tekken: str | None) -> str:
    path = model_dir(tmp_path, "Mistral-Small", MISTRAL)
    if tekken is not None:
        (path / "tekken.json").write_text(json.dumps({"config": {"version": tekken}}))
    return str(path)


def _start_model(tmp_path, model: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onjob.cli", "engine", "--backend", "vllm", "--model", model],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_mistral_tokenizer_that_vllm_decodes_every_request_under_a_grammar_is_refused(
    tmp_path,
):
    """vLLM >= 0.20 with the mistral parser and a tekken >= v11 tokenizer masks every
    answer's logprobs (vllm/parser/mistral.py, 0.20 and 0.33 read)."""
    out = _start_model(tmp_path, _mistral(tmp_path, "v13"), _fake_vllm(tmp_path, "0.20.0"))
    assert out.returncode == 1
    assert "decodes every chat request under a grammar" in out.stderr
    assert "--tokenizer-mode hf" in out.stderr
    assert not (tmp_path / "env").exists()  # vllm serve never ran


@pytest.mark.parametrize(
    ("tekken", "version", "args"),
    [
        ("v13", "0.19.0", []),  # before the grammar
        ("v7", "0.33.0", []),  # a tekken tokenizer the grammar does not take
        (None, "0.33.0", []),  # no tekken.json: vLLM's HF tokenizer
        ("v13", "0.33.0", ["--tokenizer-mode", "hf"]),
        ("v13", "0.33.0", ["--tokenizer-mode=slow"]),
    ],
)
def test_mistral_models_vllm_decodes_freely_start(tmp_path, tekken, version, args):
    env = {**_fake_vllm(tmp_path, version), "ONJOB_ENGINE_VLLM_ARGS": json.dumps(args)}
    out = _start_model(tmp_path, _mistral(tmp_path, tekken), env)
    assert out.returncode == 0, out.stderr


def test_a_mistral_hub_id_whose_tokenizer_cannot_be_read_is_refused():
    settings = EngineSettings(backend="vllm")
    with pytest.raises(vllm.LaunchError, match="a tokenizer onjob cannot read"):
        vllm.check_mistral_grammar(settings, "mistralai/Mistral-Small-3.2-24B", "0.33.0")
    vllm.check_mistral_grammar(settings, "mistralai/Mistral-Small-3.2-24B", "0.14.1")


def test_the_lora_resolver_is_onjobs_to_switch_on_from_its_own_setting(tmp_path):
    """An inherited VLLM_LORA_RESOLVER_CACHE_DIR is still dropped; --adapter-cache-dir sets
    onjob's, with the bucket its plugin fetches from, and adds both resolver plugins to a
    VLLM_PLUGINS list the user set (vLLM would load neither otherwise)."""
    cache = tmp_path / "adapters"
    model = str(model_dir(tmp_path, "Qwen2.5-7B-Instruct", QWEN25))
    out = subprocess.run(
        [sys.executable, "-m", "onjob.cli", "engine", "--backend", "vllm", "--model", model,
         "--adapter-cache-dir", str(cache), "--adapter-bucket", "s3://b/onjob/checkpoints"],
        capture_output=True, text=True, env=_fake_vllm(tmp_path, "0.13.0"), timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    started = dict(
        line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line
    )
    assert started["VLLM_LORA_RESOLVER_CACHE_DIR"] == str(cache) and cache.is_dir()
    assert started["ONJOB_ENGINE_ADAPTER_BUCKET"] == "s3://b/onjob/checkpoints"
    assert started["VLLM_PLUGINS"] == "lora_filesystem_resolver,onjob_adapters"
    assert started["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"  # vLLM asks resolvers only so
    assert "not passed to vLLM: VLLM_API_KEY, VLLM_LORA_RESOLVER_CACHE_DIR" in out.stderr


def test_without_the_setting_no_resolver_variable_reaches_vllm(tmp_path):
    settings = EngineSettings(backend="vllm")
    _, extra = vllm.command(settings, str(model_dir(tmp_path, "Qwen2.5-7B", QWEN25)))
    env, _ = vllm.environment({"VLLM_PLUGINS": "x"}, extra)
    assert not [k for k in env if "RESOLVER" in k] and env["VLLM_PLUGINS"] == "x"
    with pytest.raises(ValidationError, match="adapter_bucket needs adapter_cache_dir"):
        EngineSettings(backend="vllm", adapter_bucket="s3://b/p")


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]
NO_DESCRIPTION = {"type": "function", "function": {"name": "noop"}}


@pytest.mark.parametrize(
    ("messages", "tools"),
    [
        ([{"role": "user", "content": "hi"}], None),
        ([{"role": "user", "content": "hi"}], [NO_DESCRIPTION]),
        ([{"role": "developer", "content": "Terse."}, *HISTORY[1:]], None),
        (HISTORY, [*conftest.TOOLS, NO_DESCRIPTION]),
    ],
)
def test_the_template_vllm_gets_renders_as_the_local_engine_does(tokenizer, messages, tools):
    """vLLM renders with the model's template behind onjob's preamble (`tool_template`);
    the local engine with `chat.render`. The same text, so the same tokens, either way
    (tests/test_real_engines.py checks it on vLLM itself)."""
    from onjob.engine import chat
    from onjob.protocol.chat import Message
    from onjob.protocol.fields import Tool

    # A client sends a call's arguments as a JSON string (OpenAI refuses anything else, and
    # so does `onjob.protocol`); vLLM decodes them before its template runs
    # (vllm/entrypoints/chat_utils.py), so its side renders `messages` as written here.
    sent = [
        {**m, "tool_calls": [_as_sent(c) for c in m["tool_calls"]]} if "tool_calls" in m else m
        for m in messages
    ]
    local = chat.render(
        tokenizer,
        msgspec.convert(sent, list[Message]),
        msgspec.convert(tools, list[Tool]) if tools else None,
    )
    template = chat.hermes_template(tokenizer.chat_template)
    theirs = tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    assert theirs == local


def _as_sent(call: dict) -> dict:
    function = call["function"]
    return {**call, "function": {**function, "arguments": json.dumps(function["arguments"])}}


def test_a_model_whose_template_ignores_tools_gets_the_preamble_and_the_hermes_parser(
    bundled_dir,
):
    argv, _ = vllm.command(EngineSettings(backend="vllm"), str(bundled_dir))
    from onjob.engine import chat

    own = (bundled_dir / "chat_template.jinja").read_text()
    assert "tools" not in own
    assert Path(flag(argv, "--chat-template")).read_text() == chat.hermes_template(own)
    assert flag(argv, "--tool-call-parser") == "hermes"
    # A parser the user set wins, and then vLLM gets the model's own template.
    argv, _ = vllm.command(
        EngineSettings(backend="vllm", tool_call_parser="none"), str(bundled_dir)
    )
    assert "--chat-template" not in argv and "--enable-auto-tool-choice" not in argv


def test_on_cpu_vllm_gets_float32_its_kv_cache_and_every_core(bundled_dir):
    """vLLM's CPU build: the dtype asked for (float32, as the trainer), no GPU share, a KV
    cache of `cpu_kv_cache_gib`, and its worker bound to all the cores onjob may use (vLLM's
    own default keeps one back: half the speed on 2 cores), or to `threads` of them."""
    from onjob.engine import vllm_install

    cpu = vllm_install.Installed("/venv/bin/python", vllm_install.CPU, "0.32.0")
    argv, env = vllm.command(EngineSettings(backend="vllm"), str(bundled_dir), cpu)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(argv, "--dtype") == "float32" and "--gpu-memory-utilization" not in argv
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    cores = sorted(os.sched_getaffinity(0))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, cores))
    settings = EngineSettings(backend="vllm", threads=1, cpu_kv_cache_gib=1)
    _, env = vllm.command(settings, str(bundled_dir), cpu)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(cores[0])
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
