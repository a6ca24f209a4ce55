"""The log in DuckLake (`collector.catalog`): its catalog a Postgres database, its data
files under an S3 prefix or a directory, which any reader attaches (docs/scaling.md,
"The log in DuckLake").

DuckLake has no PRIMARY KEY or UNIQUE constraint, and its ALTER TABLE only widens a
column's type, so the embedded migrations (`schema.py`) cannot be replayed on it. A new
lake is made in the embedded schema's *end state* instead, read off an in-memory
database the migrations built: every table with its columns' types, NOT NULL and
defaults, every view and macro, no key constraints (what a key guarded, a writer must:
ids are made unique where they are made, `ids.new_id`). Its `schema_version` is the
migrations' count, so the two back ends name one schema by one number.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Mapping
from datetime import datetime
from urllib.parse import urlsplit

import duckdb

from . import extensions, schema
from .errors import StorageError

NAME = "onjob"  # the catalog name a lake is attached as (`current_database()`)
_INIT_RACES = 10  # a new catalog's creation lost to another server's, attached again


def shown(catalog: str) -> str:
    """The catalog's connection string as it may be printed or logged: its password out
    (`password=...` of a libpq string, `user:password@` of a URI)."""
    catalog = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", catalog)
    return re.sub(r"(://[^:/@\s]+:)[^@\s]*@", r"\1***@", catalog)


def attach(
    con: duckdb.DuckDBPyConnection,
    catalog: str,
    data_path: str,
    *,
    name: str = NAME,
    read_only: bool = False,
) -> None:
    """Attach the lake whose catalog is the Postgres database `catalog` (a libpq
    connection string or URI) and whose files lie under `data_path`, as `name`, and
    make it the connection's default database."""
    extensions.load(con, "ducklake", "postgres")
    if data_path.startswith("s3://"):
        extensions.load(con, "httpfs")
        s3_secret(con)
    options = [f"DATA_PATH {_literal(data_path)}"]
    if read_only:
        options.append("READ_ONLY")
    statement = (
        f"ATTACH {_literal('ducklake:postgres:' + catalog)} AS {_ident(name)} "
        f"({', '.join(options)})"
    )
    try:
        for attempt in range(_INIT_RACES):
            try:
                con.execute(statement)
                break
            except duckdb.Error as exc:
                # Servers attaching a new catalog at once each create DuckLake's tables in
                # it; the losers find them made ("already exists", or Postgres' own race on
                # a new table's type) and attach as to any made catalog when they try again.
                raced = "already exists" in str(exc) or "duplicate key" in str(exc)
                if not raced or attempt == _INIT_RACES - 1:
                    raise
                time.sleep(0.1 * (attempt + 1))
        con.execute(f"USE {_ident(name)}")
    except duckdb.Error as exc:
        raise StorageError(
            f"cannot attach the DuckLake catalog {shown(catalog)!r}: "
            + str(exc).replace(catalog, shown(catalog))
        ) from exc


def compact(con: duckdb.DuckDBPyConnection, keep_s: float, name: str = NAME) -> int:
    """Merge the small data files each writer's loads leave (a Parquet file per table a
    commit inserts into: about 15 a second from two busy servers here) into larger ones,
    then expire the snapshots older than `keep_s` and remove the files none younger reads
    (a reader's transaction older than that may lose its files); the files merged. Runs
    beside other writers' loads (DuckLake commits a merge as any other change)."""
    merged = con.execute(f"CALL ducklake_merge_adjacent_files({_literal(name)})").fetchall()
    older = f"now() - to_microseconds({int(keep_s * 1e6)}::BIGINT)"
    con.execute(f"CALL ducklake_expire_snapshots({_literal(name)}, older_than => {older})")
    con.execute(f"CALL ducklake_cleanup_old_files({_literal(name)}, older_than => {older})")
    return sum(row[2] for row in merged)


