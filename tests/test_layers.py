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


# Tables more than one module writes, each for its reason: the schema's migrations rewrite
# exchanges (V10's linear storage, V21's rebuild); the export queue is filled in a load's
# transaction and emptied by the export (and at a start that exports no more); a lake
# records its schema version where it is made, a file in its migrations.
SHARED_WRITERS = {
    "exchanges": {"collector/schema.py", "collector/store.py"},
    "export_queue": {"collector/store.py", "collector/export.py", "collector/loader.py"},
    "schema_version": {"collector/schema.py", "collector/lake.py"},
}


def test_each_table_has_one_writing_module():
    # Every INSERT, UPDATE, DELETE or MERGE onjob spells (in its SQL strings, docstrings
    # aside) names its table; a second module that writes one is a second place its
    # columns and rules live. `forget.py` deletes from every table a deletion reaches and
    # bench fakes in onjob/testing write what they stand in for: both left out.
    import ast
    import re
    from pathlib import Path

    write = re.compile(
        r"\b(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|UPDATE|DELETE\s+FROM|MERGE\s+INTO)\s+([a-z_]+)\b"
    )
    root = Path(__file__).parent.parent / "onjob"
    writers: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = str(path.relative_to(root))
        if module.startswith("testing/") or module == "collector/forget.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
            ):
                for table in write.findall(node.value):
                    writers.setdefault(table, set()).add(module)
    many = {t: m for t, m in writers.items() if len(m) > 1 and m != SHARED_WRITERS.get(t)}
    assert many == {}
    assert writers["checkpoints"] == {"deploy/act/registry.py"}
    assert writers["train_runs"] == {"deploy/act/runs.py"}
