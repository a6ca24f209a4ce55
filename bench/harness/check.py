"""`make lint`'s check that bench/ uses only onjob's public names (and examples/').

import-linter sees modules, not names, so this reads each file's syntax tree and reports:

- `from onjob.x import _y`, and any import of a private module (`import onjob.x._y`,
  `from onjob._x import y`);
- `name._attr`, read or assigned, where `name` came from an onjob import (`from onjob.x
  import m`, `import onjob.x as m`, `onjob.x._y`) or was assigned from an expression built
  on one (`c = Collector(...)`, `store = c.store`), or is a parameter annotated with one;
- `setattr` / `getattr` / `delattr` / `monkeypatch.setattr` of a private name on such an
  object.

A private name starts with one underscore (dunders such as `__version__` are public).
`self` and `cls` are never onjob objects here. It is a syntactic check, so it errs on the
side of asking: give the package a public name with a docstring rather than reach past it.

    .venv/bin/python -m bench.harness.check [PATH ...]   # default: bench/; exit 1 on a finding
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# The project's own packages: the product, and the example agents its benches drive.
PACKAGES = ("onjob", "examples")


def _onjob(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in PACKAGES


def _root(node: ast.AST) -> str | None:
    """The name an expression is built on: `a` of `a.b(c).d[0]`."""
    while True:
        if isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Await):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return [n for e in node.elts for n in _targets(e)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


def _onjob_names(tree: ast.AST) -> set[str]:
    """Names bound to onjob modules or objects, and names assigned from them (to a fixpoint)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _onjob(alias.name):
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and _onjob(node.module):
            names.update(alias.asname or alias.name for alias in node.names)
    while True:
        before = len(names)
        for node in ast.walk(tree):
            pairs: list[tuple[list[str], ast.AST]] = []
            if isinstance(node, ast.Assign):
                pairs = [(_targets(t), node.value) for t in node.targets]
            elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
                if node.value is not None:
                    pairs = [(_targets(node.target), node.value)]
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                pairs = [(_targets(node.optional_vars), node.context_expr)]
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                pairs = [(_targets(node.target), node.iter)]
            elif isinstance(node, ast.arg) and node.annotation is not None:
                pairs = [([node.arg], node.annotation)]
            for targets, value in pairs:
                if _root(value) in names:
                    names.update(targets)
        names -= {"self", "cls"}
        if len(names) == before:
            return names


def problems(source: str, filename: str = "<string>") -> list[str]:
    """Every use of a private onjob name in `source`, as `file:line: what`."""
    tree = ast.parse(source, filename)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _onjob(alias.name) and any(map(_private, alias.name.split("."))):
                    found.append((node.lineno, f"imports private module {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and _onjob(node.module):
            if any(map(_private, node.module.split("."))):
                found.append((node.lineno, f"imports from private module {node.module}"))
            for alias in node.names:
                if _private(alias.name):
                    found.append((node.lineno, f"imports private {node.module}.{alias.name}"))
    names = _onjob_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _root(node) in names:
            verb = "assigns" if isinstance(node.ctx, ast.Store | ast.Del) else "uses"
            found.append((node.lineno, f"{verb} private {ast.unparse(node)}"))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            name = node.args[1]
            if (
                called in ("setattr", "getattr", "delattr")
                and isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and _private(name.value)
                and _root(node.args[0]) in names
            ):
                found.append((node.lineno, f"{called} of private {name.value!r}"))
    return [f"{filename}:{line}: {what}" for line, what in sorted(set(found))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[Path("bench")])
    paths = parser.parse_args(argv).paths
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")))
    found = [line for f in files for line in problems(f.read_text(), str(f))]
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} uses of onjob's private names under bench/: use public ones")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
