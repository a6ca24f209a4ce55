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


def test_every_exception_onjob_defines_hangs_under_one_root():
    # Every module imported (the engine's and the trainer's too: torch is there), then
    # each exception class defined in onjob checked against the root.
    code = (
        "import importlib, inspect, pkgutil, onjob\n"
        "from onjob.errors import OnjobError\n"
        "outside = []\n"
        "for m in pkgutil.walk_packages(onjob.__path__, 'onjob.'):\n"
        "    if m.name.endswith(('vllm_plugin', '__main__')):\n"
        "        continue  # runs inside vLLM's process; runs the CLI\n"
        "    module = importlib.import_module(m.name)\n"
        "    for name, cls in inspect.getmembers(module, inspect.isclass):\n"
        "        if cls.__module__ == m.name and issubclass(cls, BaseException) \\\n"
        "                and not issubclass(cls, OnjobError):\n"
        "            outside.append(f'{m.name}.{name}')\n"
        "print(','.join(sorted(outside)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out.split(",") == ["onjob.cli.stopping.Interrupted"]  # a signal, not an error


def test_rows_leave_the_collector_as_records_not_dicts():
    # `Store.dicts` is the collector's own: every other package reads rows as records
    # (`Store.rows`), values (`scalar`, `column`) or writes (`execute`), so a renamed
    # column is a TypeError where it is read, not a KeyError three modules away.
    # (`Collector.query(fn)` runs a function on the database thread: fine anywhere.)
    import ast
    from pathlib import Path

    def sql(node: ast.expr, constants: set[str]) -> bool:
        if isinstance(node, ast.Name):
            return node.id in constants
        return isinstance(node, ast.JoinedStr | ast.BinOp) or (
            isinstance(node, ast.Constant) and isinstance(node.value, str)
        )

    root = Path(__file__).parent.parent / "onjob"
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.is_relative_to(root / "collector"):
            continue
        tree = ast.parse(path.read_text())
        constants = {
            t.id
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant | ast.JoinedStr)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr == "dicts" or (
                node.func.attr == "query" and node.args and sql(node.args[0], constants)
            ):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert found == []
