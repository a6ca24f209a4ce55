"""Which SQL a user's query may be: one SELECT that reads this database's own tables.

`onjob sql` and `/admin/sql` run what the admin key's holder sends on a DuckDB that may
read any file the server can, so what is allowed is decided twice, by DuckDB itself and
never by a pattern over the text: on the syntax tree before anything is bound
(`check_syntax`: DuckDB's binder already reads a file it is given), then on the bound plan
in the same read-only transaction as the run (`check_plan`). A CTE's name counts only in
its scope. Where the connection is the caller's alone, DuckDB's own switches go off too
(`lock_down`). docs/collector.md, "Users' queries", says why each step is needed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import duckdb

from .errors import CollectorError


class QueryRefused(CollectorError):
    """Not one read-only query of this database's tables, or DuckDB could not run it."""


# Table functions that make values or read the catalogue, never a file or the network;
# by the name DuckDB's plan gives them (upper case). The catalogue's own views
# (`information_schema`, `pg_catalog`) are built on the `duckdb_*` ones listed here;
# `duckdb_settings`, `duckdb_secrets`, `duckdb_extensions` (the extension directory),
# `duckdb_temporary_files`, `duckdb_logs` and the like are not.
SAFE_FUNCTIONS = frozenset(
    {
        "RANGE",
        "GENERATE_SERIES",
        "UNNEST",
        "JSON_EACH",
        "JSON_TREE",
        "DUCKDB_TABLES",
        "DUCKDB_VIEWS",
        "DUCKDB_COLUMNS",
        "DUCKDB_SCHEMAS",
        "DUCKDB_DATABASES",
        "DUCKDB_CONSTRAINTS",
        "DUCKDB_INDEXES",
        "DUCKDB_SEQUENCES",
        "DUCKDB_TYPES",
        "DUCKDB_FUNCTIONS",
        "DUCKDB_KEYWORDS",
        "DUCKDB_DEPENDENCIES",
    }
)

_SAFE_BY_NAME = frozenset(f.lower() for f in SAFE_FUNCTIONS)  # as `fold` gives a query's names

# Reached only through `SHOW x`, whose `x` the tree check has held to this database's
# tables; never allowed by name in a query (it takes any name).
PLAN_ONLY_FUNCTIONS = frozenset({"PRAGMA_SHOW"})

# DuckDB's physical operators that only combine, filter or order rows other operators
# produced (names as `EXPLAIN (FORMAT json)` prints them). A scan is none of these: each is
# checked on its own. An operator not listed is refused: a new DuckDB may add one, and
# the list is widened once it is known to read nothing.
RELATIONAL = frozenset(
    {
        "PROJECTION",
        "FILTER",
        "ORDER_BY",
        "TOP_N",
        "LIMIT",
        "STREAMING_LIMIT",
        "LIMIT_PERCENT",
        "WINDOW",
        "STREAMING_WINDOW",
        "UNNEST",
        "UNGROUPED_AGGREGATE",
        "HASH_GROUP_BY",
        "PERFECT_HASH_GROUP_BY",
        "PARTITIONED_AGGREGATE",
        "RESERVOIR_SAMPLE",
        "STREAMING_SAMPLE",
        "HASH_JOIN",
        "NESTED_LOOP_JOIN",
        "BLOCKWISE_NL_JOIN",
        "PIECEWISE_MERGE_JOIN",
        "IE_JOIN",
        "ASOF_JOIN",
        "LEFT_DELIM_JOIN",
        "RIGHT_DELIM_JOIN",
        "DELIM_JOIN",
        "POSITIONAL_JOIN",
        "CROSS_PRODUCT",
        "UNION",
        "CTE",
        "REC_CTE",
        "RECURSIVE_CTE",
        "PIVOT",
        # Scans of rows the query itself made (constants, CTEs, join keys).
        "EMPTY_RESULT",
        "DUMMY_SCAN",
        "COLUMN_DATA_SCAN",
        "CHUNK_SCAN",
        "DELIM_SCAN",
        "CTE_SCAN",
        "REC_CTE_SCAN",
        "RECURSIVE_CTE_SCAN",
        "RECURSIVE_RECURRING_CTE_SCAN",
        "EXPRESSION_SCAN",
        "POSITIONAL_SCAN",
    }
)
# The scan of a stored table, with its `Table` (`catalog.schema.name`) in `extra_info`.
TABLE_SCANS = frozenset({"SEQ_SCAN", "INDEX_SCAN", "TABLE_SCAN"})
# A DuckLake's (`lake.py`), whose `Table` is the bare name: the database's own when the
# database is the lake (the only lake attached) and the name one of its relations.
LAKE_SCAN = "DUCKLAKE_SCAN"

_QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE"})
# Table references the tree check understands: a name, a table function, or what only
# holds other references, subqueries and expressions (walked in turn).
_TABLE_REFS = frozenset(
    {"BASE_TABLE", "TABLE_FUNCTION", "SHOW_REF"}
    | {"SUBQUERY", "JOIN", "EXPRESSION_LIST", "EMPTY", "PIVOT"}
)
# The other typed parts of a tree that are not expressions (those carry a `class`):
# result modifiers and sort orders, which hold only expressions. A part of any other kind
# (a table reference DuckDB adds later, say) is refused.
_OTHER_PARTS = frozenset(
    {"ORDER_MODIFIER", "LIMIT_MODIFIER", "LIMIT_PERCENT_MODIFIER", "DISTINCT_MODIFIER"}
    | {"ORDER_DEFAULT", "ASCENDING", "DESCENDING"}
)
# `SHOW TABLES`, `SHOW ALL TABLES`, `SHOW DATABASES`, `SHOW SCHEMAS`: the parser's names
# for catalogue queries (the plan check sees the catalogue functions they become).
_TOO_DEEP = "the query nests too deeply to be checked; write it with fewer levels"
_SHOW_SPECIAL = frozenset({'"tables"', "__show_tables_expanded", '"databases"', '"schemas"'})


@dataclass(frozen=True)
class Own:
    """What this database holds, as the connection sees it (names folded as DuckDB does)."""

    con: duckdb.DuckDBPyConnection = field(repr=False)
    database: str  # `current_database()`: the catalog the user's tables live in
    relations: frozenset[str]  # tables and views of its `main` schema
    catalogue_views: frozenset[tuple[str, str]]  # (schema, view) of information_schema…
    lake: bool = False  # the database is a DuckLake (its scans name bare tables)

    @classmethod
    def of(cls, con: duckdb.DuckDBPyConnection) -> Own:
        database = con.execute("SELECT current_database()").fetchone()[0]
        relations = con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "AND schema_name = 'main' AND NOT temporary UNION ALL "
            "SELECT view_name FROM duckdb_views() WHERE database_name = current_database() "
            "AND schema_name = 'main' AND NOT temporary AND NOT internal"
        ).fetchall()
        catalogue = con.execute(
            "SELECT schema_name, view_name FROM duckdb_views() "
            "WHERE schema_name IN ('information_schema', 'pg_catalog')"
        ).fetchall()
        (kind,) = con.execute(
            "SELECT type FROM duckdb_databases() WHERE database_name = current_database()"
        ).fetchone()
        return cls(
            con=con,
            database=fold(database),
            relations=frozenset(fold(n) for (n,) in relations),
            catalogue_views=frozenset((fold(s), fold(v)) for s, v in catalogue),
            lake=kind == "ducklake",
        )

    @cached_property
    def macros(self) -> frozenset[str]:
        """Its table macros (`exchanges_rebuilt`). Read only for a query that calls a table
        function not in `SAFE_FUNCTIONS`: `duckdb_functions()` lists every function DuckDB
        has, ~47 ms, where both checks together add ~5 ms to `SELECT 1` (7 → 12 ms;
        measured on a loaded 2-core host)."""
        rows = self.con.execute(
            "SELECT function_name FROM duckdb_functions() WHERE function_type = 'table_macro' "
            "AND database_name = current_database() AND schema_name = 'main' AND NOT internal"
        ).fetchall()
        return frozenset(fold(n) for (n,) in rows)


