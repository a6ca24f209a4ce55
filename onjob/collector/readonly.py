"""Reading the database while `onjob serve` holds it: `onjob sql` and `onjob export`.

DuckDB lets one process open a file read-write, so users cannot open it beside the
server; the server answers their queries instead (admin API), and these functions are
what it runs, on a cursor of its own (`Collector.read`), or on a read-only connection
when no server holds the file (`connect`).

What a query may be is decided by DuckDB, not by a pattern over the text (`sqlguard`):
exactly one SELECT whose syntax tree, and then whose bound plan, reads only the
database's own tables, its CTEs and DuckDB's catalogue; it runs in a `BEGIN TRANSACTION
READ ONLY` that is rolled back, so any write fails in DuckDB itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from .sqlguard import (
    Own,
    QueryRefused,
    check_plan,
    check_syntax,
    first_line,
    lock_down,
    no_extensions_on_demand,
)

__all__ = ["MAX_ROWS", "Answer", "QueryRefused", "connect", "export", "query", "tables"]

MAX_ROWS = 100_000


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
    no_extensions_on_demand(con)
    # Checked, planned and run in one transaction: the catalogue the query was checked
    # against is the one it runs on.
    con.execute("BEGIN TRANSACTION READ ONLY")
    try:
        own = Own.of(con)
        statement = check_syntax(con, sql, own)
        check_plan(con, statement, own)
        cur = con.execute(statement.query)
        rows = cur.fetchmany(limit + 1)
        columns = [d[0] for d in cur.description]
        types = [str(d[1]) for d in cur.description]
    except duckdb.Error as exc:
        raise QueryRefused(first_line(exc)) from exc
    finally:
        con.execute("ROLLBACK")
    return Answer(columns, types, [list(r) for r in rows[:limit]], len(rows) > limit)


def connect(path: Path | str) -> duckdb.DuckDBPyConnection:
    """The database file opened read-only for users' queries, in a DuckDB instance of
    this process alone, so DuckDB's own switches can go off (`sqlguard.lock_down`): no
    file but the database, no network, no extension loaded on demand, none of it undone
    by a `SET`. Not for `export`, which writes its Parquet file through DuckDB."""
    return duckdb.connect(str(path), read_only=True, config=lock_down())


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
