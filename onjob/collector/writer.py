"""`Collector`: the proxy's one handle on logging, and the loop that loads the spool into
DuckDB, placing each line in its trajectory as it goes.

In a proxy-only process (`onjob serve --role proxy`, and the extra workers of `onjob serve
--workers N`) the collector only writes the spool (`load=False`): the one server that
loads it owns the database and the stitcher. With `collector.bucket` set, each host's
spool reaches the loader through object storage (`handoff.py`): a proxy-only process
uploads its host's closed segments, the loader fetches them before each load.

`Collector` is the façade of three rooms, each holding its own state, which it builds,
starts and closes in order: the spool writer (`spooler.py`, every process's), the
database handle (`database.py`, whose two threads run every statement; other packages
reach it as `collector.query` or, typed, `collector.database`) and the loader
(`loader.py`, the database owner's). The rooms get what they share from here, at
construction or at `start`, not from each other's insides; the public surface (what the
proxy, the deploy loop, the CLI, the tests and the benches call) is this class's."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import duckdb
import msgspec

from ..bucket import Bucket
from .database import Database
from .forget import Forget, Forgotten
from .linear import Lineage
from .loader import Loader
from .outage import Outage
from .records import Record
from .settings import CollectorSettings
from .spool import Spool
from .spooler import Rounds, Spooler
from .store import Store
from .trajectories import Stitcher

log = logging.getLogger("onjob.collector")
T = TypeVar("T")


class CollectorStats(msgspec.Struct, kw_only=True):
    """The collector's counters since start, in `/health` and `GET /admin/status`. Every
    field has a default: a client reads another version's server, which may send fewer."""

    spooled: int = 0  # exchanges handed over
    loaded: int = 0  # exchanges inserted into DuckDB
    backlog_segments: int = 0  # what the spool holds that DuckDB does not yet
    backlog_bytes: int = 0  # ...their size on disk
    failed_segments: int = 0  # set aside in failed/ (`_load_or_set_aside`)
    untrainable: dict[str, int] = {}  # of those spooled, kept from training, by reason
    forgets_seen: int = 0  # a proxy-only process: deletions that cleared its memory
    unlogged: int = 0  # answered while the spool directory was full
    hosts_live: list[str] = []  # the loader: hosts whose watermark counts
    hosts_dropped: list[str] = []  # and those past their lease
    loader: str | None = None  # who loads (`_loader_state`)
    lake: bool = False  # the log is a DuckLake (`collector.catalog`): every server loads
    catalog_unreachable_s: float | None = None  # a lake's catalog has not answered this long


