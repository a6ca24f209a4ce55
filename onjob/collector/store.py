"""The DuckDB side: loading spool segments exactly once, and the queries other parts ask.

A segment goes in with one `INSERT ... SELECT` per table (DuckDB's `read_json`: no Python
objects), in one transaction with its name in `loaded_segments`, so replaying it after a
crash changes nothing; a line `onjob forget` or retention deleted is dropped (`_absent`).
After each load DuckDB gives back its cache and stale eviction-queue entries
(`release_memory`), and the file is attached with small row groups (`ROW_GROUP_ROWS`):
both bound memory that `memory_limit` does not (docs/collector.md, "Loading into DuckDB").
`Store` is used from one thread at a time; users' queries run on a cursor of their own
through `read`, while no eviction runs.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import duckdb
import msgspec

from . import jobs, lake
from .errors import StorageError
from .ids import new_id
from .records import KINDS, Resample
from .schema import migrate
from .settings import CollectorSettings

T = TypeVar("T")
R = TypeVar("R")  # a record `Store.rows` builds

# A lake's writer looks this far back for the conversations other writers placed that a
# turn continues (`Store.continuing`): older ones it starts anew, as a file's loader does
# those past its stitcher's memory.
CONTINUED_DAYS = 1
# A lake's leader trusts its lease for this share of it after its last claim: the claim's
# own round trip and the renewals a third apart leave the rest as the margin.
LEASE_TRUSTED = 0.9
# A lake's snapshots, and the files only they read, are kept this long after a newer one
# replaces them (`compact`): a reader's transaction older than that may lose its files.
KEEP_SNAPSHOTS_S = 3600
LAKE_RETRIES = 8  # a lake's statement retried this many times when another writer's commit clashed
ROW_GROUP_ROWS = 2048  # docs/collector.md, "Loading into DuckDB", says why
_RESERVED = {"memory", "system", "temp", "main"}  # catalog names an attached file cannot take

_COLUMNS = (
    "id, ts, trajectory_id, turn, scenario_id, api_key_id, model_alias, checkpoint, arm, stream, "
    "request, response, prompt_token_ids, completion_token_ids, completion_logprobs, usage, "
    "latency_ms, status, error, metadata, source, continuation_hashes, served_model, "
    "logprobs_mode, api, api_object, parent_id, messages_kept, prompt_kept, "
    "request_kept, untrainable"
)

# The spool line's fields (records.py) as DuckDB reads them.
_LINE = {
    "kind": "VARCHAR",
    "id": "VARCHAR",
    "ts": "DOUBLE",
    "trajectory_id": "VARCHAR",
    "turn": "INTEGER",
    "scenario_id": "VARCHAR",
    "scenario_key": "VARCHAR",
    "scenario_keyed": "VARCHAR",
    "model_alias": "VARCHAR",
    "api_key_id": "VARCHAR",
    "checkpoint": "VARCHAR",
    "arm": "VARCHAR",
    "stream": "BOOLEAN",
    "request": "JSON",
    "response": "JSON",
    "prompt_token_ids": "INTEGER[]",
    "completion_token_ids": "INTEGER[][]",
    "completion_logprobs": "FLOAT[][]",
    "usage": "JSON",
    "latency_ms": "DOUBLE",
    "status": "INTEGER",
    "error": "VARCHAR",
    "metadata": "JSON",
    "source": "VARCHAR",
    "continuation_hashes": "VARCHAR[]",
    "served_model": "VARCHAR",
    "logprobs_mode": "VARCHAR",
    "untrainable": "VARCHAR",
    "api": "VARCHAR",
    "api_object": "JSON",
    "parent_id": "VARCHAR",
    "messages_kept": "INTEGER",
    "prompt_kept": "INTEGER",
    "request_kept": "VARCHAR[]",
    "after_turn": "INTEGER",
    "retry_of": "VARCHAR",
    "stitch": "VARCHAR[]",
    "prefix_hash": "VARCHAR",
    "exchange_id": "VARCHAR",
    "value": "DOUBLE",
    "comment": "VARCHAR",
    "metric": "VARCHAR",
}
# DuckDB's default `maximum_object_size`, 16 MiB, reads lines of up to 32 MiB. A body
# under `proxy.max_body_bytes` (16 MiB) is stored up to three times (the request, its
# `metadata`, a Response's input items and echo): such lines of answered exchanges were
# refused. The reader keeps a buffer of twice that size for every thread whatever the lines
# hold, counted against `memory_limit`, so each load's size is its longest line's.
_OBJECT_SIZE = 16 << 20


def _read(longest: int) -> str:
    """The query reading a batch of segments whose longest line is `longest` bytes. Read
    strictly: with `ignore_errors` DuckDB loaded a line with a mistyped field (a string for
    a number, an id given twice) with NULLs in place of its values, and skipped a line it
    could not parse in silence; a line refused here is set aside alone with DuckDB's
    reason (`lines.load_by_line`)."""
    return (
        "CREATE OR REPLACE TEMP TABLE segment AS SELECT * REPLACE (to_timestamp(ts) AS ts) "
        "FROM read_json(?, format = 'newline_delimited', ignore_errors = false, "
        f"maximum_object_size = {max(_OBJECT_SIZE, longest + 1)}, columns = {_LINE!r})"
    )


def _longest_line(path: Path) -> int:
    """The length of `path`'s longest line: no line of a file is longer than the file, so
    only a file past DuckDB's default is scanned (one `find` per line)."""
    size = path.stat().st_size
    if size <= _OBJECT_SIZE:
        return size
    data, start, longest = path.read_bytes(), 0, 0
    while (end := data.find(b"\n", start)) >= 0:
        longest, start = max(longest, end - start), end + 1
    return max(longest, len(data) - start)


