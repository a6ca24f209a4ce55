"""Reading the database while `onjob serve` holds it: `onjob sql` and `onjob export`.

DuckDB lets one process open a file read-write, so users cannot open it beside the
server; the server answers their queries instead (admin API), and these functions are
what it runs, on a cursor of its own (`Collector.read`), or on a read-only connection
when no server holds the file.

What is read-only is decided by DuckDB, not by a pattern over the text: its parser must
find exactly one statement and call it a SELECT (`extract_statements`), and it runs in a
`BEGIN TRANSACTION READ ONLY` that is rolled back, so any write fails in DuckDB itself.
A SELECT can still read files (`read_csv('/etc/...')`, `FROM 'x.parquet'`): the query's
syntax tree (DuckDB's `json_serialize_sql`) may name only the database's own tables,
its CTEs and DuckDB's catalogue functions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from .errors import CollectorError

MAX_ROWS = 100_000
# Table functions that read the catalogue or make values, never a file or the network.
# `exchanges_rebuilt` is the database's own macro (`schema.py`): some exchanges, rebuilt whole.
_SAFE_FUNCTIONS = {
    "range",
    "generate_series",
    "unnest",
    "json_each",
    "json_tree",
    "exchanges_rebuilt",
}
_SAFE_SCHEMAS = {"information_schema", "pg_catalog"}


class QueryRefused(CollectorError):
    """Not one read-only query of this database's tables, or DuckDB could not run it."""


@dataclass
class Answer:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool  # more rows than the limit: only the first `limit` came back

    def as_dict(self) -> dict:
        return {
            "columns": self.columns,
            "types": self.types,
            "rows": self.rows,
            "truncated": self.truncated,
        }


def query(con: duckdb.DuckDBPyConnection, sql: str, limit: int = 1000) -> Answer:
    """Run one read-only SELECT; at most `limit` rows come back."""
    limit = max(1, min(limit, MAX_ROWS))
    _check(con, sql)
    con.execute("BEGIN TRANSACTION READ ONLY")
    try:
        cur = con.execute(sql)
        rows = cur.fetchmany(limit + 1)
        columns = [d[0] for d in cur.description]
        types = [str(d[1]) for d in cur.description]
    except duckdb.Error as exc:
        raise QueryRefused(_first_line(exc)) from exc
    finally:
        con.execute("ROLLBACK")
    return Answer(columns, types, [list(r) for r in rows[:limit]], len(rows) > limit)


def tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The database's own tables (not temporary ones), by name."""
    return [
        name
        for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE NOT temporary "
            "AND database_name = current_database() ORDER BY table_name"
        ).fetchall()
    ]


def export(con: duckdb.DuckDBPyConnection, table: str, path: Path) -> int:
    """Write one table to a Parquet file (DuckDB's COPY, from a consistent snapshot);
    return its rows. `exchanges` is written as `exchanges_full`: every request and prompt
    whole (linear storage keeps only what each turn adds), as users expect."""
    if table not in tables(con):
        raise QueryRefused(f"no table {table!r}; tables: {', '.join(tables(con))}")
    path.parent.mkdir(parents=True, exist_ok=True)
    quoted = "exchanges_full" if table == "exchanges" else '"' + table.replace('"', '""') + '"'
    con.execute("BEGIN TRANSACTION")
    try:
        rows = con.execute(f"SELECT count(*) FROM {quoted}").fetchone()[0]
        con.execute(f"COPY {quoted} TO ? (FORMAT parquet)", [str(path)])
    finally:
        con.execute("ROLLBACK")
    return rows


def _check(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(_first_line(exc)) from exc
    if len(statements) != 1:
        raise QueryRefused(f"give exactly one statement ({len(statements)} found)")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryRefused(f"only a SELECT is answered here, not {kind.name}")
    tree = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0]
    parsed = json.loads(tree)
    if parsed.get("error"):
        raise QueryRefused(parsed.get("error_message") or "DuckDB could not parse the query")
    own = {t.lower() for t in tables(con)}
    own |= {
        v.lower()
        for (v,) in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal AND NOT temporary"
        ).fetchall()
    }
    ctes = set()
    refs: list[dict] = []
    _walk(parsed, ctes, refs)
    for ref in refs:
        if ref["type"] == "TABLE_FUNCTION":
            name = ((ref.get("function") or {}).get("function_name") or "").lower()
            if not (name.startswith("duckdb_") or name in _SAFE_FUNCTIONS):
                raise QueryRefused(f"table function {name}() is not answered here (files)")
        else:
            name = (ref.get("table_name") or "").lower()
            schema = (ref.get("schema_name") or "").lower()
            if schema in _SAFE_SCHEMAS or name in ctes or (schema in ("", "main") and name in own):
                continue
            raise QueryRefused(f"no table {ref.get('table_name')!r} in this database")


def _walk(node: Any, ctes: set[str], refs: list[dict]) -> None:
    """Collect every table reference and CTE name of a serialised syntax tree."""
    if isinstance(node, dict):
        if node.get("type") in ("BASE_TABLE", "TABLE_FUNCTION") and "alias" in node:
            refs.append(node)
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict):
            for entry in cte_map.get("map") or []:
                ctes.add(str(entry.get("key", "")).lower())
        for value in node.values():
            _walk(value, ctes, refs)
    elif isinstance(node, list):
        for value in node:
            _walk(value, ctes, refs)


def _first_line(exc: Exception) -> str:
    """DuckDB's message (with its `LINE 1: ...` pointer), bounded."""
    return str(exc).strip()[:1000] or type(exc).__name__
