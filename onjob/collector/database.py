"""`Database`: the collector's handle on DuckDB, the one other packages use
(`await collector.query(lambda store: ...)`, typed: `fn(Store) -> T`).

Every statement runs on the one database thread (`run`): the loads, the deletions, the
jobs' leases and every other package's queries take turns there, in the order asked, on
the one connection, so none sees another's half-done work. Users' queries (`onjob sql`,
`onjob export`: `read`) run on a cursor of their own on a thread of their own, so a slow
one never holds up loading the spool, and are interrupted past their time. Both threads
run at a lower priority than the proxy (`_lower_priority`). A lake's catalog that does
not answer is raised as `CatalogUnreachable` here, for every caller, and the transaction
the failed statement may have left open is ended before the next one runs; an answer
from the catalog ends the outage (`outage.py`) for the loader too. The store is replaced
when a standby takes over with a restored copy (`replace`): read it through `store`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import duckdb

from .outage import Outage, translated
from .settings import CollectorSettings
from .store import Store

T = TypeVar("T")


def _lower_priority(nice: int) -> None:
    """Loading into DuckDB yields the CPU to the proxy: the database thread (and the worker
    threads DuckDB starts from it, which inherit it) runs at a lower priority, so a flush
    rarely makes an answer wait (Linux; elsewhere this is a no-op)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


class Database:
    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
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
        self.outage = Outage()  # a lake's catalog that does not answer
        self._abandoned = False  # a statement failed so: its transaction to end (`run`)

    async def open(self) -> Store:
        """Open (and migrate) the database, on the database thread."""
        self._store = await self.run(self._open_store)
        return self._store

    def _open_store(self) -> Store:
        s = self.settings
        store = Store.open(s, tuned=True, follow=True)
        store.exporting = s.export_s is not None
        return store

    @property
    def store(self) -> Store | None:
        """The open store (None before `open`); used on the database thread only."""
        return self._store

    @property
    def in_lake(self) -> bool:
        """Whether the log is a DuckLake (`collector.catalog`), which many servers share."""
        return self.settings.catalog is not None

    def replace(self, restored) -> None:
        """On the database thread: this server's database replaced by a restored copy."""
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None
        self._store.close()
        db = self.settings.db
        os.replace(restored, db)
        db.with_name(db.name + ".wal").unlink(missing_ok=True)
        self._store = self._open_store()

    async def query(self, fn: Callable[[Store], T]) -> T:
        """Run `fn(store)` on the database thread."""
        return await self.run(fn, self._store)

    async def read(self, fn: Callable[[duckdb.DuckDBPyConnection], T], timeout_s: float) -> T:
        """Run `fn(cursor)` on the readers' thread; interrupted (DuckDB's own interrupt)
        past `timeout_s`, raising TimeoutError."""
        if self._cursor is None:
            self._cursor = await self.run(self._store.cursor)
        cursor = self._cursor
        job = asyncio.get_running_loop().run_in_executor(self._reader, self._store.read, fn, cursor)
        try:
            return await asyncio.wait_for(asyncio.shield(job), timeout_s)
        except TimeoutError:
            cursor.interrupt()
            with contextlib.suppress(Exception):
                await job
            raise
        except Exception as exc:
            if (unreachable := translated(exc)) is None or unreachable is exc:
                raise
            raise unreachable from exc

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the database thread; a lake's catalog that does not answer raised
        as `CatalogUnreachable` (translated here, for every caller)."""
        loop = asyncio.get_running_loop()
        try:
            if self._abandoned:
                await loop.run_in_executor(self._db, self._store.abandon)
                self._abandoned = False
            done = await loop.run_in_executor(self._db, fn, *args)
        except Exception as exc:
            if (unreachable := translated(exc)) is None:
                raise
            # The failed statement may have left its transaction open (its ROLLBACK could
            # not reach the catalog either): ended before the next one runs.
            self._abandoned = True
            if unreachable is exc:
                raise
            raise unreachable from exc
        self.outage.answered()  # whoever asked: the loader goes on at once
        return done

    async def claim_job(self, name: str) -> str | None:
        """Take or renew this process's lease on lineage `name`'s work (`jobs.py`): None
        when it holds it now, else who does (a file's one writer always holds it)."""
        return await self.run(self._store.claim_job, name, self.settings.job_lease_s)

    async def release_job(self, name: str) -> None:
        """Give lineage `name`'s lease back at the end of a job."""
        await self.run(self._store.release_job, name)

    async def close(self) -> None:
        """The readers' thread, then the cursor and the store, then the database thread
        (`Collector.close`, last)."""
        self._reader.shutdown(wait=True)
        if self._cursor is not None:
            await self.run(self._cursor.close)
        if self._store:
            await self.run(self._store.close)
        self._db.shutdown(wait=True)
