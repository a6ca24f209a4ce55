"""DuckDB's extensions from the installed packages, never from the network.

`INSTALL` fetches an extension from DuckDB's servers, which a production host may not
reach; PyPI's `duckdb-extension-<name>` wheels (the `lake` extra) carry each one's file,
built for one DuckDB release, at `duckdb_extension_<name>/extensions/v<release>/`. `load`
finds that file and `LOAD`s it by path. An extension built for another release does not
load (one of 1.5.5 kills a 2.0 process), so the release is checked before DuckDB sees it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import duckdb

from .errors import CollectorError

# The extensions the DuckLake back end needs: the catalog's (`ducklake`), a Postgres
# catalog's client (`postgres_scanner`, loaded as `postgres`), S3 (`httpfs`).
PACKAGES = {
    "ducklake": "duckdb_extension_ducklake",
    "postgres": "duckdb_extension_postgres_scanner",
    "postgres_scanner": "duckdb_extension_postgres_scanner",
    "httpfs": "duckdb_extension_httpfs",
}


class ExtensionMissing(CollectorError):
    """An extension's package is not installed, or was built for another DuckDB."""


def path(name: str) -> Path:
    """The extension file `name` of the installed package, for this DuckDB release."""
    package = PACKAGES.get(name, f"duckdb_extension_{name}")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        wheel = package.replace("_", "-")
        raise ExtensionMissing(
            f"DuckDB's {name} extension is not installed: pip install '{wheel}=="
            f"{duckdb.__version__}' (or onjob's `lake` extra)"
        )
    root = Path(next(iter(spec.submodule_search_locations))) / "extensions"
    release = f"v{duckdb.__version__}"
    found = sorted(root.glob(f"{release}/*.duckdb_extension"))
    if not found:
        built = sorted(p.name for p in root.glob("v*")) or ["none"]
        raise ExtensionMissing(
            f"the installed {package} holds DuckDB's {name} extension for "
            f"{', '.join(built)}, not for this DuckDB ({release}): install the package of "
            f"DuckDB's release, {package.replace('_', '-')}=={duckdb.__version__}"
        )
    return found[0]


def load(con: duckdb.DuckDBPyConnection, *names: str) -> None:
    """`LOAD` each extension into `con` from its installed package."""
    for name in names:
        file = path(name)
        con.execute(f"LOAD '{_quoted(str(file))}'")


def _quoted(text: str) -> str:
    return text.replace("'", "''")