class Collector:
    def __init__(self, settings: CollectorSettings, *, load: bool = True) -> None:
        self.settings = settings
        self.loads = load  # False: this process only writes the spool
        # The bucket's rounds, one at a time, the spool writer's and the loader's alike.
        self._handing = Rounds()
        self._writer = Spooler(settings, self._handing)
        self._database = Database(settings)
        self._loader = Loader(settings, self._database, self._writer, self._handing, load=load)
        self._bucket: Bucket | None = None

    async def start(self) -> None:
        """Open (and migrate) the database, load what the spool holds (a previous run's
        included), warm the stitcher up. A proxy-only collector just opens its spool."""
        self._loader.open(self._writer.open())
        if self.settings.bucket:
            bucket = Bucket.from_url(
                self.settings.bucket,
                endpoint_url=self.settings.bucket_endpoint_url,
                region=self.settings.bucket_region,
            )
            self._bucket = bucket
            if self.loads:
                await self._loader.use(bucket)
            else:
                self._writer.hand_to(bucket)
        if not self.loads:
            self._writer.start()
            return
        await self._loader.start()

    @property
    def database(self) -> Database:
        """The database handle (`database.py`): `query`, `read`, the jobs' leases."""
        return self._database

    # -- the spool writer (`spooler.py`) -------------------------------------------------

    def log(self, record: Record) -> None:
        """Durably hand over one exchange or feedback (`Spooler.log`); never waits on
        DuckDB."""
        self._writer.log(record)

    @property
    def lineage(self) -> Lineage:
        """What this process's next turns are stored against (`Spooler.lineage`)."""
        return self._writer.lineage

    @property
    def spool(self) -> Spool | None:
        """The spool this collector appends to (None before `start`): its `segments()` and
        `max_segment_bytes`, for tools that measure loading (bench/collector/)."""
        return self._writer.spool

    @property
    def loader_url(self) -> str | None:
        """A proxy host: where the server that loads answers, as its lease in the bucket
        says (None: not said)."""
        return self._writer.loader_url

    @property
    def spooled(self) -> int:
        """Exchanges handed over since start."""
        return self._writer.spooled

    @property
    def untrainable(self) -> dict[str, int]:
        """Of those spooled, kept from training, by reason."""
        return self._writer.untrainable

    @property
    def unlogged(self) -> int:
        """Exchanges and feedback answered but not logged (the spool directory full)."""
        return self._writer.unlogged

    @property
    def forgets_seen(self) -> int:
        """Deletions that cleared this process's memory of conversations."""
        return self._writer.forgets_seen

    # -- the database handle (`database.py`) ---------------------------------------------

    async def query(self, fn: Callable[[Store], T]) -> T:
        """Run `fn(store)` on the database thread."""
        return await self._database.query(fn)

    async def read(self, fn: Callable[[duckdb.DuckDBPyConnection], T], timeout_s: float) -> T:
        """Run `fn(cursor)` on the readers' thread; interrupted (DuckDB's own interrupt)
        past `timeout_s`, raising TimeoutError."""
        return await self._database.read(fn, timeout_s)

    async def claim_job(self, name: str) -> str | None:
        """Take or renew this process's lease on lineage `name`'s work (`jobs.py`): None
        when it holds it now, else who does (a file's one writer always holds it)."""
        return await self._database.claim_job(name)

    async def release_job(self, name: str) -> None:
        """Give lineage `name`'s lease back at the end of a job."""
        await self._database.release_job(name)

    @property
    def in_lake(self) -> bool:
        """Whether the log is a DuckLake (`collector.catalog`), which many servers share."""
        return self._database.in_lake

    @property
    def outage(self) -> Outage:
        """A lake's catalog that does not answer (`outage.py`)."""
        return self._database.outage

    # -- the loader (`loader.py`) --------------------------------------------------------

    async def flush(self) -> int:
        """Load every loadable spool segment into DuckDB; return how many exchanges were
        new (`Loader.flush`)."""
        return await self._loader.flush()

    async def caught_up(self) -> int:
        """`flush`, and again once every other writer has closed what it holds now
        (`Loader.caught_up`): everything answered before the call is then loaded."""
        return await self._loader.caught_up()

    async def forget(self, what: Forget, *, actor: str = "admin-api") -> Forgotten:
        """Delete `what` while serving (`Loader.forget`)."""
        return await self._loader.forget(what, actor=actor)

    async def apply_retention(self) -> Forgotten | None:
        """Delete conversations older than `retention_days` (None when it is not set)."""
        return await self._loader.apply_retention()

    def must_lead(self, what: str) -> None:
        """`NotLeading` when another server leads this DuckLake (`Loader.must_lead`)."""
        self._loader.must_lead(what)

    async def snapshot(self) -> None:
        """Copy the database to the bucket (`snapshots.py`), and let go of what it holds."""
        await self._loader.snapshot()

    async def export(self) -> int:
        """One round of the Parquet export (`export.py`); the rows it wrote."""
        return await self._loader.export()

    @property
    def standby(self) -> bool:
        """Whether another server leads (`Loader.standby`)."""
        return self._loader.standby

    @property
    def stitcher(self) -> Stitcher:
        """The loader's stitcher (replaced after a forget on a lake, or a restore)."""
        return self._loader.stitcher

    @property
    def on_takeover(self) -> list[Callable[[], Awaitable[None]]]:
        """Run after this server takes the loader's lease with a restored database."""
        return self._loader.on_takeover

    @property
    def loaded(self) -> int:
        """Exchanges inserted since start."""
        return self._loader.loaded

    def stats(self) -> CollectorStats:
        """Counters for `/health` and `GET /admin/status`."""
        spool, store, remote = self.spool, self._database.store, self._loader.remote
        return CollectorStats(
            spooled=self.spooled,
            loaded=self.loaded,
            backlog_segments=len(spool.segments()) if spool else 0,
            backlog_bytes=spool.bytes_held() if spool else 0,
            failed_segments=spool.set_aside_count() if spool else 0,
            untrainable=dict(self.untrainable),
            forgets_seen=self.forgets_seen,
            unlogged=self.unlogged,
            hosts_live=list(remote.live),
            hosts_dropped=list(remote.dropped),
            loader=self._loader.state(),
            lake=store is not None and store.in_lake,
            catalog_unreachable_s=self.outage.age_s,
        )

    async def close(self) -> None:
        """Stop the background task; load and export what the spool holds; hand what is
        left to the bucket, with a last copy and the loader's lease; close the database."""
        await self._writer.stop()
        await self._loader.stop()
        if spool := self.spool:
            try:
                await self.flush()
                await self.export()
            except Exception:
                log.exception("loading the spool at exit failed; the next start loads it")
            spool.close()
        await self._writer.retire()
        await self._loader.retire()
        self._handing.shutdown()
        self._loader.close()
        await self._database.close()
