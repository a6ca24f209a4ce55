"""Owns the DuckDB database: exchanges stitched into trajectories and scenarios, and the
queries the other parts ask.

The proxy computes a request's stitching keys (`trajectories.keys`) and calls
`Collector.log()` (a durable append to the spool); a background task in the one process
that owns the database loads the spool into DuckDB in batches, placing each exchange in
its trajectory and scenario as it goes. `queries` holds the questions other
parts ask (`await collector.query(lambda store: queries.trajectory(store, trajectory_id))`).

Other packages read and write through `Store`, on the collector's database thread:
rows leave as typed records (`Store.rows(Record, sql)`, each field filled by its
column's name), single values (`scalar`, `column`) or nothing (`execute`); `dicts` is the
collector's own (`tests/test_layers.py` holds it).

What each module holds (the why of each rule, at length: `docs/collector.md`):

- `schema.py`: the schema and its migrations; the rebuild of linear storage
  (`exchanges_rebuilt`, `exchanges_full`).
- `writer.py`: `Collector`, the façade the other packages hold: it builds the three
  rooms below, starts and closes them in order, and gives their counters
  (`CollectorStats`); a proxy-only process's collector only writes.
- `spool.py`, `lines.py`, `spooler.py`, `loader.py`: the spool, durable before the answer
  leaves: a segment per writing process of one host; closed segments loaded so a turn is
  never placed before the one it continues; a dead writer's segment claimed; a segment
  DuckDB refuses for its content loaded line by line, each line refused alone set aside
  in `failed/` with its reason so the rest still load; a line torn anywhere but at a
  segment's end reported as corruption; each load sized to its longest line; an
  exchange past `collector.max_line_bytes` stored without its bodies. `spooler.py` is
  the spool writer every process has (the line cap, the spool directory's cap, the
  lineage memory, a proxy-only process's rotation and hand-off to the bucket);
  `loader.py` the loader of the process that owns the database (placing, the bucket's
  and the lake's leases, snapshots, export, retention, forgetting, the background loop).
- `database.py`: the database handle (`Collector.database`, typed `query(fn: Store ->
  T)`): every statement on the one database thread, users' queries on the readers'
  thread, a lake's catalog outage raised as `CatalogUnreachable` for every caller.
- `handoff.py`, `lease.py`, `snapshots.py`: the hand-off between hosts through object
  storage (`collector.bucket`): each host uploads its closed segments create-only and a
  watermark, the earliest opening of what it has not uploaded; the loader fetches them
  and holds back what closed after the lowest live watermark, so turns alternating
  between hosts load in order; a host past `collector.host_lease_s` on the bucket's
  clock holds nothing back, and uploads its open segment when it restarts. One loader at
  a time, by a lease in the bucket written with conditional requests; the others are
  standbys that hand their traffic over and take the lease when it ends, each segment's
  tombstone naming its loader. The loader's database is copied to the bucket every
  `collector.snapshot_s` with the segments loaded since, which a server taking the lease
  restores. A deletion reaches the hosts' memory of conversations through
  `forgotten.mark` in the bucket.
- `export.py`: the continuous export of exchanges as day-partitioned Parquet in the
  bucket (`collector.export_s`).
- `store.py`: bulk loading into DuckDB, placing each line as it loads, the parent
  check, and the trajectory and scenario upserts of a load that touches few of their
  rows through the primary keys' indexes (a small load's cost does not grow with the
  tables), into row groups of 2,048 rows (a checkpoint's memory grows with the last row
  group's list values), DuckDB's cache and stale eviction-queue entries handed back after
  each load; the typed reads above.
- `linear.py`: linear storage: what a turn stores against the exchange it continues, or
  a first turn against the opening its conversation shares with others of its system
  prompt and tools, decided where the record is made, with its bounded memory of live
  conversations and openings (each spool segment carries the openings its lines need).
- `trajectories.py`: stitching and scenarios, one API key's apart from another's: the
  keys the proxy computes, the placement the loader makes.
- `forget.py`: deleting conversations and all derived from them, for `onjob forget` and
  `collector.retention_days`, with the rule the loader applies so no spool segment
  brings them back, then a checkpoint so the WAL no longer holds them, and their lines
  set aside in `failed/` removed.
- `readonly.py`, `sqlguard.py`: users' read-only queries and Parquet exports (of one
  tenant's rows too, table by table as forget finds a key's), in a read-only transaction
  on a cursor of their own; each query checked to read only the database's own tables on
  DuckDB's syntax tree, CTE scope included, and again on its bound plan.
- `records.py`: typed records, each one spool line whatever bytes a client sent.
- `queries.py`: read queries other packages ask.
- `scope.py`: which API keys' rows a lineage may read (one SQL condition the snapshot,
  the test prompts and the canary's guards share), how a lineage is named (`alias`,
  `alias@tenant`) and spelt on the command line, and what one tenant's export takes
  (`TenantRows`).
- `budgets.py`: the judge's and the trainer's daily budgets, read from their rows.
- `extensions.py`: DuckDB's extensions loaded from their installed packages, never from
  the network.
- `lake.py`, `jobs.py`, `outage.py`: the log in DuckLake (`collector.catalog`;
  docs/scaling.md, "The log in DuckLake"): a lake attached, made in the schema's end
  state, its history taken out after a deletion, every server writing its own exchanges
  and one leading by a lease in the lake, its small files merged by the leader every
  `collector.compact_s`; each lineage's work one worker's at a time, by a lease per
  lineage (`jobs.py`); a writer's stitcher asks the lake for the conversations other
  writers placed (`Store.continuing`); a catalog that does not answer, its answers
  waiting in the spool, its loads backed off, said once each way, raised as
  `CatalogUnreachable` (`outage.py`).
"""

from . import budgets, queries, readonly
from .errors import CatalogUnreachable, CollectorError, NotLeading, StorageError
from .forget import Forget, ForgetError, Forgotten
from .linear import Lineage, rebuilt
from .records import ExchangeRecord, FeedbackRecord, Resample
from .settings import CollectorSettings
from .store import Store
from .trajectories import Placement, Stitcher
from .writer import Collector

__all__ = [
    "CatalogUnreachable",
    "Collector",
    "CollectorError",
    "CollectorSettings",
    "ExchangeRecord",
    "FeedbackRecord",
    "Forget",
    "ForgetError",
    "Forgotten",
    "Lineage",
    "NotLeading",
    "Placement",
    "Resample",
    "Stitcher",
    "StorageError",
    "Store",
    "budgets",
    "queries",
    "readonly",
    "rebuilt",
]