def check_syntax(con: duckdb.DuckDBPyConnection, sql: str, own: Own) -> duckdb.Statement:
    """The one SELECT in `sql`, or QueryRefused saying why not."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(first_line(exc)) from exc
    if len(statements) != 1:
        raise QueryRefused(f"give exactly one statement ({len(statements)} found)")
    statement = statements[0]
    if statement.type != duckdb.StatementType.SELECT:
        raise QueryRefused(f"only a SELECT is answered here, not {statement.type.name}")
    serialised = con.execute("SELECT json_serialize_sql(?)", [statement.query]).fetchone()[0]
    try:
        tree = json.loads(serialised)
        if tree.get("error"):
            raise QueryRefused(tree.get("error_message") or "DuckDB could not parse the query")
        for node in tree.get("statements") or []:
            _query_node(node.get("node"), frozenset(), own)
    except RecursionError as exc:  # a tree deeper than Python's stack (DuckDB allows 1000)
        raise QueryRefused(_TOO_DEEP) from exc
    return statement


_EXPLAIN = "EXPLAIN (FORMAT json) "


def _as_written(message: str) -> str:
    """DuckDB's error of the planned query, its `LINE 1: ...` quote and the caret under it
    as they would read for the query alone (the quote began with `_EXPLAIN`)."""
    lines = message.split("\n")
    for i, line in enumerate(lines[:-1]):
        head, sep, quoted = line.partition(": ")
        if line.startswith("LINE ") and sep and quoted.startswith(_EXPLAIN):
            lines[i] = head + sep + quoted.removeprefix(_EXPLAIN)
            caret = lines[i + 1]
            if caret[: len(_EXPLAIN)].isspace():
                lines[i + 1] = caret[len(_EXPLAIN) :]
    return "\n".join(lines)


def check_plan(con: duckdb.DuckDBPyConnection, statement: duckdb.Statement, own: Own) -> None:
    """Refuse the statement unless each operator of its bound plan is relational, a scan of
    one of the database's own tables, or an allowed table function."""
    try:
        rows = con.execute(_EXPLAIN + statement.query).fetchall()
    except duckdb.Error as exc:  # a binder's error, said of the query the user wrote
        raise type(exc)(_as_written(str(exc))) from None
    try:
        plans = [json.loads(value) for key, value in rows if key == "physical_plan"]
        operators = list(_operators(plans[0])) if len(plans) == 1 else []
    except RecursionError as exc:
        raise QueryRefused(_TOO_DEEP) from exc
    if not operators:
        raise QueryRefused("DuckDB gave no plan for the query")
    tables = {(own.database, "main", name) for name in own.relations}
    for op in operators:
        name = str(op.get("name", "")).strip().upper()
        info = op.get("extra_info") or {}
        if name in TABLE_SCANS or name == LAKE_SCAN:
            table = str(info.get("Table") or "") if isinstance(info, dict) else ""
            ours = (
                own.lake and fold(table) in own.relations
                if name == LAKE_SCAN
                else _identifiers(fold(table)) in tables
            )
            if not ours:
                raise QueryRefused(f"the query reads {table or 'a table'}, not this database's")
        elif name in SAFE_FUNCTIONS or name in PLAN_ONLY_FUNCTIONS or name in RELATIONAL:
            continue
        elif isinstance(info, dict) and "Function" in info:
            raise QueryRefused(f"table function {name.lower()}() is not answered here (files)")
        else:
            raise QueryRefused(f"the query's plan has {name}, which is not answered here")


def lock_down(path: str) -> duckdb.DuckDBPyConnection:
    """The database file opened read-only in a DuckDB instance of its own, every way out of
    it switched off: no file or network access but the database itself, no extension
    installed or loaded on demand, and no `SET` that undoes it."""
    locked = {
        "enable_external_access": False,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "lock_configuration": True,
    }
    return duckdb.connect(path, read_only=True, config=locked)


def no_extensions_on_demand(con: duckdb.DuckDBPyConnection) -> None:
    """Stop DuckDB installing (from the network) or loading an extension because a query
    names something of one: a type (`'1.2.3.4'::INET`), a function, a file's scheme. Both
    settings are the DuckDB instance's, so in the server this is for every cursor; onjob's
    own statements need only the extensions built into DuckDB's wheel (json, parquet, icu),
    so nothing else changes. Where they are already off (`lock_down`) nothing is set, as a
    locked configuration refuses any SET."""
    on = con.execute(
        "SELECT current_setting('autoinstall_known_extensions') "
        "OR current_setting('autoload_known_extensions')"
    ).fetchone()[0]
    if on:
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def fold(name: Any) -> str:
    """A name as DuckDB compares it: case-insensitive in ASCII only. Python's `lower()`
    would fold more (the Kelvin sign to `k`), so a name DuckDB does not know as a table,
    and would look for as a file, could pass for one of ours."""
    return str(name or "").translate(_ASCII_LOWER)


def _identifiers(qualified: str) -> tuple[str, ...]:
    """`db.main."groups"` as ("db", "main", "groups"): a plan names a table as DuckDB
    writes SQL, quoting each part that is a keyword or not a plain name (`"my-db"`), with
    `""` for a quote inside one."""
    parts, at = [], 0
    while at <= len(qualified):
        if qualified.startswith('"', at):
            end, part = at + 1, []
            while (close := qualified.find('"', end)) >= 0 and qualified.startswith('""', close):
                part.append(qualified[end : close + 1])
                end = close + 2
            if close < 0:
                return ()  # not a name DuckDB wrote
            parts.append("".join(part) + qualified[end:close])
            at = close + 1
        else:
            end = qualified.find(".", at)
            end = len(qualified) if end < 0 else end
            parts.append(qualified[at:end])
            at = end
        if at < len(qualified) and qualified[at] != ".":
            return ()
        at += 1
    return tuple(parts)