def forget_history(con: duckdb.DuckDBPyConnection, name: str = NAME) -> None:
    """After a deletion, leave what was deleted nowhere in the lake. DuckLake keeps a
    deleted row in three places besides the live table: its older snapshots (readable
    `AT (VERSION => n)`), the data file that held it (a deletion only adds a file saying
    which rows are gone), and each column's minimum and maximum, per file and per table,
    in the catalog. So: every file with a deletion written again without the deleted rows,
    every snapshot but the newest expired, every file none reads removed (their
    statistics go with them), then each text column's table-wide minimum and maximum
    measured again on what is left. `tests/test_lake.py` checks the catalog (`pg_dump`)
    and the files for a forgotten text.

    The table-wide statistics are written into the catalog directly (the DuckLake format's
    `ducklake_table_column_stats`); DuckLake offers no call that measures them again. A
    load another server had open meanwhile is refused at its commit (DuckLake refuses an
    insert beside a delete in the same table) and made again on what is left, so it
    writes back no old bound: `tests/test_lake.py` reads the catalog after one."""
    con.execute(f"CALL ducklake_rewrite_data_files({_literal(name)}, delete_threshold => 0)")
    con.execute(f"CALL ducklake_expire_snapshots({_literal(name)}, older_than => now())")
    con.execute(f"CALL ducklake_cleanup_old_files({_literal(name)}, cleanup_all => true)")
    metadata = _ident(f"__ducklake_metadata_{name}")
    columns = con.execute(
        f"""
        SELECT t.table_id, t.table_name, c.column_id, coalesce(p.column_name, c.column_name),
               p.column_id IS NOT NULL
        FROM {metadata}.ducklake_table t
        JOIN {metadata}.ducklake_column c ON c.table_id = t.table_id AND c.end_snapshot IS NULL
        LEFT JOIN {metadata}.ducklake_column p
               ON p.column_id = c.parent_column AND p.table_id = t.table_id
              AND p.end_snapshot IS NULL
        JOIN {metadata}.ducklake_table_column_stats s
          ON s.table_id = t.table_id AND s.column_id = c.column_id
        WHERE t.end_snapshot IS NULL AND c.column_type IN ('varchar', 'json')
          AND (s.min_value IS NOT NULL OR s.max_value IS NOT NULL)
          AND (c.parent_column IS NULL OR p.parent_column IS NULL)
        """
    ).fetchall()
    for table_id, table, column_id, column, in_list in columns:
        values = f"unnest({_ident(column)})" if in_list else _ident(column)
        low, high = con.execute(
            f"SELECT min(v)::VARCHAR, max(v)::VARCHAR FROM (SELECT {values} AS v FROM "
            f"{_ident(name)}.{_ident(table)})"
        ).fetchone()
        con.execute(
            f"UPDATE {metadata}.ducklake_table_column_stats SET min_value = ?, max_value = ? "
            "WHERE table_id = ? AND column_id = ?",
            [low, high, table_id, column_id],
        )


def s3_secret(con: duckdb.DuckDBPyConnection, env: Mapping[str, str] = os.environ) -> None:
    """DuckDB's S3 credentials from the variables boto3 and the AWS tools read: the key
    (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), the region
    (`AWS_REGION` or `AWS_DEFAULT_REGION`) and an endpoint other than AWS's
    (`AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`: MinIO, R2, moto), as a temporary secret
    of this connection. Without a key, none: DuckDB asks anonymously."""
    key = env.get("AWS_ACCESS_KEY_ID")
    if not key:
        return
    fields = {"KEY_ID": key, "SECRET": env.get("AWS_SECRET_ACCESS_KEY", "")}
    if env.get("AWS_SESSION_TOKEN"):
        fields["SESSION_TOKEN"] = env["AWS_SESSION_TOKEN"]
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        fields["REGION"] = region
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        url = urlsplit(endpoint)
        fields["ENDPOINT"] = url.netloc or url.path
        fields["URL_STYLE"] = "path"  # a custom endpoint's buckets are paths, not hosts
        fields["USE_SSL"] = "true" if url.scheme != "http" else "false"
    spelt = ", ".join(
        f"{k} {v}" if k == "USE_SSL" else f"{k} {_literal(v)}" for k, v in fields.items()
    )
    con.execute(f"CREATE OR REPLACE TEMPORARY SECRET onjob_s3 (TYPE s3, {spelt})")