class Unplaced(msgspec.Struct, frozen=True):
    """A spool line the loader places in its trajectory (`Placer`): the columns `_UNPLACED`
    selects, by name, so their order lives here alone."""

    id: str
    ts: datetime  # when its request arrived (this host's clock)
    api_key_id: str | None
    trajectory_id: str | None  # a conversation the client named, or a Responses API chain
    after_turn: int | None
    stitch: list[str] | None
    prefix_hash: str | None
    continuation_hashes: list[str] | None
    scenario_key: str
    scenario_keyed: str
    status: int | None
    retry_of: str | None


class Placed(NamedTuple):
    """Where the loader put a line: `_PLACE`'s objects, one field each."""

    id: str
    trajectory_id: str
    turn: int
    scenario_id: str


# The lines the loader places, in the order their requests arrived: a turn is placed after
# the turn it continues, whichever process or segment each came from.
_UNPLACED = f"""
SELECT {", ".join(Unplaced.__struct_fields__)}
FROM segment WHERE kind = 'exchange' AND turn IS NULL ORDER BY ts, id
"""
# The placements go in as one JSON text, not as list parameters: DuckDB 1.5 binds a
# Python list parameter in time that grows with its square (2,000 placements: 550 us
# each, against 5 as JSON; 2.0 takes 1-2 us either way).
_PLACE = """
UPDATE segment SET trajectory_id = p.trajectory_id, turn = p.turn, scenario_id = p.scenario_id
FROM (SELECT unnest(from_json(?, '[{"id": "VARCHAR", "trajectory_id": "VARCHAR",
                                    "turn": "INTEGER", "scenario_id": "VARCHAR"}]'),
                    recursive := true)) p
WHERE segment.id = p.id
"""

Placer = Callable[[list[Unplaced]], list[Placed]]
"""The lines to place, in order -> where each went (`Loader._place`)."""

# Lines `onjob forget` or retention deleted (`forgotten`, `forget.py`) are dropped before
# anything is inserted: equality joins for the few named trajectories and keys, one
# maximum for the dates.
_FORGOTTEN = """
DELETE FROM segment WHERE id IN (
    SELECT s.id FROM segment s JOIN {forgotten} f
        ON f.trajectory_id = s.trajectory_id AND s.ts <= f.until
    UNION ALL
    SELECT s.id FROM segment s JOIN {forgotten} f
        ON f.api_key_id = s.api_key_id AND s.ts <= f.until
    UNION ALL
    SELECT id FROM segment WHERE ts < (
        SELECT max(until) FROM {forgotten} WHERE trajectory_id IS NULL AND api_key_id IS NULL)
)
"""

# A lake keeps no ledger of loaded segments (`loaded_segments`: each writer deleting its
# rows after each load clashed with every other writer's load, DuckLake refusing an
# insert beside a delete of the same table's inlined rows). Each load drops the lines
# already in instead, by their ids: a segment replayed after a crash between its commit
# and its removal, a segment loaded again for the lines it held back (`Store.load`).
# Bounded by the segment's own times (constants, so DuckLake reads only the files whose
# statistics may hold them): without the bounds each load read every file's ids, and a
# load's cost grew with the lake (100,000 exchanges: 2.6 ms of loader CPU each).
_LOADED_ALREADY = """
DELETE FROM segment WHERE (kind = 'exchange' AND id IN (
    SELECT id FROM exchanges WHERE ts BETWEEN $low AND $high
      AND id IN (SELECT id FROM segment WHERE kind = 'exchange')))
  OR (kind = 'feedback' AND id IN (
    SELECT id FROM feedback WHERE ts BETWEEN $low AND $high
      AND id IN (SELECT id FROM segment WHERE kind = 'feedback')))
"""

