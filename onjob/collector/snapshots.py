"""The loader's database through the bucket, so a standby that takes the loader's lease
(`lease.py`) goes on from it rather than from an empty file.

    db/<ms>-<holder>.duckdb     a copy of the loader's database, every
                                `collector.snapshot_s`; the newest one is kept
    archive/<segment name>      every segment the loader loaded since that copy (its own
                                writers' and those fetched from other hosts)

The loader moves each segment it loads into `archive/` of its spool directory (instead
of deleting it) and uploads it from there; every `snapshot_s` it writes the WAL into its
file and copies the file on its database thread (nothing loads meanwhile), uploads the
copy, then deletes the archived segments the copy holds, locally and in the bucket.

A server that takes the lease restores the newest copy when another loader wrote it
and its own database holds nothing newer (a standby's is empty or stale; a loader
restarted under a new name keeps its own), then fetches every archived segment into
its spool directory, where they load as any segment does: those the restored database
loaded already are skipped whole (`loaded_segments`), the rest load. What is lost in a
fail-over: what the old loader wrote to its database itself since its last copy (judged
groups, training runs, routing changes made since), and segments it loaded but had not
uploaded yet (a round of `flush_interval_s`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..bucket import Bucket, ObjectExists
from .handoff import SEGMENT_NAME

log = logging.getLogger("onjob.collector")

ARCHIVE, SNAPSHOTS = "archive/", "db/"
SNAPSHOT_NAME = re.compile(r"(\d{13})-([0-9A-Za-z_.-]{1,80})\.duckdb")


@dataclass(frozen=True)
class Snapshot:
    key: str
    at_ms: int
    holder: str


class Archive:
    """One loader's side: the segments it loaded since its last copy, and the copies."""

    def __init__(self, directory: Path, bucket: Bucket, holder: str) -> None:
        self.directory = Path(directory)
        self.local = self.directory / "archive"
        self.local.mkdir(mode=0o700, exist_ok=True)
        self.bucket = bucket
        self.holder = holder
        # Names moved here since the last copy: added on the database thread as they load,
        # taken away on the hand-off thread once a copy holds them.
        self._since: set[str] = {p.name for p in self.local.glob("*.jsonl")}
        self._lock = threading.Lock()

    def keep(self, path: Path) -> None:
        """A segment just loaded: kept for the bucket rather than deleted."""
        os.replace(path, self.local / path.name)
        with self._lock:
            self._since.add(path.name)

    def upload(self) -> int:
        """Upload what was kept locally; how many went."""
        sent = 0
        for path in sorted(self.local.glob("*.jsonl")):
            with contextlib.suppress(ObjectExists):  # uploaded before a crash, or restored
                self.bucket.put_file(ARCHIVE + path.name, path)
            path.unlink(missing_ok=True)
            sent += 1
        return sent

    def copy(self, store, target: Path) -> set[str]:
        """On the database thread: the database file copied whole to `target`
        (`Store.copy_file`); the archived segments the copy holds."""
        with self._lock:
            held = set(self._since)
        store.copy_file(target)
        return held

    def publish(self, copy: Path, held: set[str]) -> Snapshot:
        """Upload a copy, then delete what it makes unneeded: the archived segments it
        holds and the older copies."""
        key = f"{SNAPSHOTS}{int(time.time() * 1000):013d}-{self.holder}.duckdb"
        self.bucket.put_file(key, copy)
        copy.unlink(missing_ok=True)
        for name in held:
            (self.local / name).unlink(missing_ok=True)
            self.bucket.delete(ARCHIVE + name)
        for old in self.snapshots()[:-1]:
            self.bucket.delete(old.key)
        with self._lock:
            self._since -= held
        return self.snapshots()[-1]

    def snapshots(self) -> list[Snapshot]:
        """The copies in the bucket, oldest first."""
        out = []
        for info in self.bucket.list(SNAPSHOTS):
            m = SNAPSHOT_NAME.fullmatch(info.key.removeprefix(SNAPSHOTS))
            if m:
                out.append(Snapshot(info.key, int(m[1]), m[2]))
        return sorted(out, key=lambda s: s.at_ms)

    def newest_of_another(self, newest_here_ms: int | None) -> Snapshot | None:
        """The copy to restore at taking the lease: the newest, when another loader wrote
        it and the database here holds no exchange logged after it."""
        copies = self.snapshots()
        if not copies or copies[-1].holder == self.holder:
            return None
        if newest_here_ms is not None and newest_here_ms > copies[-1].at_ms:
            log.warning(
                "kept this server's database: it holds exchanges newer than %s",
                copies[-1].key,
            )
            return None
        return copies[-1]

    def fetch_archived(self) -> int:
        """Every archived segment into the spool directory (those loaded already are
        skipped at load); how many came."""
        came = 0
        for info in self.bucket.list(ARCHIVE):
            name = info.key.removeprefix(ARCHIVE)
            if not SEGMENT_NAME.fullmatch(name):
                continue
            if not (self.directory / name).exists() and not (self.local / name).exists():
                self.bucket.get_file(info.key, self.directory / name)
                came += 1
        return came
