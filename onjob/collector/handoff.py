"""The hand-off through object storage: proxies on many hosts, one loader, no shared disk.

Each host keeps its own spool directory (`spool.py`; its locks are reliable on a local
disk) and one `Uploader` per host moves its closed segments into the bucket as immutable
objects, then publishes the host's watermark; the one loader's `Fetcher` moves them into
its own spool directory, where they load like any other closed segment:

    segments/<segment name>     a closed segment, uploaded create-only, fetched once
    fetched/<segment name>      a tombstone naming the loader that has it (uploads skip
                                it); deleted by the loader after `TOMBSTONE_S`
    hosts/<host id>.json        the host's watermark (`Watermark`), rewritten each round
    loader.lease                which server loads (`lease.py`)
    forgotten.mark              rewritten by the loader at each deletion (`onjob forget`)
    routing.json                the primary's routing, mirrored to every host's spool

A host's watermark, `holds_from`, is the earliest opening (ms) of any segment of that
host not yet in the bucket: its writers' open segments, a closed one whose upload
failed, or the time its round began when there is none (minus `SLACK_MS`, for a writer
that named its segment just before the round looked). It is written after the round's
uploads, and the loader reads every watermark before listing `segments/`, so any segment
the loader cannot see yet opened at or after its host's watermark. The loader then holds
back a segment that closed after the lowest live watermark (`Spool.loadable(before=)`),
exactly as it holds back a segment that closed after a local writer's open segment
opened: a conversation alternating between hosts is stitched in order.

Clocks: a watermark's age is read on the bucket's clock (its `LastModified` against the
bucket's `Date`: `ObjectInfo.age_s`), and its `holds_from` is put on the bucket's clock
with the host's own measure of its offset (`Clock`), then on the loader's, at the
earliest either measure allows. Segment names stay on their host's clock: a host far off
is said in the log.

A host whose watermark is older than `collector.host_lease_s` is taken for dead and holds
nothing back (else one dead host would stop all loading). What it answered is in its
spool directory; the segment it had open is claimed, closed and uploaded when it starts
again (same spool directory), and loads then: nothing is lost, but a conversation that
went on on another host meanwhile may have its later turns placed without the earlier
(a new trajectory). A host that stops cleanly uploads everything and deletes its
watermark.

A host stores a turn against the previous one it remembers (`linear.py`); once that one
is deleted, such a turn could not be rebuilt and is dropped at load. So each round also
reads `forgotten.mark`, and when it changes the host's collector forgets its memory of
conversations, as processes sharing a spool directory do with the file of that name.
Likewise the primary's routing (`routing.json`, which `proxy/replicas.py` writes in the
primary's spool directory and follows in a proxy's) is uploaded when it changes and
downloaded into each host's spool directory: a canary, a promotion or a rollback reaches
every host within a round or two.

Exactly once: the loader downloads a segment, writes its tombstone (create-only, naming
the loader: one whose tombstone names another loader is that one's, and is left to it),
deletes the object, and only then loads; a round that cannot finish that raises before
anything loads, and the next round finds the local copy and finishes it. An upload
interrupted after its PUT (a crash before the local file is deleted) is skipped on
restart if the tombstone is there; were the object fetched between that check and the
PUT, its lines are refused as already loaded and set aside (`lines.py`), never stored
twice.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ..bucket import Bucket, BucketError, ObjectExists, ObjectMissing
from .lease import read_lease
from .spool import CLOSED, OPEN, _claim, _closed, _locked, _ms, _opened

log = logging.getLogger("onjob.collector")

SEGMENTS, FETCHED, HOSTS = "segments/", "fetched/", "hosts/"
FORGOTTEN = "forgotten.mark"
MIRRORED = ("routing.json",)  # the primary's files its proxies read in their spool directory
SLACK_MS = 200  # a writer names its segment (the clock) before it creates the file
UPLOAD_LOCK = "upload.lock"  # one uploader per host among its processes
# Held by a live loader in its own spool directory: the proxy-only processes sharing that
# directory (`onjob serve --workers`) leave their segments to it rather than upload them.
LOADER_LOCK = "loader.lock"
# A segment's name as `spool.py` makes it: only such keys are fetched into the spool.
SEGMENT_NAME = re.compile(r"\d{13}-\d{13}-[0-9A-Za-z_]+-\d{6}\.jsonl")
HOST_ID = re.compile(r"[0-9A-Za-z_.-]{1,64}")
# A tombstone outlives any upload retried after a crash but a host down for days; that
# one's lines are refused as loaded already (`lines.py`), never stored twice.
TOMBSTONE_S = 86_400
PRUNE_EVERY_S = 3_600
SKEWED_MS = 1_000  # a host whose clock is further off the bucket's is said in the log


class Watermark(msgspec.Struct, frozen=True):
    """A host's promise: every segment of it not yet in the bucket opened at or after
    `holds_from` (ms, the host's clock); written at `at` (ms). `offset` is the bucket's
    clock minus the host's (ms), as the host measured it, give or take `error`."""

    host: str
    holds_from: int
    at: int
    offset: int = 0
    error: int = 0

    @property
    def earliest(self) -> int:
        """`holds_from` on the bucket's clock, at the earliest it can be."""
        return self.holds_from + self.offset - self.error


@dataclass(frozen=True)
class Remote:
    """What the bucket said in one fetch round: the lowest live watermark on the loader's
    clock (None: no live host), the live hosts, how many segments came in, and the hosts
    whose watermark is past its lease (taken for dead)."""

    before: int | None
    live: tuple[str, ...]
    fetched: int
    dropped: tuple[str, ...] = ()


class Clock:
    """This host's offset to the bucket's clock. One request's `Date` (whole seconds)
    bounds it within a second and a round trip (`Bucket.clock_bounds_ms`); the
    intersection of the last `keep` bounds is about a round trip wide. Bounds that no
    longer meet (the host's clock was stepped) start it again."""

    def __init__(self, keep: int = 60) -> None:
        self._bounds: collections.deque[tuple[float, float]] = collections.deque(maxlen=keep)

    def measure(self, bucket: Bucket) -> None:
        low, high = bucket.clock_bounds_ms()
        if math.isinf(low):
            return  # a store that states no time
        self._bounds.append((low, high))
        if self._low > self._high:
            self._bounds.clear()
            self._bounds.append((low, high))

    @property
    def _low(self) -> float:
        return max(b[0] for b in self._bounds)

    @property
    def _high(self) -> float:
        return min(b[1] for b in self._bounds)

    @property
    def offset(self) -> int:
        """The bucket's clock minus this host's, in ms (0 before any measure)."""
        return round((self._low + self._high) / 2) if self._bounds else 0

    @property
    def error(self) -> int:
        """How far `offset` may be off, in ms."""
        return math.ceil((self._high - self._low) / 2) if self._bounds else 0


class Uploader:
    """Moves one host's closed spool segments into the bucket and keeps its watermark."""

    def __init__(
        self,
        directory: Path,
        bucket: Bucket,
        host: str,
        *,
        standby: str | None = None,
        lease_s: float = 30.0,
    ) -> None:
        if not HOST_ID.fullmatch(host):
            raise BucketError(f"collector.host_id must match {HOST_ID.pattern}: {host!r}")
        self.directory = Path(directory)
        self.bucket = bucket
        self.host = host
        # A loader waiting for the loader's lease (`lease.py`), by its name: it uploads its
        # directory's segments itself, though it holds the directory's loader lock, and
        # hands back those it fetched when it loaded and had not loaded yet.
        self.standby = standby
        self.clock = Clock()
        self.loader_url: str | None = None  # where the loader answers, as its lease says
        self.refresh_s = lease_s / 3  # the watermark rewritten this often in a long round
        self.forgotten: object = None  # the loader's last deletion (its mark's etag)
        self._mirrored: dict[str, str] = {}  # etags of what was downloaded

    def upload(self) -> Watermark | None:
        """One round: claim dead writers' segments, upload every closed one, publish the
        watermark. None when another process of this host holds the round, or a loader
        loads this directory itself."""
        if not self.standby and _locked(self.directory / LOADER_LOCK):
            return None
        with _exclusive(self.directory / UPLOAD_LOCK) as mine:
            if not mine:
                return None
            self.clock.measure(self.bucket)
            start = _ms() - SLACK_MS
            held = [start]
            for path in self.directory.glob(f"*{OPEN}"):
                if not _claim(path):  # a live writer's: not in the bucket yet
                    held.append(_opened(path))
            backlog = sorted(self.directory.glob(f"*{CLOSED}"))
            written = time.monotonic()
            for i, path in enumerate(backlog):
                try:
                    self._upload(path)
                except BucketError:
                    log.exception("uploading spool segment %s failed; will retry", path.name)
                    held.append(_closed(path).opened)
                if time.monotonic() - written > self.refresh_s and i + 1 < len(backlog):
                    # A long backlog (catching up after an outage): the watermark is kept
                    # fresh, promising no more than the segments still to go, so the host
                    # stays live and its conversations stay whole.
                    rest = [_closed(p).opened for p in backlog[i + 1 :]]
                    self._mark(min(held + rest))
                    written = time.monotonic()
            mark = self._mark(min(held))
            info = self.bucket.stat(FORGOTTEN)
            self.forgotten = info and info.etag
            lease = read_lease(self.bucket)
            if lease is not None and lease.holder and lease.url:
                self.loader_url = lease.url
            for name in MIRRORED:
                info = self.bucket.stat(name)
                if info is not None and self._mirrored.get(name) != info.etag:
                    self.bucket.get_file(name, self.directory / name)
                    self._mirrored[name] = info.etag
            return mark

    def _mark(self, holds_from: int) -> Watermark:
        mark = Watermark(self.host, holds_from, _ms(), self.clock.offset, self.clock.error)
        self.bucket.put_bytes(f"{HOSTS}{self.host}.json", msgspec.json.encode(mark), overwrite=True)
        return mark

    def _upload(self, path: Path) -> None:
        owner = _fetched_by(self.bucket, path.name)
        if owner is not None and owner == self.standby:  # fetched, not loaded: handed back
            self.bucket.delete(FETCHED + path.name)
            owner = None
        if owner is None:
            with contextlib.suppress(ObjectExists):  # uploaded before a crash: it stands
                self.bucket.put_file(SEGMENTS + path.name, path)
        path.unlink()

    def retire(self) -> None:
        """At a clean stop (every writer of this host closed): upload what is left and
        delete the watermark, so this host holds nothing back."""
        if self.upload() is not None and not any(
            _locked(p) for p in self.directory.glob(f"*{OPEN}")
        ):
            self.bucket.delete(f"{HOSTS}{self.host}.json")


class Fetcher:
    """The loader's side: moves uploaded segments into its spool directory. `holder` names
    this loader in the tombstones it writes (`lease.py`); the same across its restarts."""

    def __init__(self, directory: Path, bucket: Bucket, lease_s: float, holder: str) -> None:
        self.directory = Path(directory)
        self.bucket = bucket
        self.lease_s = lease_s
        self.holder = holder
        self._mirrored: dict[str, int] = {}  # mtimes of what was uploaded
        self._pruned = 0.0  # monotonic time of the last pruning of tombstones
        self.clock = Clock()
        self._live: set[str] = set()  # hosts live at the last round
        self._skewed: dict[str, int] = {}  # hosts said to be off the bucket's clock
        self._lock = os.open(self.directory / LOADER_LOCK, os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(BlockingIOError):  # DuckDB's own lock refuses a second
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def close(self) -> None:
        os.close(self._lock)

    def fetch(self) -> Remote:
        """One round: read the watermarks, then move every uploaded segment here (and
        mirror what changed of this directory's files for the proxies)."""
        for name in MIRRORED:
            with contextlib.suppress(FileNotFoundError):
                stamp = (self.directory / name).stat().st_mtime_ns
                if self._mirrored.get(name) != stamp:
                    self.bucket.put_file(name, self.directory / name, overwrite=True)
                    self._mirrored[name] = stamp
        self.clock.measure(self.bucket)
        live, dropped = self._watermarks()
        fetched = 0
        for info in self.bucket.list(SEGMENTS):
            name = info.key.removeprefix(SEGMENTS)
            if not SEGMENT_NAME.fullmatch(name):
                log.error("%s is not a spool segment's name; left in the bucket", info.key)
                continue
            fetched += self._fetch_one(info.key, name)
        if time.monotonic() - self._pruned >= PRUNE_EVERY_S:
            self.prune(TOMBSTONE_S)
        # The earliest on the bucket's clock, then on this host's, at the earliest.
        before = min(live.values()) - self.clock.offset - self.clock.error if live else None
        return Remote(before, tuple(sorted(live)), fetched, dropped)

    def _watermarks(self) -> tuple[dict[str, int], tuple[str, ...]]:
        """Each live host's `holds_from` on the bucket's clock, and the hosts past their
        lease. A lease is judged on the bucket's clock alone (the watermark's age there),
        so no host's clock makes a live host dead or a dead one live."""
        live: dict[str, int] = {}
        dropped = []
        for info in self.bucket.list(HOSTS):
            try:
                mark = msgspec.json.decode(self.bucket.get_bytes(info.key), type=Watermark)
            except ObjectMissing:
                continue  # its host stopped meanwhile
            except msgspec.DecodeError:
                log.error("%s is not a watermark; ignored", info.key)
                continue
            if info.age_s > self.lease_s:
                dropped.append(mark.host)
                if mark.host in self._live:
                    log.warning(
                        "host %s has not handed over for %.0f s (collector.host_lease_s = "
                        "%g): taken for dead, it holds nothing back; what it answered loads "
                        "when it comes back",
                        mark.host,
                        info.age_s,
                        self.lease_s,
                    )
                continue
            live[mark.host] = mark.earliest
            skewed = abs(mark.offset) > SKEWED_MS
            if skewed and abs(self._skewed.get(mark.host, 0) - mark.offset) > SKEWED_MS:
                log.warning(
                    "host %s's clock is %+.1f s off the bucket's: its watermark is read on "
                    "the bucket's clock, but its segments are named on its own (keep hosts' "
                    "clocks in step: NTP)",
                    mark.host,
                    mark.offset / 1000,
                )
            self._skewed[mark.host] = mark.offset
        self._live = set(live)
        return live, tuple(sorted(dropped))

    def _fetch_one(self, key: str, name: str) -> int:
        """Move one segment here; 1 if it was downloaded. The tombstone, create-only, names
        this loader: a segment whose tombstone names another was fetched by that loader
        (two servers that each took themselves for the loader), and is its alone."""
        local = self.directory / name
        downloaded = 0
        if not local.exists():
            try:
                self.bucket.get_file(key, local)
            except ObjectMissing:
                return 0  # another loader fetched it meanwhile
            downloaded = 1
        try:
            self.bucket.put_bytes(FETCHED + name, self.holder.encode())
        except ObjectExists:
            # Written by this loader before a crash (or by one from before loaders were
            # named: empty), it stands; another loader's, the segment is that one's.
            owner = _fetched_by(self.bucket, name)
            if owner not in (None, "", self.holder):
                local.unlink(missing_ok=True)
                log.error("segment %s was fetched by loader %s too; left to it", name, owner)
                return 0
        # Once these two are done the object is this spool's alone.
        self.bucket.delete(key)
        return downloaded

    def prune(self, older_than_s: float) -> int:
        """Delete tombstones older than `older_than_s`; how many went."""
        self._pruned = time.monotonic()
        cutoff = time.time() - older_than_s
        old = [o for o in self.bucket.list(FETCHED) if o.modified.timestamp() < cutoff]
        for info in old:
            self.bucket.delete(info.key)
        return len(old)


def _fetched_by(bucket: Bucket, name: str) -> str | None:
    """The loader a segment's tombstone names ("": one from before loaders were named);
    None when it has no tombstone."""
    try:
        return bucket.get_bytes(FETCHED + name).decode(errors="replace")
    except ObjectMissing:
        return None


@contextlib.contextmanager
def _exclusive(path: Path):
    """A non-blocking `flock` on `path`: yields whether this process holds it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
