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

from . import lake
from .scope import TenantRows
from .sqlguard import (
    Own,
    QueryRefused,
    check_plan,
    check_syntax,
    first_line,
    lock_down,
    no_extensions_on_demand,
)

__all__ = [
    "MAX_ROWS",
    "Answer",
    "QueryRefused",
    "connect",
    "connect_lake",
    "export",
    "query",
    "tables",
]

MAX_ROWS = 100_000


@dataclass
class Answer:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool  # more rows than the limit: only the first `limit` came back


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
    return lock_down(str(path))


def connect_lake(catalog: str, data_path: str) -> duckdb.DuckDBPyConnection:
    """The lake attached read-only for users' queries, then every other way out switched
    off as `connect` does: the lake's data files stay readable (DuckDB's
    `allowed_directories`), no other file, no new connection to any database, no
    extension loaded on demand, none of it undone by a `SET`."""
    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    lake.attach(con, catalog, data_path, read_only=True)
    con.execute("SET allowed_directories = ?", [[data_path]])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The database's own tables (not temporary ones), by name."""
    return [
        name
        for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE NOT temporary "
            "AND database_name = current_database() ORDER BY table_name"
        ).fetchall()
    ]


def export(
    con: duckdb.DuckDBPyConnection, table: str, path: Path, tenant: TenantRows | None = None
) -> int:
    """Write one table to a Parquet file (DuckDB's COPY, from a consistent snapshot);
    return its rows. `exchanges` is written as `exchanges_full`: every request and prompt
    whole (linear storage keeps only what each turn adds), as users expect. With `tenant`,
    only its rows, of the tables that hold a tenant's rows (`tenant_tables`)."""
    if table not in tables(con):
        raise QueryRefused(f"no table {table!r}; tables: {', '.join(tables(con))}")
    path.parent.mkdir(parents=True, exist_ok=True)
    quoted = "exchanges_full" if table == "exchanges" else '"' + table.replace('"', '""') + '"'
    rows_of, params = f"SELECT * FROM {quoted}", {}
    if tenant is not None:
        if table not in _TENANT_ROWS:
            raise QueryRefused(
                f"table {table!r} holds no tenant's rows; a tenant's tables: "
                + ", ".join(tenant_tables(con))
            )
        rows_of = f"SELECT * FROM {quoted} WHERE {_TENANT_ROWS[table]}"
        given = {"keys": list(tenant.keys), "lineages": list(tenant.lineages)}
        params = {k: v for k, v in given.items() if f"${k}" in rows_of}  # DuckDB: no extras
    con.execute("BEGIN TRANSACTION")
    try:
        rows = con.execute(f"SELECT count(*) FROM ({rows_of})", params).fetchone()[0]
        con.execute(f"COPY ({rows_of}) TO $path (FORMAT parquet)", {**params, "path": str(path)})
    finally:
        con.execute("ROLLBACK")
    return rows


def tenant_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The tables `export` can write one tenant's rows of."""
    return [t for t in tables(con) if t in _TENANT_ROWS]


# A tenant's rows, table by table: its keys' conversations whole (a resampled exchange
# carries no key, but its conversation's id), what the judge derived from them, as `onjob
# forget --api-key` finds them (forget.py), and its lineages' release rows. `$keys` and
# `$lineages` are the tenant's; every other table (the spool's bookkeeping, deletion
# rules, another tenant's or the shared lineage's rows) is not the tenant's to take.
_CONVERSATIONS = "SELECT trajectory_id FROM exchanges WHERE list_contains($keys, api_key_id)"
_EXCHANGES = f"SELECT id FROM exchanges WHERE trajectory_id IN ({_CONVERSATIONS})"
_SCENARIOS = f"SELECT scenario_id FROM exchanges WHERE trajectory_id IN ({_CONVERSATIONS})"
_GROUPS = (
    f"SELECT id FROM groups WHERE prefix_exchange IN ({_EXCHANGES}) UNION "
    f"SELECT group_id FROM members WHERE exchange_id IN ({_EXCHANGES}) "
    f"OR trajectory_id IN ({_CONVERSATIONS})"
)
_RUNS = "SELECT id FROM train_runs WHERE list_contains($lineages, config->>'lineage')"
_TENANT_ROWS = {
    "exchanges": f"trajectory_id IN ({_CONVERSATIONS})",
    "trajectories": f"id IN ({_CONVERSATIONS})",
    "scenarios": f"id IN ({_SCENARIOS})",
    "holdout_slice": f"scenario_id IN ({_SCENARIOS})",
    "groups": f"id IN ({_GROUPS})",
    "members": f"group_id IN ({_GROUPS})",
    "judgements": f"group_id IN ({_GROUPS})",
    "scores": f"group_id IN ({_GROUPS}) OR member_id IN "
    f"(SELECT id FROM members WHERE group_id IN ({_GROUPS}))",
    "feedback": f"list_contains($keys, api_key_id) OR trajectory_id IN ({_CONVERSATIONS}) "
    f"OR exchange_id IN ({_EXCHANGES})",
    "train_runs": f"id IN ({_RUNS})",
    "checkpoints": f"train_run IN ({_RUNS})",
    "deployments": "list_contains($lineages, model_alias)",
    "reviews": "list_contains($lineages, model_alias)",
    "candidates": "list_contains($lineages, alias)",
}
