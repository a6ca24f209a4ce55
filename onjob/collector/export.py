"""The continuous export: exchanges as day-partitioned Parquet in the bucket, for DuckDB,
ClickHouse or Spark to query beside (or long after) the one DuckDB file.

    exchanges/day=YYYY-MM-DD/b<batch>_<i>.parquet     (the request's day, in UTC)

Each load queues the exchanges it inserts (`export_queue`, in the load's own
transaction: none is loaded without being queued). A round (`export_round`, on the
database thread, every `collector.export_s`) stamps what is queued with a batch number,
writes those rows whole (every request and prompt rebuilt, as `onjob export` writes
them) with DuckDB's `COPY ... (FORMAT parquet, PARTITION_BY (day))` into a scratch
directory, uploads each file create-only, and only then deletes the batch from the
queue. A round that fails leaves its batch queued; the next writes the same rows under
the same names, and an object uploaded before the failure stands: each exchange lands
in the export once.

Read it back with `read_parquet('<bucket>/exchanges/*/*.parquet', hive_partitioning =
true)`. Objects are immutable: a conversation deleted later (`onjob forget`, retention)
stays in the files exported before (docs/scaling.md).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

from ..bucket import Bucket, ObjectExists
from .linear import rebuilt
from .store import Store

EXCHANGES = "exchanges/"


def export_round(store: Store, bucket: Bucket, scratch: Path) -> int:
    """Export what the queue holds (an unfinished batch first); the rows written."""
    con = store.con
    batch = con.execute("SELECT min(batch) FROM export_queue").fetchone()[0]
    if batch is None:
        batch = time.time_ns() // 1_000_000
        taken = con.execute(
            "UPDATE export_queue SET batch = ? WHERE batch IS NULL", [batch]
        ).fetchone()[0]
        if not taken:
            return 0
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True, mode=0o700)
    ids = f"SELECT DISTINCT id FROM export_queue WHERE batch = {int(batch)}"
    target = str(scratch).replace("'", "''")
    rows = con.execute(
        f"""COPY (SELECT *, CAST(timezone('UTC', ts) AS DATE)::VARCHAR AS day
                  FROM {rebuilt(ids)} ORDER BY ts, id)
            TO '{target}' (FORMAT parquet, PARTITION_BY (day),
                            FILENAME_PATTERN 'b{int(batch)}_{{i}}', OVERWRITE_OR_IGNORE)"""
    ).fetchone()[0]
    for path in sorted(scratch.rglob("*.parquet")):
        key = EXCHANGES + path.relative_to(scratch).as_posix()
        with contextlib.suppress(ObjectExists):  # uploaded before a failed round ended
            bucket.put_file(key, path)
    con.execute("DELETE FROM export_queue WHERE batch = ?", [batch])
    shutil.rmtree(scratch, ignore_errors=True)
    return rows