def first_line(exc: Exception) -> str:
    """DuckDB's message (with its `LINE 1: ...` pointer), bounded."""
    return str(exc).strip()[:1000] or type(exc).__name__


# -- the tree ----------------------------------------------------------------------------


def _query_node(node: Any, ctes: frozenset[str], own: Own) -> None:
    """Check one query node with the CTE names `ctes` in scope around it."""
    kind = node.get("type") if isinstance(node, dict) else None
    if kind not in _QUERY_NODES:
        raise QueryRefused(f"a {kind} is not answered here")
    # Each CTE sees those defined before it; the node's body sees them all.
    for entry in (node.get("cte_map") or {}).get("map") or []:
        body = _cte_body(entry.get("value") or {})
        if not isinstance(body, dict):
            raise QueryRefused("DuckDB's tree of the query has a CTE this check cannot read")
        _query_node(body, ctes, own)
        ctes = ctes | {fold(entry.get("key", ""))}
    for key, value in node.items():
        if key == "cte_map":
            continue
        if kind == "RECURSIVE_CTE_NODE" and key == "right":
            # The recursive part alone reads the CTE being defined (its working table).
            _visit(value, ctes | {fold(node.get("cte_name", ""))}, own)
        else:
            _visit(value, ctes, own)


def _cte_body(cte: dict) -> Any:
    """A CTE's query node: DuckDB 2.0 writes it as `query_node`, 1.5 inside the statement
    it wraps (`query.node`)."""
    if "query_node" in cte:
        return cte["query_node"]
    return (cte.get("query") or {}).get("node")


def _visit(value: Any, ctes: frozenset[str], own: Own) -> None:
    if isinstance(value, list):
        for item in value:
            _visit(item, ctes, own)
        return
    if not isinstance(value, dict):
        return
    kind = value.get("type")
    if "class" not in value and isinstance(kind, str):
        if kind in _QUERY_NODES or kind.endswith("_NODE"):
            _query_node(value, ctes, own)
            return
        if kind in _TABLE_REFS:
            _table_ref(value, ctes, own)
        elif kind not in _OTHER_PARTS:
            raise QueryRefused(f"a {kind} in a query is not answered here")
    for item in value.values():
        _visit(item, ctes, own)


def _table_ref(ref: dict, ctes: frozenset[str], own: Own) -> None:
    kind = ref["type"]
    if kind == "BASE_TABLE":
        catalog = fold(ref.get("catalog_name") or "")
        schema = fold(ref.get("schema_name") or "")
        name = fold(ref.get("table_name") or "")
        if not catalog and not schema and name in ctes:
            return
        if catalog in ("", "system") and (schema, name) in own.catalogue_views:
            return
        if catalog in ("", own.database) and schema in ("", "main") and name in own.relations:
            return
        raise QueryRefused(f"no table {ref.get('table_name')!r} in this database")
    if kind == "TABLE_FUNCTION":
        function = ref.get("function") or {}
        name = fold(function.get("function_name") or "")
        schema = fold(function.get("schema") or "")
        catalog = fold(function.get("catalog") or "")
        if not catalog and not schema and name in _SAFE_BY_NAME:
            return
        if catalog in ("", own.database) and schema in ("", "main") and name in own.macros:
            return
        raise QueryRefused(f"table function {name}() is not answered here (files)")
    if kind == "SHOW_REF":
        # `DESCRIBE x` / `SUMMARIZE x` carry `x` as a query, checked as any other, and
        # no name; `SHOW x` names `x` here.
        name = str(ref.get("table_name") or "")
        # DuckDB 2.0 marks them SHOW_SPECIAL, 1.5 SHOW_UNQUALIFIED (where `SHOW "tables"`
        # reads as `SHOW TABLES`); the plan check sees what either reads.
        special = ref.get("show_type") in ("SHOW_SPECIAL", "SHOW_UNQUALIFIED")
        if not name or (special and name in _SHOW_SPECIAL):
            return
        catalog = fold(ref.get("catalog_name") or "")
        schema = fold(ref.get("schema_name") or "")
        ours = catalog in ("", own.database) and schema in ("", "main")
        if ours and fold(name) in own.relations:
            return
        raise QueryRefused(f"no table {name!r} in this database")


def _operators(plan: Any) -> Iterator[dict]:
    if isinstance(plan, list):
        for op in plan:
            yield from _operators(op)
    elif isinstance(plan, dict):
        yield plan
        yield from _operators(plan.get("children") or [])
