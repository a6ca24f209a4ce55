"""`Loader`: the one process that owns the database loads the spool into it, placing each
line in its trajectory as it goes (`_place`, the one user of the stitcher, on the
database thread), and does what the database's owner does beside loading.

A load takes every closed segment that may load (`flush`): one that closed after another
writer's open segment opened, or after a live host's watermark (`handoff.py`), waits, so
a turn is never placed before the one it continues (`caught_up` waits for them). A batch
DuckDB refuses for its content goes a segment, then a line, at a time, each line refused
alone set aside with its reason (`_load_or_set_aside`); a refusal for want of disk or
memory leaves the segments for the next round. On a DuckLake, a turn whose previous turn
may be in another writer's load still is held back a while (`_learn_from_lake`).

With `collector.bucket`, one server loads by a lease in the bucket (`lease.py`) and the
others stand by, handing their traffic over until the lease ends, then take over with the
last copy of the loader's database (`_take_over`, `snapshots.py`). With a DuckLake every
server loads its own and one leads by a lease in the lake (`_keep_lake_lease`); a catalog
that does not answer is waited out with the spool holding every answer (`_load_round`).
The background loop (`_loop`) also copies the database for a standby, applies retention,
merges a lake's small files and exports (`_upkeep`); forgetting (`forget`) loads the spool
first so nothing deleted comes back. It runs its statements through the database handle
(`database.py`) and clears the spool writer's memory of conversations (`spooler.py`) when
conversations are deleted."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import duckdb

from ..bucket import Bucket, BucketError
from . import lake
from .database import Database
from .errors import CatalogUnreachable, NotLeading, StorageError
from .export import export_round
from .forget import Forget, Forgotten, forget, scrub
from .handoff import FORGOTTEN, HOSTS, Fetcher, Remote, Uploader
from .lease import LoaderLease, loader_id
from .lines import load_by_line, pieces_of, unreadable
from .settings import CollectorSettings
from .snapshots import Archive
from .spool import Segment, Spool, batches
from .spooler import FORGOTTEN_MARK, Rounds, Spooler
from .store import LAKE_RETRIES, Placed, Unplaced
from .trajectories import Keys, Stitcher

log = logging.getLogger("onjob.collector")

FAILED_HELD = 10_000  # failed exchanges whose place a retry on the live arm may take


def _transient(exc: BaseException) -> bool:
    """Whether a failed load may succeed as it is later (a full disk, memory, an interrupt,
    another writer's commit) rather than being refused for the segment's content."""
    if isinstance(exc, StorageError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return isinstance(
        exc,
        (
            OSError,
            duckdb.IOException,
            duckdb.OutOfMemoryException,
            duckdb.InterruptException,
            duckdb.FatalException,
            duckdb.TransactionException,
        ),
    )


class Loader:
    def __init__(
        self,
        settings: CollectorSettings,
        database: Database,
        spooler: Spooler,
        handing: Rounds,
        *,
        load: bool,
    ) -> None:
        self.settings = settings
        self.loads = load  # False: this process only writes the spool (nothing to load)
        self._db = database  # every statement runs through it, on its thread
        self._spooler = spooler  # whose memory of conversations a deletion clears
        self._handing = handing  # the bucket's rounds, one at a time
        self.stitcher = Stitcher(settings.stitch_capacity)
        self._failed: dict[str, tuple[str, int]] = {}  # recent failed exchanges' places
        self._spool: Spool | None = None  # the spool writer's, to load (`open`)
        self._fetcher: Fetcher | None = None  # the loader, with a bucket
        self._lease: LoaderLease | None = None  # its claim to be the one loader
        self._standby: Uploader | None = None  # its traffic's way while another loads
        self._loading: bool | None = None  # False while a standby; None: not known yet
        self._archive: Archive | None = None  # the database's way to a standby (`snapshots`)
        self._snapped = time.monotonic()  # the last copy of the database to the bucket
        self._retained = -math.inf  # retention runs at start, then every retention_check_s
        self._exported = self._compacted = time.monotonic()  # the export's, a lake's merge
        self._copying = asyncio.Lock()  # one copy at a time (the loop's, a deletion's)
        self._handed = -math.inf  # a standby's last hand-off round (monotonic)
        self.on_takeover: list[Callable[[], Awaitable[None]]] = []  # after a restore
        self._bucket: Bucket | None = None
        self._remote = Remote(None, (), 0)  # what the last fetch said
        self._task: asyncio.Task | None = None
        self._lease_tried = -math.inf  # a lake's writer: its last try to renew (monotonic)
        self._led = False  # ...whether it last said it leads (`_say_lead`)
        self._forgets_known: int | None = None  # a lake's writer: rows in `forgotten`
        # A lake's segments some of whose lines may be in already (by stem): those in the
        # spool at start, those a load held lines of or failed on (`Store.load`'s `again`).
        self._again: set[str] = set()
        self._flushing = asyncio.Lock()
        self.loaded = 0  # exchanges inserted since start

    def open(self, spool: Spool) -> None:
        """The spool to load: the spool writer's, opened at `Collector.start`."""
        self._spool = spool
        # What a run before left may be in a lake already (it stopped between a load's
        # commit and its segment's removal): loaded as such (`_again`).
        self._again = {path.name.split(".")[0] for path in spool.segments()}

    async def use(self, bucket: Bucket) -> None:
        """With `collector.bucket`: claim the loader's lease or stand by (`lease.py`),
        fetch other hosts' segments, copy the database for a standby (`snapshot_s`)."""
        self._bucket = bucket
        spool, lease_s = self.settings.spool, self.settings.host_lease_s
        holder = loader_id(spool, self.settings.host)
        self._fetcher = Fetcher(spool, bucket, lease_s, holder)
        self._lease = LoaderLease(bucket, holder, lease_s, self.settings.advertise_url)
        self._standby = Uploader(spool, bucket, self.settings.host, standby=holder, lease_s=lease_s)
        if self.settings.snapshot_s is not None:
            self._archive = Archive(spool, bucket, holder)
        await self._handing(self._lease.start)

    async def start(self) -> None:
        """Open (and migrate) the database, load what the spool holds (a previous run's
        included), warm the stitcher up, then load in the background (`_loop`)."""
        await self._db.open()
        self._led = self._db.store.in_lake and self._db.store.leading  # the banner says which
        if not self._db.store.exporting:  # queued by a run that exported: not wanted now
            await self._db.run(self._db.store.con.execute, "DELETE FROM export_queue")
        rows = await self._db.run(lambda: self._db.store.warm_rows(self.settings.warm_exchanges))
        self.stitcher.warm(rows)
        try:
            replayed = await self.flush()
        except BucketError as exc:  # serve anyway: the spool waits on disk, loads later
            log.error("cannot read collector.bucket (%s); loading waits for it", exc)
            replayed = 0
        if replayed:
            log.warning("replayed %d exchanges from the spool at start", replayed)
        self._task = asyncio.create_task(self._loop(), name="onjob-collector")

    @property
    def remote(self) -> Remote:
        """What the last fetch from the bucket said: the hosts live and dropped."""
        return self._remote

    async def flush(self) -> int:
        """Load every loadable spool segment into DuckDB; return how many exchanges were new.
        This process's own lines all are, unless another host's (with `collector.bucket`)
        may hold an earlier turn; another writer's wait up to `rotate_s` (`caught_up`)."""
        if not self.loads:
            return 0
        async with self._flushing:
            return await self._load_ready()

    async def _load_ready(self) -> int:
        """Close this process's segment and load what may be loaded (`_flushing` held)."""
        total = 0
        if self._fetcher is not None and not await self._leading():
            return 0
        self._spool.rotate()
        if self._fetcher is not None:
            # Raises before anything loads when the bucket cannot be read: retried.
            self._remote = await asyncio.to_thread(self._fetcher.fetch)
        loadable = self._spool.loadable(before=self._remote.before)
        for batch in batches(loadable, self.settings.max_segment_bytes):
            total += await self._load_or_set_aside(batch)
        self.loaded += total
        return total

    @property
    def standby(self) -> bool:
        """Whether another server leads: with a bucket, it holds the loader's lease
        (`lease.py`) and this one loads nothing, handing its traffic to the bucket until
        that lease ends; with a DuckLake, it holds the leader's lease (`lake.claim`) and
        runs retention, forgetting and the merge, while this one writes its own exchanges,
        serves and works lineages as any server does (`jobs.py`)."""
        if self._db.store is not None and self._db.store.in_lake:
            return not self._db.store.leading
        return self._lease is not None and not self._lease.held

    @property
    def _follows(self) -> bool:
        """A lake's writer while another server leads."""
        store = self._db.store
        return store is not None and store.in_lake and not store.leading

    def must_lead(self, what: str) -> None:
        """`NotLeading` when another server leads this DuckLake: retention and forgetting
        are the leader's, so that one server does each."""
        if self._follows and self._db.store.leader is None:
            raise NotLeading(
                f"{what} is the leading server's to do, and no server leads this DuckLake "
                "now: this one's lease lapsed while its catalog did not answer; try again "
                "once it does"
            )
        if self._follows:
            raise NotLeading(
                f"{what} is the leading server's to do: {self._db.store.leader} leads this "
                "DuckLake (retention and forgetting are its own); send it there"
            )

    async def _leading(self) -> bool:
        """Whether this server loads now. A standby hands its directory's segments to the
        bucket every `rotate_s`, as a proxy host does; on taking the lease it takes over
        (`_take_over`)."""
        if self.standby:
            self._loading = False
            self._remote = Remote(None, (), 0)
            if time.monotonic() - self._handed >= self.settings.rotate_s:
                self._handed = time.monotonic()
                self._spool.rotate()
                await self._handing(self._standby.upload)
            return False
        if not self._loading:
            await self._take_over()
            self._loading = True
        return True

    async def _take_over(self) -> None:
        """This server has just taken the loader's lease: its watermark goes, and when
        another loader held it last, that one's database copy (when newer than this one's)
        and the segments it loaded since come from the bucket (`snapshots.py`)."""
        await self._handing(self._bucket.delete, f"{HOSTS}{self.settings.host}.json")
        previous = self._lease.previous
        if self._archive is not None and previous not in (None, self._lease.holder):
            newest = await self._db.run(self._db.store.newest_exchange_ms)
            copy = await self._handing(self._archive.newest_of_another, newest)
            if copy is not None:
                target = self.settings.spool / ".restore.duckdb"
                await self._handing(self._bucket.get_file, copy.key, target)
                await self._db.run(self._swap_database, target)
                log.warning("restored the database from %s", copy.key)
            came = await self._handing(self._archive.fetch_archived)
            log.warning("fetched %d segments %s loaded since its last copy", came, previous)
            if self._task is not None:  # serving already: the routing and the loop follow
                for hook in self.on_takeover:
                    await hook()
        if self._loading is False or previous not in (None, self._lease.holder):
            log.warning("this server loads now (the loader's lease is its own)")

    def _swap_database(self, restored) -> None:
        """On the database thread: this server's database replaced by a restored copy."""
        self._db.replace(restored)
        self.stitcher = Stitcher(self.settings.stitch_capacity)
        self.stitcher.warm(self._db.store.warm_rows(self.settings.warm_exchanges))

    async def snapshot(self) -> None:
        """Copy the database to the bucket (`snapshots.py`), and let go of what it holds."""
        target = self.settings.spool / ".snapshot.duckdb"
        async with self._copying:
            held = await self._db.run(self._archive.copy, self._db.store, target)
            await self._handing(self._archive.upload)
            await self._handing(self._archive.publish, target, held)
            await self._db.run(lambda: [self._db.store.forget_segment(name) for name in held])
            self._snapped = time.monotonic()

    async def _load_or_set_aside(self, batch: list[Segment]) -> int:
        """Load a batch. When DuckDB refuses it for what it holds, not for want of disk or
        memory, its segments go one at a time, in order, and a segment refused alone goes
        line by line (`lines.load_by_line`): each line refused alone is set aside with its
        reason (`Spool.set_aside_line`) and the rest of its segment loads, so one bad line
        holds up nothing. (A refused attempt's placements are undone: `_load_placing`.)"""
        try:
            loaded = await self._db.run(self._load, batch)
        except Exception as exc:
            if _transient(exc):
                raise  # the segments stay, and are tried again next round
            if len(batch) > 1:
                loaded = 0
                for segment in batch:
                    loaded += await self._load_or_set_aside([segment])
                return loaded
            return await self._db.run(self._load_by_line, batch[0], exc)
        return loaded

    def _load_by_line(self, segment: Segment, exc: Exception) -> int:
        """A segment DuckDB refused: load what it can of it, set aside what it cannot. Every
        line either loads or is set aside, but a torn tail, which is skipped with a warning."""
        path = segment.path
        out = load_by_line(path, lambda piece: self._load_placing([piece]), _transient)
        reported = self._report_unreadable(path)
        refused = [line for line in out.refused if line.number not in reported]
        if refused and len(out.refused) == out.lines:
            where = self._spool.set_aside(segment, f"{type(exc).__name__}: {exc}")
            log.error(
                "spool segment %s cannot be loaded (%s); moved to %s with the reason beside "
                "it. Nothing else waits on it: move it back into the spool directory to load "
                "it again",
                segment.name,
                exc,
                where,
            )
        else:
            for line in refused:
                where = self._spool.set_aside_line(segment.name, line.number, line.text, line.why)
                log.error(
                    "line %d of spool segment %s cannot be loaded (%s); moved to %s with the "
                    "reason beside it, and the segment's other %d lines loaded",
                    line.number,
                    segment.name,
                    line.why,
                    where,
                    out.lines - len(refused),
                )
            if self._archive is not None:
                self._archive.keep(path)
            else:
                path.unlink()
        self._db.store.forget_pieces(pieces_of(path))
        self._db.store.forget_segment(path.name)
        return out.inserted

    def _report_unreadable(self, path) -> set[int]:
        """Lines that are no spool record (not JSON, or no `kind`): a torn tail is what a
        crash mid-write leaves, and is skipped with a warning; any other is corruption, said
        loudly and copied to `failed/`. Returns the numbers of the lines it reported."""
        bad, tail = unreadable(path)
        if tail:
            log.warning("%s: skipped its torn last line (a crash mid-write)", path.name)
        for line in bad[:-1] if tail else bad:
            where = self._spool.set_aside_line(
                path.name, line.number, line.text, f"corrupt: {line.why}"
            )
            log.error(
                "%s: line %d is torn or corrupt, not at the segment's end (a disk, a copy or "
                "a bug, not a crash mid-write); copied to %s",
                path.name,
                line.number,
                where,
            )
        return {line.number for line in bad}

    async def caught_up(self) -> int:
        """`flush`, and when other processes write the spool too, flush again once each has
        closed what it holds now: everything answered before the call is then loaded
        (other hosts': once each has uploaded, when it is live)."""
        total = await self.flush()
        if self.loads and (self._spool.others_writing() or self._remote.live):
            await asyncio.sleep(self.settings.rotate_s + self.settings.flush_interval_s)
            total += await self.flush()
        return total

    def _load(self, batch) -> int:
        paths = [s.path for s in batch if s.path.exists()]
        if not paths:
            # Loaded by a flush whose task was cancelled while this thread finished it (a
            # shutdown during a flush): the files are gone and their rows are in.
            return 0
        inserted = self._load_placing(paths)
        names = ", ".join(p.name for p in paths)
        if self._db.store.orphaned:
            log.warning(
                "%s: dropped %d turns stored against deleted exchanges (cannot be rebuilt)",
                names,
                self._db.store.orphaned,
            )
        if self._db.store.held:  # a lake's turns held back: their segments load again later
            return inserted
        for path in paths:
            if self._archive is not None:  # its ledger row stays until a copy holds it
                self._archive.keep(path)
            else:
                path.unlink()
                self._db.store.forget_segment(path.name)
        return inserted

    def _load_placing(self, paths: list[Path]) -> int:
        """`Store.load` placing its lines (`_place`). A load that fails leaves the stitcher
        and the failed exchanges' places as it found them: its lines are placed afresh
        when they load (on a retry, or one segment or line at a time), where placing them
        twice would make each continuation a fork of its own first placement."""
        stems = {p.name.split(".")[0] for p in paths}  # a segment's pieces share its stem
        for attempt in range(LAKE_RETRIES + 1):
            failed = dict(self._failed)
            try:
                with self.stitcher.staged():
                    loaded = self._db.store.load(
                        paths, self._place, again=bool(stems & self._again)
                    )
                if self._db.store.in_lake:
                    self._follow_forgets()
                    if self._db.store.held:  # loaded again later: what is in by then is dropped
                        self._again |= stems
                return loaded
            except StorageError as exc:
                self._failed = failed
                self._again |= stems  # committed or not, it cannot be known for sure
                if not (self._db.store.in_lake and lake.clashed(exc)) or attempt == LAKE_RETRIES:
                    raise
                # Another writer committed to the same rows first (DuckLake's commits are
                # optimistic): load again on what it wrote.
                time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
            except BaseException:
                self._failed = failed
                self._again |= stems
                raise
        raise AssertionError("unreachable")

    def _follow_forgets(self) -> None:
        """A lake's writer, after each load: when a forget (this server's or another's) has
        been recorded since the last load, the stitcher and the lineage start afresh (what
        they would continue may be gone; the stitcher asks the lake again, the lineage
        stores the next turns whole)."""
        n = self._db.store.forgotten_rows
        if n is not None and n != self._forgets_known:
            if self._forgets_known is not None:
                self._db.store.forgot()
                self.stitcher = Stitcher(self.settings.stitch_capacity)
                self._spooler.forgotten_elsewhere()  # the lineage: cleared on the event loop
            self._forgets_known = n

    def _place(self, lines: list[Unplaced]) -> list[Placed]:
        """Place spool lines (in the order their requests arrived) in their trajectories: on
        the database thread, the one user of the stitcher. On a lake, a turn that may
        continue another writer's uncommitted turn is held back (`_learn_from_lake`)."""
        held = self._learn_from_lake(lines) if self._db.store.in_lake else set()
        out = []
        for line in lines:
            if line.id in held:
                continue
            keys = Keys(
                line.stitch or [],
                line.prefix_hash or "",
                "",
                line.scenario_key,
                line.scenario_keyed,
            )
            trajectory_id, after_turn = line.trajectory_id, line.after_turn
            if line.retry_of in self._failed:  # live answering for a failed canary: its place
                trajectory_id, turn = self._failed.pop(line.retry_of)
                after_turn = turn - 1
            p = self.stitcher.place_keys(
                keys, trajectory_id=trajectory_id, api_key_id=line.api_key_id, after_turn=after_turn
            )
            if line.status is not None and line.status < 400:
                self.stitcher.register(p, line.continuation_hashes or [])
            else:  # a failed exchange is no turn: a retry takes its place
                self.stitcher.release(p)
                self._failed[line.id] = (p.trajectory_id, p.turn)
                while len(self._failed) > FAILED_HELD:
                    self._failed.pop(next(iter(self._failed)))
            out.append(Placed(line.id, p.trajectory_id, p.turn, p.scenario_id))
        return out

    def _learn_from_lake(self, lines: list[Unplaced]) -> set[str]:
        """Other writers' turns these lines may continue, into the stitcher before they are
        placed: the trajectories of any line whose latest reply this server's memory does
        not hold, and those named by the lines that it does not know (`Store.continuing`).
        A continuation this server placed itself is taken from its memory. Returns the
        lines to hold back: those whose latest reply the lake does not hold either, for
        `collector.stitch_wait_s` after they arrived (their previous turn may be in another
        writer's load still; later turns of theirs then wait with them, as theirs is not
        placed)."""

        def unsure(line: Unplaced, replied: set[tuple]) -> bool:
            """Its latest reply is neither in the stitcher nor an earlier line's of this
            load (a chain's turn is placed by its `after_turn`)."""
            return bool(
                line.after_turn is None
                and line.stitch
                and (line.api_key_id, line.stitch[0]) not in replied
                and not self.stitcher.continues(line.api_key_id, line.stitch)
            )

        def walk(hold: bool) -> tuple[list[Unplaced], set[str]]:
            """The lines in arrival order: those unsure, and of them those held back (a
            held line's replies are none this load gives)."""
            replied: set[tuple] = set()
            unsure_lines, held = [], set()
            for line in lines:
                if unsure(line, replied):
                    unsure_lines.append(line)
                    if hold and line.ts > young:
                        held.add(line.id)
                        continue
                if line.status is not None and line.status < 400:
                    replied.update((line.api_key_id, h) for h in line.continuation_hashes or ())
            return unsure_lines, held

        young = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=self.settings.stitch_wait_s)
        named = [
            line.trajectory_id
            for line in lines
            if line.trajectory_id is not None
            and not self.stitcher.knows(line.trajectory_id, line.after_turn)
        ]
        hashes = [h for line in walk(hold=False)[0] for h in line.stitch]
        if not (hashes or named):
            return set()
        self.stitcher.warm(self._db.store.continuing(hashes, named))
        return walk(hold=True)[1]

    async def forget(self, what: Forget, *, actor: str = "admin-api") -> Forgotten:
        """Delete `what` while serving: the spool is loaded first (so what is in it goes
        too), then the rows in one transaction on the database thread, then the
        stitcher's memory of those conversations. Lines spooled meanwhile are loaded
        later, through the rule `forget` records: none of the deleted comes back, nothing
        else is lost."""
        self.must_lead("forgetting")
        await self.caught_up()
        async with self._flushing:
            await self._load_ready()  # what came in meanwhile, in the same hold of the lock
            out = await self._db.run(lambda: forget(self._db.store, what, actor=actor))
            await self._db.run(scrub, self.settings.spool, what, out)
            if self._archive is not None and not self.standby:
                # A copy now, with the deletion and its rule in it: the segments archived
                # before it, which hold what was deleted, go from the bucket.
                await self.snapshot()
        self.stitcher.forget(out.trajectory_ids)
        # A later turn must not be stored against a deleted exchange: this process's memory
        # of conversations goes, and proxy-only processes' when they see the mark change.
        self._spooler.lineage.clear()
        (self.settings.spool / FORGOTTEN_MARK).write_text(out.what)
        if self._bucket is not None:  # and other hosts' (`handoff.py`)
            await asyncio.to_thread(
                self._bucket.put_bytes,
                FORGOTTEN,
                f"{out.what}\n{time.time_ns()}\n".encode(),  # a new etag each time
                overwrite=True,
            )
        if out.exchanges:
            log.warning("forgot %s: %d exchanges", out.what, out.exchanges)
        if out.trained_on:
            names = ", ".join(c.name for c in out.trained_on)
            log.warning("checkpoints already trained on what was forgotten: %s", names)
        return out

    async def apply_retention(self) -> Forgotten | None:
        """Delete conversations older than `retention_days` (None when it is not set)."""
        days = self.settings.retention_days
        if days is None:
            return None
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
        return await self.forget(Forget(before=cutoff), actor="retention")

    def state(self) -> str | None:
        """Who loads, for `/health` and `onjob status` (None with one file and no bucket,
        or in a proxy-only process)."""
        if self._db.store is not None and self._db.store.in_lake:
            if (age := self._db.outage.age_s) is not None:
                return (
                    f"the DuckLake's catalog has not answered for {age:.0f} s: answers wait "
                    "in this server's spool"
                )
            if self._db.store.leading:
                return "this server leads the DuckLake (every server writes its own)"
            return f"this server writes the DuckLake; {self._db.store.leader or 'no server'} leads"
        if self._lease is None:
            return None
        if self._lease.held:
            return f"this server (lease token {self._lease.body.token})"
        other = self._lease.other
        return f"standby: {other.holder} loads" if other else "standby: the bucket is unread"

    async def export(self) -> int:
        """One round of the Parquet export (`export.py`); the rows it wrote."""
        if not self.loads or self.settings.export_s is None:
            return 0
        scratch = self.settings.spool / "export"
        return await self._db.run(export_round, self._db.store, self._bucket, scratch)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.flush_interval_s)
            self._spooler.check_room()
            if await self._load_round():
                await self._upkeep()

    async def _load_round(self) -> bool:
        """Load the spool and keep a lake's lease; False while a lake's catalog does not
        answer (`outage.py`: tried again after a wait, said once each way)."""
        try:
            if self._db.outage.since is not None:
                if not self._db.outage.due():
                    return False
                await self._keep_lake_lease(now=True)  # the lead first, then the loads
                self._db.outage.answered()
            try:
                await self.flush()
            except CatalogUnreachable:
                raise
            except Exception:
                # The segments stay on disk and are retried next round: nothing is dropped.
                log.exception("loading the spool into DuckDB failed; will retry")
            await self._keep_lake_lease()
        except CatalogUnreachable as exc:  # the spool keeps every answer meanwhile
            self._db.outage.failed(exc, self._spool.bytes_held())
            self._say_lead()
            return False
        return True

    async def _upkeep(self) -> None:
        """What the loader does beside loading, each at its own pace: the bucket's copies
        for a standby, retention and a lake's compaction (the leader's), the export."""
        now = time.monotonic()
        if self._archive is not None and not self.standby:
            try:
                await self._handing(self._archive.upload)
                if now - self._snapped >= self.settings.snapshot_s:
                    await self.snapshot()
            except Exception:  # kept on this disk: the next round tries again
                log.exception("copying to the bucket for a standby failed; will retry")
                self._snapped = time.monotonic()
        if now - self._retained >= self.settings.retention_check_s and not self._follows:
            self._retained = now
            try:
                await self.apply_retention()
            except CatalogUnreachable as exc:  # said once, as the loads say it
                self._db.outage.failed(exc, self._spool.bytes_held())
            except Exception:
                log.exception("applying collector.retention_days failed; will retry")
        lake_leader = self._db.store.in_lake and not self._follows
        if lake_leader and now - self._compacted >= self.settings.compact_s:
            self._compacted = now
            try:
                merged = await self._db.run(self._db.store.compact)
                log.info("compacted the DuckLake: %d small data files merged", merged)
            except CatalogUnreachable as exc:
                self._db.outage.failed(exc, self._spool.bytes_held())
            except Exception:  # the files stay as they are: the next round merges them
                log.exception("compacting the DuckLake failed; will retry")
        if self.settings.export_s and now - self._exported >= self.settings.export_s:
            self._exported = now
            try:
                await self.export()
            except Exception:  # the rows stay queued: the next round writes them
                log.exception("exporting exchanges to the bucket failed; will retry")

    async def _keep_lake_lease(self, *, now: bool = False) -> None:
        """A lake's writer claims or renews the leader's lease a third of the lease apart
        (`now`: at once), and says when it starts or stops leading. A catalog that does
        not answer raises `CatalogUnreachable`."""
        store = self._db.store
        if store is None or not store.in_lake:
            return
        if not now and time.monotonic() - max(store.claimed, self._lease_tried) < store.lease_s / 3:
            return
        self._lease_tried = time.monotonic()
        try:
            await self._db.run(store.keep_lease)
        except CatalogUnreachable:
            raise
        except Exception as exc:
            log.error("could not claim or renew the DuckLake's leader lease: %s", exc)
            return
        self._say_lead()

    def _say_lead(self) -> None:
        """Say when this lake's writer starts or stops leading (its lease claimed, another's
        seen, or its own past trusting while the catalog does not answer)."""
        store = self._db.store
        if store is None or not store.in_lake or store.leading == self._led:
            return
        self._led = store.leading
        if store.leading:
            log.warning("this server leads now (the DuckLake's leader lease is its own)")
        elif store.leader is not None:
            log.warning("%s leads now: this server writes and serves", store.leader)
        else:
            log.warning(
                "this server no longer leads: its leader lease could not be renewed; it "
                "claims the lease again once the catalog answers"
            )

    async def stop(self) -> None:
        """End the background loop (`Collector.close`, first)."""
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def retire(self) -> None:
        """At a clean stop, after the last load: a copy of the database for a standby, the
        spool not loaded to the bucket, the loader's lease given back."""
        if self._archive is not None and not self.standby:
            try:  # a standby taking over later loses nothing of a clean stop
                await self.snapshot()
            except Exception:
                log.exception("copying the database at exit failed; the archive stands")
        if self._lease is not None:  # a standby takes over at once
            try:  # what is not loaded (held back, or a standby's) goes to the bucket
                await self._handing(self._standby.retire)
            except Exception:
                log.exception("uploading the spool at exit failed; the next start does")
            await self._handing(self._lease.release)

    def close(self) -> None:
        """Once the bucket's rounds have ended: the fetcher's lock goes."""
        if self._fetcher is not None:
            self._fetcher.close()
