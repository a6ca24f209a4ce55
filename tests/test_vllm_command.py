"""`onjob engine --backend vllm`: the `vllm serve` command it builds."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from onjob.engine import EngineSettings, vllm


def test_command_enables_runtime_lora_and_logprobs():
    settings = EngineSettings(backend="vllm", port=9000, max_lora_rank=16, max_loras=3)
    argv, env = vllm.command(settings, "/models/base")
    assert argv[:3] == ["vllm", "serve", "/models/base"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert "--enable-lora" in argv
    assert argv[argv.index("--port") + 1] == "9000"
    assert argv[argv.index("--max-lora-rank") + 1] == "16"
    assert argv[argv.index("--max-loras") + 1] == "3"
    assert argv[argv.index("--max-logprobs") + 1] == "20"
    assert flags["--host"] == "127.0.0.1"
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


@pytest.mark.parametrize(("rank", "allowed"), [(1, 1), (4, 8), (8, 8), (20, 32), (300, 320)])
def test_lora_rank_rounds_up_to_a_value_vllm_accepts(rank, allowed):
    assert vllm.lora_rank(rank) == allowed


def test_lora_rank_above_vllms_maximum_is_refused():
    with pytest.raises(ValueError, match="maximum"):
        vllm.lora_rank(1024)


def test_preloaded_adapters_and_context_length_are_passed_on():
    settings = EngineSettings(
        backend="vllm", lora_modules=["a=/ckpt/a", "b=/ckpt/b"], max_model_len=4096
    )
    argv, _ = vllm.command(settings, "m")
    i = argv.index("--lora-modules")
    assert argv[i + 1 : i + 3] == ["a=/ckpt/a", "b=/ckpt/b"]
    assert argv[argv.index("--max-model-len") + 1] == "4096"


def test_cli_dry_run_prints_the_command_and_env():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "onjob.cli",
            "engine",
            "--backend",
            "vllm",
            "--dry-run",
            "--model",
            "/m",
            "--port",
            "8123",
            "--max-lora-rank",
            "10",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    words = shlex.split(out.stdout)
    assert words[0] == "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
    assert words[1:4] == ["vllm", "serve", "/m"]
    assert words[words.index("--max-lora-rank") + 1] == "16"
    assert words[words.index("--port") + 1] == "8123"


def test_cli_without_vllm_installed_says_how_to_get_it():
    out = subprocess.run(
        [sys.executable, "-m", "onjob.cli", "engine", "--backend", "vllm", "--model", "/m"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    assert "onjob[vllm]" in out.stderr