# Every server writes its own exchanges into the lake (DuckLake's commits are optimistic:
# inserts by several writers at once all land; a commit that clashes is retried), and
# works the lineages no other worker holds (`jobs.py`). One server at a time *leads*: it
# runs retention, forgetting and the merge of small files, by a lease in the lake itself:
# a row it claims while the row is free or its own, renews a third of the lease apart,
# and gives back when it stops. Of two claims at once, one commit fails and that one reads
# the row again. A leader that dies leaves the lease to the next after `LEADER_LEASE_S`. A
# command that forgets (`onjob forget --db`) must hold it.
LEADER_LEASE_S = 30.0
_LEASE = "lake_writer"


def claim(
    con: duckdb.DuckDBPyConnection, holder: str, lease_s: float = LEADER_LEASE_S
) -> tuple[str, datetime] | None:
    """Take the leader's lease for `holder`, or renew it: None when `holder` holds it now,
    else who does and until when."""
    for _ in range(10):
        try:
            con.execute("BEGIN TRANSACTION")
            renewed = _renew(con, holder, lease_s)
            con.execute("COMMIT")
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")  # not left open (a catalog that went away mid-claim)
            if isinstance(exc, duckdb.TransactionException):
                continue  # another claim committed first: look again
            raise
        return None if renewed[0] == holder else renewed
    raise StorageError("could not claim the lake's leader lease: other claims kept winning")


# What DuckDB's Postgres scanner says when the catalog's server cannot be reached: down,
# restarting (its connections cut), or the network. DuckDB raises these as IOException,
# as it does a full disk, so the text tells them apart.
_UNREACHABLE = (
    "Unable to connect to Postgres",
    "server closed the connection",
    "terminating connection",
    "connection to server",
    "no connection to the server",
    "could not connect",
)


def unreachable(exc: BaseException | None) -> bool:
    """Whether a failed statement (or what it was raised from) could not reach the
    catalog's Postgres: the same statement succeeds once it answers again."""
    while exc is not None:
        if isinstance(exc, duckdb.Error) and any(s in str(exc) for s in _UNREACHABLE):
            return True
        exc = exc.__cause__
    return False


def clashed(exc: BaseException) -> bool:
    """Whether a failed write lost to another writer's commit (DuckLake's commits are
    optimistic): made again, it may succeed."""
    return isinstance(exc.__cause__ or exc, duckdb.TransactionException)


def release(con: duckdb.DuckDBPyConnection, holder: str) -> None:
    """Give the lease back (a stopping leader): the next may take it at once."""
    con.execute(f"UPDATE {_LEASE} SET until = now() - INTERVAL 1 SECOND WHERE holder = ?", [holder])


