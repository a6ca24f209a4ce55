"""`Spooler`: the proxy's side of the collector, which every process has: each exchange
and feedback durably appended to the spool before the answer leaves, never waiting on
DuckDB (`log`), and what it takes to keep that promise.

It holds what a proxy-only process holds alone (`onjob serve --role proxy`, and the extra
workers of `onjob serve --workers N`): the spool it appends to, the size cap on one line
(`_too_large`), the spool directory's cap (`_check_room`: answered, not logged, while it
is full), this process's memory of conversations (`lineage`, and the openings each
segment carries a copy of), the counters of what it spooled, and a proxy-only process's
rotation and hand-off to the bucket (`_rotating`, `_hand_over`): there the loader is
another process, maybe on another host, so its segments close on a clock and go to the
bucket, and a deletion the loader made clears the memory here (`_forget_memory`). The
loader (`loader.py`) reads the same spool and clears the memory a lake's load saw go."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from ..bucket import Bucket
from ..logprobs import Untrainable
from .handoff import FORGOTTEN, Uploader
from .linear import Lineage
from .records import NULL, ExchangeRecord, Record, encode
from .settings import CollectorSettings
from .spool import Spool

log = logging.getLogger("onjob.collector")
T = TypeVar("T")

FORGOTTEN_MARK = "forgotten.mark"  # in the spool directory: touched by each `forget`


def _salt(settings: CollectorSettings) -> bytes:
    """A lake's writer's own openings (`Lineage.salt`): this host and spool directory's,
    which its proxy-only processes share with it."""
    if settings.catalog is None:
        return b""
    return f"{socket.gethostname()}\0{settings.spool.resolve()}\0".encode()


def _stamp(path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


class Rounds:
    """The bucket's rounds (a proxy-only process's hand-off, the loader's lease, standby
    uploads and copies), one at a time on a thread of their own. A round still in flight
    when the process stops (its task cancelled, its thread not) ends before `retire`
    starts, which otherwise finds the round's lock held and leaves the watermark."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="onjob-handoff")

    def __call__(self, round_: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self._pool, round_, *args)

    def shutdown(self) -> None:
        """Wait for the round in flight, if any (`Collector.close`, after the last)."""
        self._pool.shutdown(wait=True)


