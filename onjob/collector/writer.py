"""`Collector`: the proxy's one handle on logging, and the loop that loads the spool into DuckDB."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

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
        self.stitcher = Stitcher(settings.stitch_capacity)
        self._db = concurrent.futures.ThreadPoolExecutor(
            1,
            thread_name_prefix="onjob-duckdb",
            initializer=_lower_priority,
            initargs=(settings.loader_nice,),
        )
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
        after_turn: int | None = None,
    ) -> Placement:
        return self.stitcher.place(
            messages, trajectory_id=trajectory_id, scenario=scenario, after_turn=after_turn
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
        segment.unlink()
        self._store.forget_segment(segment.name)
        return inserted

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

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.flush_interval_s)
            try:
                await self.flush()
            except Exception:
                # The segments stay on disk and are retried next round: nothing is dropped.
                log.exception("loading the spool into DuckDB failed; will retry")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._spool:
            await self.flush()
            self._spool.close()
        if self._store:
            await self._run(self._store.close)
        self._db.shutdown(wait=True)