def _renew(con, holder: str, lease_s: float) -> tuple[str, datetime]:
    con.execute(
        f"UPDATE {_LEASE} SET holder = ?, until = now() + to_microseconds(?::BIGINT) "
        "WHERE holder = ? OR until < now()",
        [holder, int(lease_s * 1e6), holder],
    )
    return con.execute(f"SELECT holder, until FROM {_LEASE}").fetchone()


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Give the attached lake the schema's end state if it has no schema yet; return the
    version it had. A lake of another version is refused: its migration is not written.
    Servers making one new lake at once (eight hosts rolled out together): the first
    commit wins; each other one's commit fails, or its CREATE finds the table the first
    made, and it finds the lake made when it looks again."""
    for _ in range(10):
        try:
            return _migrate(con)
        except (duckdb.TransactionException, duckdb.CatalogException):
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
    return _migrate(con)


def _migrate(con: duckdb.DuckDBPyConnection) -> int:
    before = schema.version(con)
    latest = len(schema.MIGRATIONS)
    if before == latest:
        if not con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
            "AND table_name = 'trajectory_parts'"
        ).fetchone()[0]:
            raise StorageError(
                "this DuckLake was made by an earlier onjob (one writer, its trajectories "
                "and scenarios kept as tables, not parts): give collector.catalog a new "
                "database"
            )
        return before
    if before:
        raise StorageError(
            f"the DuckLake catalog holds schema version {before}; this onjob writes "
            f"version {latest}, and migrating a lake between versions is not supported yet"
        )
    con.execute("BEGIN TRANSACTION")
    try:
        for statement in end_state():
            con.execute(statement)
        con.execute(f"CREATE TABLE {_LEASE} (holder VARCHAR, until TIMESTAMPTZ)")
        con.execute(f"INSERT INTO {_LEASE} VALUES ('', now() - INTERVAL 1 SECOND)")
        con.execute("INSERT INTO schema_version VALUES (?)", [latest])
        con.execute("COMMIT")
    except duckdb.Error:
        with contextlib.suppress(duckdb.Error):  # a failed COMMIT ended it already
            con.execute("ROLLBACK")
        raise
    return before


# The two tables every load updates, a row per conversation and per scenario: on a lake
# each is a view over parts that loads only append (`PARTS`), since DuckLake's commits
# are optimistic and two writers updating one row at once clash (a conversation whose
# turns two servers place, a scenario many conversations share). What a file's upsert
# keeps (`Store._insert`), the view computes: a trajectory's first checkpoint, arm and
# exchange are its earliest part's, its last exchange the longest part's; a scenario's
# count is its parts' sum.
PARTS = {"trajectories": "trajectory_parts", "scenarios": "scenario_parts"}
_VIEWS_OF_PARTS = (
    """
    CREATE VIEW trajectories AS
    SELECT id, any_value(scenario_id) AS scenario_id,
           arg_min(checkpoint, first_ts) AS checkpoint, arg_min(arm, first_ts) AS arm,
           arg_min(first_exchange, first_ts) AS first_exchange,
           arg_max(last_exchange, n_turns) AS last_exchange, max(n_turns) AS n_turns,
           any_value(source) AS source, min(first_ts) AS first_ts, max(last_ts) AS last_ts
    FROM trajectory_parts GROUP BY id
    """,
    """
    CREATE VIEW scenarios AS
    SELECT id, any_value(key) AS key, any_value(keyed) AS keyed,
           min(first_seen) AS first_seen, sum(count)::BIGINT AS count
    FROM scenario_parts GROUP BY id
    """,
)


def end_state() -> list[str]:
    """The embedded schema after every migration, as DuckLake statements: tables without
    key constraints (`PARTS` for two of them), then macros and views in the order they
    were made."""
    con = duckdb.connect()
    try:
        schema.migrate(con)
        tables = [t for (t,) in con.execute(_TABLES).fetchall() if t != "schema_version"]
        statements = [_table(con, t, PARTS.get(t, t)) for t in tables]
        statements += [" ".join(view.split()) for view in _VIEWS_OF_PARTS]
        for name, params, body in con.execute(_MACROS).fetchall():
            statements.append(f"CREATE MACRO {_ident(name)}({', '.join(params)}) AS TABLE {body}")
        statements += [sql for (sql,) in con.execute(_VIEWS).fetchall()]
        return statements
    finally:
        con.close()


_TABLES = "SELECT table_name FROM duckdb_tables() WHERE NOT internal ORDER BY table_oid"
_MACROS = """
SELECT function_name, parameters, macro_definition FROM duckdb_functions()
WHERE function_type = 'table_macro' AND NOT internal AND schema_name = 'main'
ORDER BY function_oid
"""
_VIEWS = "SELECT sql FROM duckdb_views() WHERE NOT internal ORDER BY view_oid"


def _table(con: duckdb.DuckDBPyConnection, table: str, name: str) -> str:
    columns = con.execute(
        """
        SELECT column_name, data_type, is_nullable, column_default FROM duckdb_columns()
        WHERE table_name = ? ORDER BY column_index
        """,
        [table],
    ).fetchall()
    spelt = []
    for column, kind, nullable, default in columns:
        spelt.append(
            f"{_ident(column)} {kind}"
            + ("" if nullable else " NOT NULL")
            + (f" DEFAULT {default}" if default is not None else "")
        )
    return f"CREATE TABLE {_ident(name)} ({', '.join(spelt)})"


def _ident(name: str) -> str:
    return '"{}"'.format(name.replace('"', '""'))


def _literal(text: str) -> str:
    return "'{}'".format(text.replace("'", "''"))
