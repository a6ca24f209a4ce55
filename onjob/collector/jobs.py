"""Who works each lineage of a lake: any number of servers (and `onjob loop`s) run the
loop on one DuckLake, and a lineage's work (its judge pass, its training run, its release
decisions) is one worker's at a time, by a lease per lineage in the lake's `lake_jobs`.

A worker claims a lineage's lease while it is free or its own, renews it a third of the
lease apart while it works, and gives it back when its job ends; a worker killed mid-job
leaves the lineage to the next after the lease (`collector.job_lease_s`). The leader's
lease (`lake.claim`) stays the one server's that runs retention, forgetting and the
merge of small files.

DuckLake has no UNIQUE constraint and two inserts into one table never clash, so a
lineage's row is registered free first (two servers registering at once leave two free
rows) and every claim is one UPDATE of all the lineage's rows, guarded: none while
another holder's lease on it runs. Updates of one table clash in DuckLake (its conflict
check is per table), so of two claims at once one commit fails and that one reads the
rows again: one holder per lineage, whatever the number of rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime

import duckdb

from .errors import StorageError

TABLE = "lake_jobs"
_RACES = 10  # a claim lost to another's commit, read again


def make(con: duckdb.DuckDBPyConnection) -> None:
    """The table, made at a writer's attach when the lake lacks it (new lakes and lakes
    made before workers had leases alike). Servers making it at once: one CREATE commits,
    each other's fails and finds it made."""
    for _ in range(_RACES):
        try:
            con.execute(
                f"CREATE TABLE IF NOT EXISTS {TABLE} "
                "(name VARCHAR, holder VARCHAR, until TIMESTAMPTZ)"
            )
            return
        except duckdb.TransactionException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
    raise StorageError(f"could not make the lake's {TABLE}: other servers' commits kept winning")


def claim(
    con: duckdb.DuckDBPyConnection, name: str, holder: str, lease_s: float
) -> tuple[str, datetime] | None:
    """Take `name`'s lease for `holder`, or renew it: None when `holder` holds it now, else
    who does and until when."""
    for _ in range(_RACES):
        try:
            if _current(con, name) is None:
                _register(con, name)
            con.execute("BEGIN TRANSACTION")
            con.execute(
                f"UPDATE {TABLE} SET holder = ?, until = now() + to_microseconds(?::BIGINT) "
                f"WHERE name = ? AND NOT EXISTS (SELECT 1 FROM {TABLE} o "
                "WHERE o.name = ? AND o.holder <> ? AND o.until >= now())",
                [holder, int(lease_s * 1e6), name, name, holder],
            )
            held = _current(con, name)
            con.execute("COMMIT")
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            if isinstance(exc, duckdb.TransactionException):
                continue  # another claim (of any lineage) committed first: look again
            raise
        return None if held is not None and held[0] == holder else held
    raise StorageError(f"could not claim {name!r}'s lease: other claims kept winning")


def release(con: duckdb.DuckDBPyConnection, name: str, holder: str) -> None:
    """Give `name`'s lease back at the end of a job: the next worker may take it at once."""
    for _ in range(_RACES):
        try:
            con.execute(
                f"UPDATE {TABLE} SET until = now() - INTERVAL 1 SECOND "
                "WHERE name = ? AND holder = ?",
                [name, holder],
            )
            return
        except duckdb.TransactionException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")


def holders(con: duckdb.DuckDBPyConnection) -> Mapping[str, str]:
    """Each lineage whose lease runs now -> its holder."""
    rows = con.execute(
        f"SELECT name, arg_max(holder, until) FROM {TABLE} GROUP BY name HAVING max(until) >= now()"
    ).fetchall()
    return dict(rows)


def _current(con: duckdb.DuckDBPyConnection, name: str) -> tuple[str, datetime] | None:
    """Who holds `name` and until when (the latest of its rows), or None with no row."""
    return con.execute(
        f"SELECT holder, until FROM {TABLE} WHERE name = ? ORDER BY until DESC LIMIT 1", [name]
    ).fetchone()


def _register(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """`name`'s row, free (its lease ended a second ago)."""
    con.execute(f"INSERT INTO {TABLE} VALUES (?, '', now() - INTERVAL 1 SECOND)", [name])