class Spooler:
    def __init__(self, settings: CollectorSettings, handing: Rounds) -> None:
        self.settings = settings
        self._lineage = Lineage(settings.stitch_capacity, settings.lineage_tokens, _salt(settings))
        self._lineage_stale = False  # set on the database thread (`forgotten_elsewhere`)
        self._spool: Spool | None = None
        self._uploader: Uploader | None = None  # a proxy-only process, with a bucket
        self._handing = handing
        self._seen_remote: object = FORGOTTEN  # deletions' mark (not read yet: no change)
        self._backoff = self._retry_at = 0.0  # after a failed hand-off round
        self._full = False  # the spool directory holds `max_spool_bytes`: nothing logged
        self._roomed = self._said_full = -math.inf  # monotonic: last look, last error
        self.unlogged = 0  # exchanges and feedback answered but not logged (`_full`)
        self._task: asyncio.Task | None = None  # a proxy-only process's rotation
        self._openings_in: tuple[int, set[str]] = (0, set())  # a segment's openings spooled
        self.spooled = 0  # exchanges handed over since start
        self.untrainable: dict[str, int] = {}  # of those, kept from training, by reason
        self.forgets_seen = 0  # deletions that cleared this process's memory

    def open(self) -> Spool:
        """Open the spool directory (at `Collector.start`): what the loader reads too."""
        self._spool = Spool(
            self.settings.spool,
            fsync=self.settings.fsync,
            max_segment_bytes=self.settings.max_segment_bytes,
        )
        return self._spool

    def hand_to(self, bucket: Bucket) -> None:
        """A proxy-only process with `collector.bucket`: its closed segments go there."""
        self._uploader = Uploader(
            self.settings.spool,
            bucket,
            self.settings.host,
            lease_s=self.settings.host_lease_s,
        )

    def start(self) -> None:
        """A proxy-only process: rotate (and hand over) in the background."""
        self._task = asyncio.create_task(self._rotating(), name="onjob-spool")

    @property
    def spool(self) -> Spool | None:
        """The spool this process appends to (None before `open`)."""
        return self._spool

    @property
    def loader_url(self) -> str | None:
        """A proxy host: where the server that loads answers, as its lease in the bucket
        says (None: not said)."""
        return self._uploader.loader_url if self._uploader is not None else None

    @property
    def lineage(self) -> Lineage:
        """What this process's next turns are stored against (`linear.py`; the proxy's,
        on the event loop): cleared first when a forget was seen on a lake's load."""
        if self._lineage_stale:
            self._lineage_stale = False
            self._lineage.clear()
        return self._lineage

    def forgotten_elsewhere(self) -> None:
        """A lake's load saw a forget (on the database thread, `Loader._follow_forgets`):
        the lineage is cleared on the event loop, its own thread, when next read."""
        self._lineage_stale = True
        self.forgets_seen += 1

    def log(self, record: Record) -> None:
        """Durably hand over one exchange or feedback (one append to the spool); never waits
        on DuckDB. An exchange stored against an opening (`linear.py`) takes a copy of it
        into the segment, the first time that segment needs it: segments stand alone."""
        if self._full:
            self._unlogged()
            return
        line = encode(record)
        if isinstance(record, ExchangeRecord):
            if len(line) > self.settings.max_line_bytes:
                record, line = self._too_large(record, len(line))
            self.spooled += 1
            if record.untrainable:
                self.untrainable[record.untrainable] = (
                    self.untrainable.get(record.untrainable, 0) + 1
                )
            opening = self.lineage.openings.get(record.parent_id or "")
            if opening is not None:
                segment = self._spool.segment
                if segment != self._openings_in[0]:
                    self._openings_in = (segment, set())
                if opening.id not in self._openings_in[1]:
                    self._openings_in[1].add(opening.id)
                    copy = msgspec.structs.replace(opening, ts=record.ts)
                    line = encode(copy) + b"\n" + line  # one write: never split by a rotation
        self._spool.append(line)

    def _unlogged(self) -> None:
        self.unlogged += 1
        if time.monotonic() - self._said_full >= 60:
            self._said_full = time.monotonic()
            log.error(
                "the spool directory holds collector.max_spool_bytes (%d): answering without "
                "logging (%d unlogged so far) until the loader or the bucket takes some",
                self.settings.max_spool_bytes,
                self.unlogged,
            )

    def check_room(self) -> None:
        """Whether the spool directory is past `max_spool_bytes` (looked at once a second
        at most)."""
        cap = self.settings.max_spool_bytes
        if cap is None or time.monotonic() - self._roomed < 1.0:
            return
        self._roomed = time.monotonic()
        full = self._spool.bytes_held() >= cap
        if self._full and not full:
            log.warning("the spool directory has room again: logging goes on")
        self._full = full

    def _too_large(self, record: ExchangeRecord, size: int) -> tuple[ExchangeRecord, bytes]:
        """An exchange whose line is past `max_line_bytes`, which DuckDB could not load
        within its memory (the loader would retry it every round): stored without its
        answer, and if that is not enough without its request, so that it is still logged,
        with its status, and kept out of training."""
        limit = self.settings.max_line_bytes
        past = f"its spool line was {size} bytes, past collector.max_line_bytes ({limit})"
        answer = dict.fromkeys(("response", "api_object", "usage"), NULL)
        answer |= dict.fromkeys(("completion_token_ids", "completion_logprobs"))
        record = msgspec.structs.replace(
            record,
            **answer,
            untrainable=Untrainable.TOO_LARGE,
            error=f"stored without its answer: {past}",
        )
        line = encode(record)
        if len(line) > limit:
            request = dict.fromkeys(("request", "metadata"), NULL) | {"prompt_token_ids": None}
            record = msgspec.structs.replace(
                record, **request, error=f"stored without its answer or request: {past}"
            )
            line = encode(record)
        log.warning("exchange %s %s", record.id, record.error)
        return record, line

    async def _rotating(self) -> None:
        """A proxy-only process closes its segment every `rotate_s`: the loader may load it.
        With a bucket, a hand-off round starts whenever none is running: a bucket that
        hangs holds up the hand-off, never the rotation. When the primary has deleted
        conversations, the memory of them goes too."""
        mark = self.settings.spool / FORGOTTEN_MARK
        seen = _stamp(mark)
        handing: asyncio.Task | None = None
        try:
            while True:
                await asyncio.sleep(self.settings.rotate_s)
                try:
                    self._spool.rotate()
                except OSError:
                    log.exception("closing a spool segment failed; will retry")
                self.check_room()
                if self._uploader is not None and (handing is None or handing.done()):
                    handing = asyncio.create_task(self._hand_over())
                if (stamp := _stamp(mark)) != seen:
                    seen = stamp
                    self._forget_memory()
        finally:
            if handing is not None:
                handing.cancel()

    async def _hand_over(self) -> None:
        """Upload this host's closed segments (`handoff.py`); when the loader has deleted
        conversations since the last round, forget them here too. A failed round waits
        twice as long as the one before it to try again (up to a minute)."""
        if time.monotonic() < self._retry_at:
            return
        try:
            if await self._handing(self._uploader.upload) is None:
                return
        except Exception:  # the segments stay on this host's disk: nothing is lost
            self._backoff = min(60.0, max(self.settings.rotate_s, self._backoff * 2))
            self._retry_at = time.monotonic() + self._backoff
            log.exception("handing the spool to the bucket failed; retried in %g s", self._backoff)
            return
        self._backoff, self._retry_at = 0.0, 0.0
        now = self._uploader.forgotten
        if self._seen_remote is not FORGOTTEN and now != self._seen_remote:
            self._forget_memory()
        self._seen_remote = now

    def _forget_memory(self) -> None:
        """Conversations were deleted: a later turn must not be stored against one."""
        self.lineage.clear()
        self.forgets_seen += 1

    async def stop(self) -> None:
        """End a proxy-only process's rotation (`Collector.close`, first)."""
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def retire(self) -> None:
        """A proxy-only process with a bucket, at a clean stop: what is left goes there and
        its watermark is deleted (`Uploader.retire`)."""
        if self._uploader is not None:
            try:
                await self._handing(self._uploader.retire)
            except Exception:
                log.exception("uploading the spool at exit failed; the next start uploads it")
