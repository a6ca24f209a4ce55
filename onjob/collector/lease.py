"""The loader's lease: one loader at a time among the servers that share a bucket.

Every `onjob serve` with `collector.bucket` set and no `--primary` may load; the one that
holds `loader.lease` does. The lease is one object, written with conditional requests
only, so two servers racing for it cannot both win:

- a server takes a lease that is not there with a create-only write (`If-None-Match`),
  and one whose holder has not renewed it for `collector.host_lease_s` **on the bucket's
  clock** (the object's `LastModified` against the bucket's `Date`, never a host's own
  clock) by replacing the exact object it read (`If-Match` its ETag), with the fencing
  token one higher;
- the holder renews it every third of the lease, again with `If-Match` its own last
  ETag (each write's body differs: its beat counts up), so a holder that was paused past
  its lease and taken over finds out at its next renewal and stops loading;
- the holder counts its lease as lost a lease after the last renewal it *sent*, on its
  own monotonic clock, whatever the bucket answers later: it never loads on a lease
  another server may have taken.

A segment is fetched under a tombstone that names its loader (`handoff.Fetcher`): were
two servers ever to hold the lease at once, each segment is still loaded by one only.
A server waiting for the lease is a standby: it hands its own traffic to the bucket as
any proxy host does, loads nothing and runs no loop, and takes over when the holder's
lease ends (`docs/scaling.md`).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from pathlib import Path

import msgspec

from ..bucket import Bucket, BucketError, ObjectChanged, ObjectExists, ObjectMissing

log = logging.getLogger("onjob.collector")

LEASE = "loader.lease"
LOADER_ID = "loader.id"  # in the loader's spool directory: its name, kept across restarts


def loader_id(directory: Path, host: str) -> str:
    """The name of the loader whose spool directory is `directory`: made at its first start
    (the host's name and a random part: two loaders on one host differ), then kept."""
    path = Path(directory) / LOADER_ID
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        name = f"{host}.{secrets.token_hex(4)}"
        path.write_text(name + "\n")
        return name


class LeaseBody(msgspec.Struct, frozen=True):
    """What the lease object holds: who holds it, the fencing token (one higher at each
    change of holder) and the holder's renewals so far."""

    holder: str
    token: int
    beat: int = 0
    url: str | None = None  # where the holder answers (`collector.advertise_url`)
    last: str = ""  # a lease given back: who gave it


def read_lease(bucket: Bucket) -> LeaseBody | None:
    """The lease as it stands (None: none, or not one)."""
    try:
        return msgspec.json.decode(bucket.get_bytes(LEASE), type=LeaseBody)
    except (ObjectMissing, msgspec.DecodeError):
        return None


class LoaderLease:
    """This server's claim on `loader.lease`: `renew()` each third of the lease (a thread
    of its own: `start`), `held` before each load."""

    def __init__(self, bucket: Bucket, holder: str, lease_s: float, url: str | None = None) -> None:
        self.bucket = bucket
        self.holder = holder
        self.lease_s = lease_s
        self.url = url
        self.body: LeaseBody | None = None  # what this server last wrote, while it holds
        self.other: LeaseBody | None = None  # the holder this server waits on
        self.previous: str | None = None  # who held the lease before this server took it
        self._etag: str | None = None
        self._until = 0.0  # monotonic: the lease is ours until then at the latest
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self.body is not None and time.monotonic() < self._until

    def renew(self) -> bool:
        """Renew the lease, or take it if it is free or its holder's has ended; whether this
        server holds it now. A bucket that cannot be reached leaves things as they were."""
        sent = time.monotonic()
        try:
            if self.body is not None:
                body = msgspec.structs.replace(self.body, beat=self.body.beat + 1)
                self._write(body, if_match=self._etag)
            else:
                self._take()
        except (ObjectChanged, ObjectMissing, ObjectExists):
            if self.body is not None:
                log.warning("lost the loader's lease (token %d): loading stops", self.body.token)
            self.body = self._etag = None
        except BucketError as exc:
            log.warning("cannot renew the loader's lease: %s", exc)
            return self.held
        if self.body is not None:
            self._until = sent + self.lease_s
        return self.held

    def _take(self) -> None:
        info = self.bucket.stat(LEASE)
        if info is None:
            self._write(LeaseBody(self.holder, 1, url=self.url), if_match=None)
            self.previous = None
            return
        try:
            current = msgspec.json.decode(self.bucket.get_bytes(LEASE), type=LeaseBody)
        except msgspec.DecodeError:
            log.error("%s is not a lease; taken over", LEASE)
            current = LeaseBody("", 0)
        # A lease given back (no holder), this loader's own before a restart, or one not
        # renewed for a lease on the bucket's clock, is free.
        if current.holder not in ("", self.holder) and info.age_s <= self.lease_s:
            if self.other is None or self.other.holder != current.holder:
                log.warning(
                    "loader %s holds the lease (token %d): this server waits as a standby",
                    current.holder,
                    current.token,
                )
            self.other = current
            return
        self._write(LeaseBody(self.holder, current.token + 1, url=self.url), if_match=info.etag)
        self.previous = current.holder or current.last or None
        if current.holder:
            log.warning(
                "took the loader's lease (token %d) from %s, %.0f s after its last renewal",
                current.token + 1,
                current.holder,
                info.age_s,
            )
        else:
            log.warning(
                "took the loader's lease (token %d), given back by %s",
                current.token + 1,
                current.last or "a loader",
            )

    def _write(self, body: LeaseBody, *, if_match: str | None) -> None:
        data = msgspec.json.encode(body)
        self._etag = self.bucket.put_bytes(LEASE, data, if_match=if_match)
        self.body, self.other = body, None

    def start(self) -> None:
        """Renew every third of the lease on a thread of its own: a long load never lets
        the lease lapse, a slow bucket never holds up loading."""
        self.renew()
        self._thread = threading.Thread(target=self._run, name="onjob-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            self.renew()

    def release(self) -> None:
        """At a clean stop: stop renewing and give the lease back if still ours (no holder,
        its token kept), so a standby takes over at once rather than after the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lease_s)
        if self.held:
            given_back = LeaseBody("", self.body.token, self.body.beat + 1, last=self.holder)
            try:  # refused if it is not ours any more
                self.bucket.put_bytes(LEASE, msgspec.json.encode(given_back), if_match=self._etag)
            except BucketError as exc:
                log.warning("could not give the loader's lease back: %s", exc)
        self.body = self._etag = None
