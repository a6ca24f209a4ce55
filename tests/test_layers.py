"""The layers hold at run time too: the proxy host's packages start without the training
stack (import-linter checks the imports as written; this checks what Python loads)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "package",
    [
        "onjob.proxy",
        "onjob.collector",
        "onjob.judge",
        "onjob.deploy",
        "onjob.dashboard",
        "onjob.client",
    ],
)
def test_package_imports_without_torch(package):
    # Import every module of the package, not just its __init__, in a fresh interpreter.
    code = (
        "import importlib, pkgutil, sys\n"
        f"pkg = importlib.import_module({package!r})\n"
        "for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "    importlib.import_module(m.name)\n"
        "heavy = sorted(n for n in ('torch', 'transformers', 'peft') if n in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"{package} loaded {out}"


def test_cli_help_loads_no_torch():
    # `onjob --help` and every other verb's parser stay light: torch only in the engine/trainer.
    code = (
        "import sys\nfrom onjob.cli.main import build_parser\nbuild_parser()\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
