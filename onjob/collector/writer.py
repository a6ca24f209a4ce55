"""`Collector`: the proxy's one handle on logging, and the loop that loads the spool into DuckDB."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import duckdb

from .forget import Forget, Forgotten, forget
from .linear import Lineage
from .records import ExchangeRecord, Record, encode
from .settings import CollectorSettings
from .spool import Spool
from .store import Store
from .trajectories import Placement, Stitcher

log = logging.getLogger("onjob.collector")
T = TypeVar("T")


def _lower_priority(nice: int) -> None:
    """Loading into DuckDB yields the CPU to the proxy: the database thread (and the worker
    threads DuckDB starts from it, which inherit it) runs at a lower priority, so a flush
    rarely makes an answer wait (Linux; elsewhere this is a no-op)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


class Collector:
    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
        self.stitcher = Stitcher(
            settings.stitch_capacity, scenarios_per_key=settings.scenarios_per_key
        )
        self.lineage = Lineage(settings.stitch_capacity, settings.lineage_tokens)
        self._db = concurrent.futures.ThreadPoolExecutor(
            1,
            thread_name_prefix="onjob-duckdb",
            initializer=_lower_priority,
            initargs=(settings.loader_nice,),
        )
        # Users' queries (`onjob sql`, `onjob export`) run on a cursor of their own in a
        # thread of their own: a slow one never holds up loading the spool.
        self._reader = concurrent.futures.ThreadPoolExecutor(
            1,
            thread_name_prefix="onjob-duckdb-read",
            initializer=_lower_priority,
            initargs=(settings.loader_nice,),
        )
        self._cursor: duckdb.DuckDBPyConnection | None = None
        self._store: Store | None = None
        self._spool: Spool | None = None
        self._task: asyncio.Task | None = None
        self._flushing = asyncio.Lock()
        self.spooled = 0  # exchanges handed over since start
        self.loaded = 0  # exchanges inserted since start

    async def start(self) -> None:
        """Open (and migrate) the database, load what a previous run left in the spool, warm up."""
        self._store = await self._run(
            Store, self.settings.db, self.settings.duckdb_threads, self.settings.duckdb_memory_limit
        )
        self._spool = Spool(
            self.settings.spool,
            fsync=self.settings.fsync,
            max_segment_bytes=self.settings.max_segment_bytes,
        )
        replayed = await self.flush()
        if replayed:
            log.warning("replayed %d exchanges from the spool of a previous run", replayed)
        rows = await self._run(lambda: self._store.warm_rows(self.settings.warm_exchanges))
        self.stitcher.warm(rows)
        self._task = asyncio.create_task(self._loop(), name="onjob-collector")

    def place(
        self,
        messages: list[dict],
        *,
        trajectory_id: str | None = None,
        scenario: str | None = None,
        api_key_id: str | None = None,
        after_turn: int | None = None,
    ) -> Placement:
        """Which trajectory, turn and scenario a request of `api_key_id` belongs to (never
        another key's); `after_turn`: a Responses API chain's (`Stitcher.place`)."""
        return self.stitcher.place(
            messages,
            trajectory_id=trajectory_id,
            scenario=scenario,
            api_key_id=api_key_id,
            after_turn=after_turn,
        )

    def log(self, record: Record) -> None:
        """Durably hand over one exchange or feedback (one append to the spool); never waits
        on DuckDB."""
        self._spool.append(encode(record))
        if isinstance(record, ExchangeRecord):
            self.spooled += 1

    async def flush(self) -> int:
        """Load every closed spool segment into DuckDB; return how many exchanges were new."""
        total = 0
        async with self._flushing:
            for segment in self._spool.rotate():
                total += await self._run(self._load_segment, segment)
        self.loaded += total
        return total

    def _load_segment(self, segment) -> int:
        if not segment.exists():
            # Loaded by a flush whose task was cancelled while this thread finished it (a
            # shutdown during a flush): the file is gone and its rows are in.
            return 0
        inserted, torn = self._store.load_segment(segment)
        if torn:
            log.warning("%s: skipped %d torn lines (a crash mid-write)", segment.name, torn)
        if self._store.orphaned:
            log.warning(
                "%s: dropped %d turns stored against deleted exchanges (cannot be rebuilt)",
                segment.name,
                self._store.orphaned,
            )
        segment.unlink()
        self._store.forget_segment(segment.name)
        return inserted

    async def forget(self, what: Forget, *, actor: str = "admin-api") -> Forgotten:
        """Delete `what` while serving: the spool is loaded first (so what is in it goes
        too), then the rows in one transaction on the database thread, then the
        stitcher's memory of those conversations. Lines spooled meanwhile are loaded
        later, through the rule `forget` records: none of the deleted comes back, nothing
        else is lost."""
        async with self._flushing:
            for segment in self._spool.rotate():
                self.loaded += await self._run(self._load_segment, segment)
            out = await self._run(lambda: forget(self._store, what, actor=actor))
        self.stitcher.forget(out.trajectory_ids)
        self.lineage.forget(out.trajectory_ids)
        if out.exchanges:
            log.warning("forgot %s: %d exchanges", out.what, out.exchanges)
        if out.trained_on:
            names = ", ".join(c["name"] for c in out.trained_on)
            log.warning("checkpoints already trained on what was forgotten: %s", names)
        return out

    async def apply_retention(self) -> Forgotten | None:
        """Delete conversations older than `retention_days` (None when it is not set)."""
        days = self.settings.retention_days
        if days is None:
            return None
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
        return await self.forget(Forget(before=cutoff), actor="retention")

    def stats(self) -> dict:
        """Counters for `/health`: `backlog` is what the spool holds that DuckDB does not yet."""
        return {
            "spooled": self.spooled,
            "loaded": self.loaded,
            "backlog_segments": len(self._spool.segments()) - 1 if self._spool else 0,
        }

    async def query(self, fn: Callable[[Store], T]) -> T:
        """Run `fn(store)` on the database thread."""
        return await self._run(fn, self._store)

    async def read(self, fn: Callable[[duckdb.DuckDBPyConnection], T], timeout_s: float) -> T:
        """Run `fn(cursor)` on the readers' thread; interrupted (DuckDB's own interrupt)
        past `timeout_s`, raising TimeoutError."""
        if self._cursor is None:
            self._cursor = await self._run(self._store.con.cursor)
        cursor = self._cursor
        job = asyncio.get_running_loop().run_in_executor(self._reader, self._store.read, fn, cursor)
        try:
            return await asyncio.wait_for(asyncio.shield(job), timeout_s)
        except TimeoutError:
            cursor.interrupt()
            with contextlib.suppress(Exception):
                await job
            raise

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    async def _loop(self) -> None:
        retained = -math.inf  # retention runs at start, then every retention_check_s
        while True:
            await asyncio.sleep(self.settings.flush_interval_s)
            try:
                await self.flush()
            except Exception:
                # The segments stay on disk and are retried next round: nothing is dropped.
                log.exception("loading the spool into DuckDB failed; will retry")
            if time.monotonic() - retained >= self.settings.retention_check_s:
                retained = time.monotonic()
                try:
                    await self.apply_retention()
                except Exception:
                    log.exception("applying collector.retention_days failed; will retry")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._spool:
            await self.flush()
            self._spool.close()
        self._reader.shutdown(wait=True)
        if self._cursor is not None:
            await self._run(self._cursor.close)
        if self._store:
            await self._run(self._store.close)
        self._db.shutdown(wait=True)