# Linear storage (`linear.py`): a turn stored against a parent that is nowhere (neither in
# the segment nor in the table) could not be rebuilt, so it is dropped, with the turns
# stored against it, rather than read back wrong. It happens only when the parent was
# deleted while the turn waited in the spool (`forget`, retention at its boundary), or its
# segment was set aside. The parents outside the segment are looked up in `Store.load`:
# first among the ids recent loads inserted (held in memory), then by the primary key's
# index, a bounded list of constants at a time. A join with `exchanges` would scan its
# whole id column on every load (all 117 row groups of a 208,000-exchange table: a load's
# cost grew with the table, `python -m bench.collector.loader_statements --prefill`).
_OUTSIDE = """
SELECT DISTINCT parent_id FROM segment WHERE parent_id IS NOT NULL
EXCEPT SELECT id FROM segment WHERE id IS NOT NULL
"""
_DROP_CHILDREN = "DELETE FROM segment WHERE list_contains(?, parent_id) RETURNING id"
RECENT_IDS = 100_000  # ids of exchanges recent loads inserted, held to find parents in
LOOKUP = 2048  # constants per index lookup: DuckDB's `index_scan_max_count`
SCAN_PER_LOOKUP = 600  # table rows scanned for the cost of one row looked up (`_upsert`)

# An opening (`linear.py`) goes in with the first segment that has a line stored against it;
# one whose lines were all dropped (forgotten) does not, so deleted text never comes back
# through it. Every segment that needs one carries its own copy: the same id again is
# already in.
_OPENINGS = """
INSERT INTO openings
SELECT id, any_value(api_key_id), min(ts), any_value(request), any_value(prompt_token_ids)
FROM segment
WHERE kind = 'opening'
  AND id IN (SELECT parent_id FROM segment WHERE kind = 'exchange')
  AND id NOT IN (SELECT o.id FROM openings o
                 JOIN (SELECT DISTINCT id FROM segment WHERE kind = 'opening') s ON s.id = o.id)
GROUP BY id
"""


class Store:
    """The database: the file at `path`, or with `catalog` the DuckLake whose catalog is that
    Postgres database and whose data files lie under `data_path` (`lake.py`; `path` then
    only places DuckDB's temporary files)."""

    def __init__(
        self,
        path: Path | str,
        threads: int | None = None,
        memory_limit: str | None = None,
        scan_per_lookup: int = SCAN_PER_LOOKUP,
        *,
        catalog: str | None = None,
        data_path: str | None = None,
        lease_s: float = lake.LEADER_LEASE_S,
        follow: bool = False,
    ) -> None:
        self.in_lake = catalog is not None
        # A lake's writer: who this process is in the leader's lease (`lake.claim`), who
        # holds it (None: this one), and when it last tried (monotonic). `follow`: write
        # whether or not it leads (a server); else it must lead (`keep_lease`).
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{new_id('w')}"
        self.lease_s = lease_s
        self.leader: str | None = None
        self.claimed = -math.inf
        try:
            # Spills beside the file, as DuckDB puts them for a file it opens itself: an
            # in-memory connection's default is `.tmp` in whatever directory onjob runs in.
            config: dict = {"temp_directory": f"{path}.tmp"}
            if threads:
                config["threads"] = threads
            if memory_limit:
                config["memory_limit"] = memory_limit
            self.path = Path(path)
            self.orphaned = 0  # turns the last load dropped: their parent was deleted
            self.held = 0  # a lake's lines the last load held back (`load`)
            self.forgotten_rows: int | None = None  # a lake's forget rules, at the last load
            self.exporting = False  # True: each load queues its exchanges (`export.py`)
            self.scan_per_lookup = scan_per_lookup  # `_upsert`'s choice
            self.con = duckdb.connect(":memory:", config=config)
            if catalog is not None:
                lake.attach(self.con, catalog, data_path or "")
                self._use = f"USE {lake.NAME}"
                self.schema_before = lake.migrate(self.con)
                jobs.make(self.con)  # a lake made before workers had leases lacks it
                try:
                    self.keep_lease(required=not follow)
                except StorageError:
                    self.con.close()
                    raise
            else:
                self._use = self._attach_file(Path(path))
                self.schema_before = migrate(self.con)
            # The limit set again after each eviction (`release_memory`): as given, or DuckDB's
            # default (RESET: its displayed value is rounded).
            self._limit = (
                "SET memory_limit = '{}'".format(memory_limit.replace("'", "''"))
                if memory_limit
                else "RESET memory_limit"
            )
            self._reading = threading.Lock()  # held while `read` runs a user's query
            self._recent: OrderedDict[str, None] = OrderedDict()  # `RECENT_IDS`, oldest first
            self._openings_in: set[str] = set()  # a lake's openings known to be in it
        except duckdb.IOException as exc:
            raise StorageError(
                f"cannot open {path}: {exc}. DuckDB allows one read-write process per file; "
                "is `onjob serve` already running on it?"
            ) from exc
        except duckdb.Error as exc:  # e.g. a memory limit DuckDB cannot parse
            raise StorageError(f"cannot open {path}: {exc}") from exc

    @classmethod
    def open(
        cls, settings: CollectorSettings, *, tuned: bool = False, follow: bool = False
    ) -> Store:
        """The database `settings` name: the file `db`, or the lake of `catalog`. `tuned`:
        with `duckdb_threads` and `duckdb_memory_limit` (the server's loader; a command's
        short use takes DuckDB's defaults). `follow`: a lake's server, which writes whether
        or not it leads (a command must lead)."""
        return cls(
            settings.db,
            settings.duckdb_threads if tuned else None,
            settings.duckdb_memory_limit if tuned else None,
            catalog=settings.catalog,
            data_path=settings.data_path,
            follow=follow,
        )

    def _attach_file(self, path: Path) -> str:
        """Attach the database file; the `USE` statement that makes it the default. Named as
        the file is when opened directly (`current_database()`), unless that name is one
        DuckDB keeps for itself."""
        name = path.stem
        name = "onjob" if name.lower() in _RESERVED else name
        catalog = '"{}"'.format(name.replace('"', '""'))
        file = "'{}'".format(str(path).replace("'", "''"))
        self.con.execute(f"ATTACH {file} AS {catalog} (ROW_GROUP_SIZE {ROW_GROUP_ROWS})")
        _private(path, Path(f"{path}.wal"))
        self.con.execute(f"USE {catalog}")
        return f"USE {catalog}"

    @property
    def leading(self) -> bool:
        """A file's one writer always; a lake's, while it holds the leader's lease: its
        last claim was its own and is younger than the lease, less a margin. A leader that
        cannot renew (its catalog unreachable) stops leading before the lease it holds in
        the catalog ends, so that when another takes it over, this one no longer leads."""
        if not self.in_lake:
            return True
        fresh = time.monotonic() - self.claimed < self.lease_s * LEASE_TRUSTED
        return self.leader is None and fresh

    def keep_lease(self, *, required: bool = False) -> None:
        """A lake's writer: claim or renew the leader's lease (`lake.claim`), and note who
        holds it. `required`: `StorageError`, naming the holder, while another does."""
        asked = time.monotonic()  # the lease runs from the catalog's commit, after this
        held = lake.claim(self.con, self.holder, self.lease_s)
        self.claimed = asked
        self.leader = None if held is None else held[0]
        if held is not None and required:
            who, until = held
            raise StorageError(
                f"another onjob leads this DuckLake ({who}, its lease until "
                f"{until:%Y-%m-%d %H:%M:%S %Z}): ask it instead (--server URL), or run "
                f"this once it has stopped (a leader that died holds it {self.lease_s:g} "
                "s more)"
            )

    def claim_job(self, name: str, lease_s: float) -> str | None:
        """Take or renew this process's lease on a lineage's work (`jobs.claim`): None when
        it holds it now, else who does. A file's one writer always holds every lineage."""
        if not self.in_lake:
            return None
        held = jobs.claim(self.con, name, self.holder, lease_s)
        return None if held is None else held[0]

    def release_job(self, name: str) -> None:
        if self.in_lake:
            jobs.release(self.con, name, self.holder)

    def abandon(self) -> None:
        """End whatever transaction a statement that could not reach a lake's catalog left
        open (DuckDB's ROLLBACK of it needs no catalog; none open: nothing to do)."""
        try:
            self.con.execute("ROLLBACK")
        except duckdb.Error as exc:
            if lake.unreachable(exc):
                raise

    def close(self) -> None:
        if self.in_lake and self.leading:
            with contextlib.suppress(duckdb.Error):
                lake.release(self.con, self.holder)
        self.con.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own to the same database (for another thread)."""
        cursor = self.con.cursor()
        cursor.execute(self._use)
        return cursor

    def load_segment(self, path: Path, place: Placer | None = None) -> int:
        """`load([path], place)`."""
        return self.load([path], place)

    def load(self, paths: list[Path], place: Placer | None = None, *, again: bool = True) -> int:
        """Load spool segments in one transaction, each exactly once per file name: the
        exchanges inserted. A line DuckDB cannot read as a spool record (not JSON, a field
        of the wrong type, no `kind` a record has) refuses the whole load (`StorageError`).
        Lines not yet placed in a trajectory are placed by `place`, in the order their
        requests arrived (without it they must come placed). On a lake `place` may hold
        lines back (it returns no place for them): they, and the turns stored against
        them, wait in their segment, which loads again later (`held`; what is in by then is
        dropped by its id, `_LOADED_ALREADY`). `again`: on a lake, whether some of the lines
        may be in already (a segment loaded before, or replayed after a crash); False
        spares the look."""
        con = self.con
        self.held = 0
        con.execute("BEGIN TRANSACTION")
        try:
            if not self.in_lake:
                loaded = {
                    name
                    for (name,) in con.execute(
                        "SELECT name FROM loaded_segments WHERE list_contains(?, name)",
                        [[p.name for p in paths]],
                    ).fetchall()
                }
                paths = [p for p in paths if p.name not in loaded]
            if not paths:
                con.execute("ROLLBACK")
                return 0
            longest = max(_longest_line(p) for p in paths)
            con.execute(_read(longest), [[str(p) for p in paths]])
            if self.in_lake and again:
                low, high = con.execute("SELECT min(ts), max(ts) FROM segment").fetchone()
                con.execute(_LOADED_ALREADY, {"low": low, "high": high})
            unplaced = self.rows(Unplaced, _UNPLACED)
            if unplaced:
                if place is None:
                    raise StorageError("spool lines with no trajectory and nothing to place them")
                placed = [p._asdict() for p in place(unplaced)]
                con.execute(_PLACE, [msgspec.json.encode(placed).decode()])
                if len(placed) < len(unplaced):
                    self._hold({u.id for u in unplaced} - {p["id"] for p in placed})
            self._drop_forgotten()
            self.orphaned = 0
            missing = self._absent([p for (p,) in con.execute(_OUTSIDE).fetchall()])
            while missing:  # a level of turns a pass: the turns stored against those dropped
                missing = [i for (i,) in con.execute(_DROP_CHILDREN, [missing]).fetchall()]
                self.orphaned += len(missing)
            inserted, strays = con.execute(
                "SELECT count(*) FILTER (WHERE kind = 'exchange'), "
                "count(*) FILTER (WHERE kind IS NULL OR NOT list_contains(?, kind)) FROM segment",
                [list(KINDS)],
            ).fetchone()
            if strays:  # JSON, but no spool record: refused like a line DuckDB cannot read
                raise StorageError(f"{strays} lines with no kind a spool record has")
            for p in paths if not self.in_lake else ():  # the batch's count on its first name
                con.execute(
                    "INSERT INTO loaded_segments VALUES (?, ?, now())",
                    [p.name, inserted if p is paths[0] else 0],
                )
            self._insert(inserted)
            if self.exporting:
                con.execute(
                    "INSERT INTO export_queue SELECT id, NULL FROM segment WHERE kind = 'exchange'"
                )
            ids = con.execute("SELECT id FROM segment WHERE kind = 'exchange'").fetchall()
            con.execute("DROP TABLE segment")  # not kept (or spilled to disk) until the next load
            con.execute("COMMIT")
        except BaseException as exc:
            # A lake's COMMIT that clashed has ended its transaction already.
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            if isinstance(exc, duckdb.Error):
                names = ", ".join(p.name for p in paths)
                raise StorageError(f"loading spool segments {names} failed: {exc}") from exc
            raise
        for (i,) in ids:
            self._recent[i] = None
        while len(self._recent) > RECENT_IDS:
            self._recent.popitem(last=False)
        self.release_memory()
        return inserted

    def _drop_forgotten(self) -> None:
        """The lines a forget's rule covers (`forget._remember`) out of the load. On a lake,
        where each statement reading a lake table costs its catalog's round trips (~20 ms
        here), the rules are read once into a temporary table (and their count kept:
        `forgotten_rows`), and none are looked for when there are none."""
        con = self.con
        if not self.in_lake:
            con.execute(_FORGOTTEN.format(forgotten="forgotten"))
            return
        con.execute(
            "CREATE OR REPLACE TEMP TABLE rules AS "
            "SELECT trajectory_id, api_key_id, until FROM forgotten"
        )
        (self.forgotten_rows,) = con.execute("SELECT count(*) FROM rules").fetchone()
        if self.forgotten_rows:
            con.execute(_FORGOTTEN.format(forgotten="rules"))

    def _hold(self, ids: set[str]) -> None:
        """Lines the placer held back, and the turns stored against them, out of this load."""
        if not self.in_lake:
            raise StorageError("a file's loader places every line it loads")
        held = list(ids)
        while held:
            self.held += len(held)
            con = self.con
            con.execute("DELETE FROM segment WHERE list_contains(?, id)", [held])
            held = [i for (i,) in con.execute(_DROP_CHILDREN, [held]).fetchall()]

    def _absent(self, parents: list[str]) -> list[str]:
        """Of these parent ids, those neither in `exchanges` nor in `openings`."""
        absent = []
        for chunk in _chunks([p for p in parents if p not in self._recent]):
            found = {*self._found("exchanges", chunk), *self._found("openings", chunk)}
            absent += [p for p in chunk if p not in found]
        return absent

    def forgot(self) -> None:
        """Rows were deleted: no id recent loads inserted is known to be there any more."""
        self._recent.clear()
        self._openings_in.clear()

    def release_memory(self) -> bool:
        """Evict every buffer DuckDB can (the next load reads back the few index and table
        blocks it needs, from the OS's page cache) and drop every stale eviction-queue
        entry, then return the allocator's free pages to the OS. docs/collector.md says
        why; bench/collector/loader_memory.py measures it. False, and nothing done, while
        `read` runs.

        DuckDB evicts only to reach a `memory_limit` being set: asked for one byte it walks
        every queue, evicts all it can, and refuses the limit (what is pinned stays over it),
        leaving the limit as it was; setting the real limit again flushes the allocator.
        Where nothing is pinned the one byte is accepted, so the real limit follows in the
        same call: between the two statements no other statement of this connection runs
        (one at a time), nor a user's (`read` waits), and no memory is needed to set it."""
        if not self._reading.acquire(blocking=False):
            return False
        try:
            try:
                self.con.execute(f"SET memory_limit = '1B'; {self._limit}")
            except duckdb.OutOfMemoryException:  # refused: the usual case
                self.con.execute(self._limit)
        finally:
            self._reading.release()
        return True

    def read(self, fn: Callable[[duckdb.DuckDBPyConnection], T], cursor) -> T:
        """`fn(cursor)` for a user's query on a cursor of its own, from another thread:
        `release_memory` does not run meanwhile."""
        with self._reading:
            return fn(cursor)

    def _insert(self, exchanges: int) -> None:
        con = self.con
        if self.in_lake:
            self._lake_openings()
        else:
            con.execute(_OPENINGS)
        con.execute(
            f"INSERT INTO exchanges ({_COLUMNS}) SELECT {_COLUMNS} FROM segment "
            "WHERE kind = 'exchange'"
        )
        # Failed exchanges stay in `exchanges` (with their status) but are no turn of a
        # conversation. A trajectory is new where its turn 0 is: scenarios count those.
        self._upsert(
            "scenarios",
            """
            SELECT scenario_id, any_value(scenario_key), any_value(scenario_keyed), min(ts),
                   count(*) FILTER (WHERE turn = 0)
            FROM segment WHERE kind = 'exchange' AND status < 400 GROUP BY scenario_id
            """,
            "count = scenarios.count + excluded.count",
            exchanges,
        )
        self._upsert(
            "trajectories",
            """
            SELECT trajectory_id, any_value(scenario_id), arg_min(checkpoint, turn),
                   arg_min(arm, turn), arg_min(id, turn), arg_max(id, turn), max(turn) + 1,
                   any_value(source), min(ts), max(ts)
            FROM segment WHERE kind = 'exchange' AND status < 400 GROUP BY trajectory_id
            """,
            """
            last_exchange = CASE WHEN excluded.n_turns >= trajectories.n_turns
                                 THEN excluded.last_exchange
                                 ELSE trajectories.last_exchange END,
            n_turns = greatest(trajectories.n_turns, excluded.n_turns),
            last_ts = greatest(trajectories.last_ts, excluded.last_ts)
            """,
            exchanges,
        )
        con.execute(
            "INSERT INTO feedback SELECT id, exchange_id, trajectory_id, api_key_id, value, "
            "comment, ts, metric FROM segment WHERE kind = 'feedback'"
        )

    def _lake_openings(self) -> None:
        """`_OPENINGS` on a lake, whose every statement reading a table costs its catalog's
        round trips: the openings this writer knows are in (its own: `Lineage.salt`) are
        kept in memory, and the lake is asked only about the others."""
        con = self.con
        needed = [
            i
            for (i,) in con.execute(
                "SELECT DISTINCT id FROM segment WHERE kind = 'opening' "
                "AND id IN (SELECT parent_id FROM segment WHERE kind = 'exchange')"
            ).fetchall()
            if i not in self._openings_in
        ]
        if not needed:
            return
        there = {i for chunk in _chunks(needed) for i in self._found("openings", chunk)}
        con.execute(
            "INSERT INTO openings SELECT id, any_value(api_key_id), min(ts), any_value(request), "
            "any_value(prompt_token_ids) FROM segment WHERE kind = 'opening' "
            "AND list_contains(?, id) GROUP BY id",
            [[i for i in needed if i not in there]],
        )
        if len(self._openings_in) > RECENT_IDS:
            self._openings_in.clear()
        self._openings_in.update(needed)

    def _upsert(self, table: str, rows: str, update: str, most: int) -> None:
        """`INSERT INTO table rows ON CONFLICT (id) DO UPDATE SET update` (`rows`: the
        table's columns in order, `id` first, at most `most` of them; `update` names them
        `excluded.<column>`).

        DuckDB 2.0 runs that as a merge that scans the whole table, so its cost grows with
        the table; looking a row up in the primary key's index costs ~200 µs (ids fall in
        random row groups) against ~0.3 µs per row of the table scanned
        (`bench/collector/loader_statements.py`). So a load that touches few rows of a large table
        looks them up, updates them through the index (an `UPDATE` filtered by the ids as
        constants) and inserts the others; any other takes the merge."""
        con = self.con
        if self.in_lake:  # a part of the row, appended (`lake.PARTS`)
            con.execute(f"INSERT INTO {lake.PARTS[table]} {rows}")
            return
        (held,) = con.execute(f"SELECT count(*) FROM {table}").fetchone()
        if most * self.scan_per_lookup > held:
            con.execute(f"INSERT INTO {table} {rows} ON CONFLICT (id) DO UPDATE SET {update}")
            return
        con.execute(f"CREATE OR REPLACE TEMP TABLE upserted AS SELECT * FROM {table} LIMIT 0")
        con.execute(f"INSERT INTO upserted {rows}")
        ids = [i for (i,) in con.execute("SELECT id FROM upserted").fetchall()]
        existing = [i for chunk in _chunks(ids) for i in self._found(table, chunk)]
        for chunk in _chunks(existing):
            con.execute(
                f"UPDATE {table} SET {update} FROM upserted AS excluded "
                f"WHERE {table}.id = excluded.id AND {table}.id IN ({_constants(chunk)})"
            )
        con.execute(
            f"INSERT INTO {table} SELECT * FROM upserted WHERE NOT list_contains(?, id)",
            [existing],
        )
        con.execute("DROP TABLE upserted")

    def _found(self, table: str, ids: list[str]) -> list[str]:
        """Which of these ids (at most `LOOKUP`) `table` holds: a lookup in its primary key's
        index (for constants, not parameters, DuckDB uses the index; a join scans)."""
        return [
            i
            for (i,) in self.con.execute(
                f"SELECT id FROM {table} WHERE id IN ({_constants(ids)})"
            ).fetchall()
        ]

    def copy_file(self, target: Path) -> None:
        """The database file copied whole to `target`, its WAL written in first; no user's
        query runs meanwhile (one in a transaction would keep the checkpoint from taking
        it all). Raises `StorageError` when DuckDB cannot checkpoint: no partial copy."""
        if self.in_lake:
            raise StorageError("a DuckLake is not copied: every host attaches it")
        with self._reading:
            try:
                self.con.execute("CHECKPOINT")
            except duckdb.Error as exc:
                raise StorageError(f"cannot checkpoint {self.path} to copy it: {exc}") from exc
            shutil.copyfile(self.path, target)

    def newest_exchange_ms(self) -> int | None:
        """When the newest exchange here was logged (ms; None: none)."""
        return self.con.execute("SELECT epoch_ms(max(ts)) FROM exchanges").fetchone()[0]

    def forget_segment(self, segment: str) -> None:
        """The segment file is deleted: its ledger row is no longer needed (a lake keeps
        none, `_LOADED_ALREADY`)."""
        if not self.in_lake:
            self.con.execute("DELETE FROM loaded_segments WHERE name = ?", [segment])

    def checkpoint(self) -> bool:
        """After a deletion, so nothing of the database still holds what was deleted. The
        file: its WAL written into it (DuckDB then deletes the WAL). A lake: its history of
        the deleted rows taken out (`lake.forget_history`: older snapshots, the files that
        held them, the column statistics that bounded them). False when DuckDB could not
        (the file's WAL then goes at the next automatic checkpoint, or on close; a lake's
        history at its next deletion)."""
        for attempt in range(LAKE_RETRIES if self.in_lake else 1):
            try:
                if self.in_lake:
                    lake.forget_history(self.con)
                else:
                    self.con.execute("CHECKPOINT")
                return True
            except duckdb.TransactionException:  # another writer committed first: again
                time.sleep(0.05 * (attempt + 1))
            except duckdb.Error:
                return False
        return False

    def compact(self, keep_s: float = KEEP_SNAPSHOTS_S) -> int:
        """A lake's small data files merged and its history older than `keep_s` removed
        (`lake.compact`), made again when another writer's commit clashed; the files merged
        (a file: 0, DuckDB keeps it compact itself)."""
        if not self.in_lake:
            return 0
        for attempt in range(LAKE_RETRIES):
            try:
                return lake.compact(self.con, keep_s)
            except duckdb.TransactionException:
                with contextlib.suppress(duckdb.Error):
                    self.con.execute("ROLLBACK")
                time.sleep(0.05 * (attempt + 1))
        return lake.compact(self.con, keep_s)

    def forget_pieces(self, prefix: str) -> None:
        """A refused segment is done with (`lines.load_by_line`): its pieces' ledger rows go
        (a lake keeps none)."""
        if not self.in_lake:
            self.con.execute("DELETE FROM loaded_segments WHERE starts_with(name, ?)", [prefix])

    def forget_response(self, exchange_id: str) -> bool:
        """`DELETE /v1/responses/{id}`: the stored Response goes (the exchange stays, to
        learn from); committed before the client hears it is gone. False if none was."""
        with self.transaction() as con:  # no RETURNING: a lake's UPDATE has none
            (stored,) = con.execute(
                "SELECT count(*) FROM exchanges WHERE id = ? AND api_object IS NOT NULL",
                [exchange_id],
            ).fetchone()
            if stored:
                con.execute("UPDATE exchanges SET api_object = NULL WHERE id = ?", [exchange_id])
        return bool(stored)

    def warm_rows(self, limit: int) -> list[tuple]:
        """The stitcher's state for the most recent `limit` exchanges, oldest first."""
        return self.con.execute(
            """
            SELECT e.trajectory_id, e.turn, e.scenario_id, s.key, s.keyed, e.continuation_hashes,
                   e.api_key_id
            FROM (SELECT * FROM exchanges WHERE source <> 'resample' ORDER BY ts DESC LIMIT ?) e
            JOIN scenarios s ON s.id = e.scenario_id
            ORDER BY e.ts
            """,
            [limit],
        ).fetchall()

    def continuing(self, hashes: list[str], trajectories: list[str]) -> list[tuple]:
        """`warm_rows`' rows for every turn of the trajectories holding a reply among
        `hashes` (a continuation's candidates) or named in `trajectories`, by any writer of
        a lake, within `CONTINUED_DAYS`: what a writer's stitcher learns before placing
        turns that continue conversations another writer placed."""
        return self.con.execute(
            """
            WITH wanted AS (
                SELECT trajectory_id FROM exchanges
                WHERE ts >= now() - to_days(?) AND source <> 'resample'
                  AND list_has_any(continuation_hashes, ?::VARCHAR[])
                UNION SELECT unnest(?::VARCHAR[])
            )
            SELECT e.trajectory_id, e.turn, e.scenario_id, s.key, s.keyed, e.continuation_hashes,
                   e.api_key_id
            FROM exchanges e JOIN scenarios s ON s.id = e.scenario_id
            WHERE e.ts >= now() - to_days(?) AND e.source <> 'resample'
              AND e.trajectory_id IN (SELECT trajectory_id FROM wanted)
            ORDER BY e.ts
            """,
            [CONTINUED_DAYS, hashes, trajectories, CONTINUED_DAYS],
        ).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """Several writes that land together or not at all."""
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            yield con
            con.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(duckdb.Error):  # a lake's failed COMMIT ended it already
                con.execute("ROLLBACK")
            if isinstance(exc, duckdb.Error):
                raise StorageError(f"write failed: {exc}") from exc
            raise

    def add_resample(self, r: Resample) -> None:
        """A re-sampled answer as a `resample` exchange (in the caller's transaction, if
        any): the one write of `exchanges` outside a load."""
        columns = [f for f in r.__struct_fields__ if f != "ts"]
        self.con.execute(
            f"INSERT INTO exchanges (ts, {', '.join(columns)}, stream, status, source) "
            f"VALUES (to_timestamp(?), {', '.join('?' * len(columns))}, false, 200, 'resample')",
            [r.ts, *(getattr(r, f) for f in columns)],
        )

    def rows(self, record: type[R], sql: str, params: list | dict | None = None) -> list[R]:
        """The rows of `sql` as `record`s (a msgspec Struct or a dataclass), each column
        given by name: a column the record lacks, or a field no column fills, is a
        TypeError here, not a wrong value later."""
        cur = self.con.execute(sql, params or [])
        names = [d[0] for d in cur.description]
        return [record(**dict(zip(names, row, strict=True))) for row in cur.fetchall()]

    def scalar(self, sql: str, params: list | dict | None = None) -> Any:
        """The first column of the first row of `sql` (None when it has no row): a count,
        a maximum, one flag."""
        row = self.con.execute(sql, params or []).fetchone()
        return None if row is None else row[0]

    def column(self, sql: str, params: list | dict | None = None) -> list[Any]:
        """The first column of every row of `sql`, in order: ids, names."""
        return [row[0] for row in self.con.execute(sql, params or []).fetchall()]

    def execute(self, sql: str, params: list | dict | None = None) -> None:
        """A write (or any statement whose rows nobody reads)."""
        self.con.execute(sql, params or [])

    def dicts(self, sql: str, params: list | dict | None = None) -> list[dict]:
        """The rows of `sql` as dicts, for the collector's own modules: a row that leaves
        the collector is a record (`rows`), a value (`scalar`, `column`), or nothing
        (`execute`); `tests/test_layers.py` holds it."""
        cur = self.con.execute(sql, params or [])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _private(*files: Path) -> None:
    """The database holds users' traffic: its owner's alone, whatever umask created it (the
    `onjob` command sets 0077 for the files it creates; this covers older files and other
    callers)."""
    for file in files:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(file, 0o600)


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[i : i + LOOKUP] for i in range(0, len(ids), LOOKUP)]


def _constants(ids: list[str]) -> str:
    """SQL string literals, comma-separated (ids come from spool lines: quoted, not trusted)."""
    return ", ".join("'{}'".format(i.replace("'", "''")) for i in ids)
