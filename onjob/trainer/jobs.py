"""Training runs handed through object storage to a job on another host (`trainer.runner =
"job"`): the server exports a snapshot and submits it, a training job (`onjob train
--jobs s3://...`) takes it, trains and publishes the checkpoint, the server fetches it.

Under `trainer.bucket`:

    snapshots/<name>/snapshot.parquet   the groups to train on (`snapshot.export`)
    snapshots/<name>/job.json           what to run: the name, the parent, the settings;
                                        written last, so a job is seen whole or not at all
    snapshots/<name>/taken              create-only: one job runs it, however many watch
    snapshots/<name>/failed             {"exit", "reason"}: the run wrote no checkpoint
                                        (the snapshot itself is deleted once the server
                                        has the outcome: `retire`)
    checkpoints/<name>/...              the checkpoint (`onjob.published`), parents included

No torch here: the server submits and waits with this module alone.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..bucket import Bucket, ObjectExists
from ..published import published
from .settings import TrainSettings

SNAPSHOT, JOB, TAKEN, FAILED = "snapshot.parquet", "job.json", "taken", "failed"


@dataclass(frozen=True)
class Job:
    name: str
    parent: str | None  # a checkpoint published under checkpoints/; None: the base model
    settings: TrainSettings


@dataclass(frozen=True)
class Outcome:
    state: Literal["published", "failed", "waiting"]
    exit: int = 0
    reason: str = ""


@dataclass(frozen=True)
class Store:
    """The two prefixes of one `trainer.bucket` URL."""

    snapshots: Bucket
    checkpoints: Bucket

    @classmethod
    def at(cls, url: str) -> Store:
        root = url.rstrip("/")
        return cls(Bucket.from_url(f"{root}/snapshots"), Bucket.from_url(f"{root}/checkpoints"))


def submit(store: Store, job: Job, snapshot: Path) -> None:
    store.snapshots.put_file(f"{job.name}/{SNAPSHOT}", snapshot)
    body = {
        "name": job.name,
        "parent": job.parent,
        "settings": job.settings.model_dump(mode="json"),
    }
    store.snapshots.put_bytes(f"{job.name}/{JOB}", json.dumps(body).encode())


def pending(store: Store) -> list[str]:
    """Submitted jobs nobody has taken, oldest name first."""
    marks: dict[str, set[str]] = {}
    for obj in store.snapshots.list():
        name, _, leaf = obj.key.partition("/")
        marks.setdefault(name, set()).add(leaf)
    return sorted(n for n, m in marks.items() if JOB in m and not m & {TAKEN, FAILED})


def take(store: Store, name: str) -> bool:
    """Claim job `name`; False when another job took it first."""
    try:
        store.snapshots.put_bytes(f"{name}/{TAKEN}", b"")
    except ObjectExists:
        return False
    return True


def read(store: Store, name: str, into: Path) -> tuple[Job, Path]:
    """The job and its snapshot, downloaded to `into`."""
    body = json.loads(store.snapshots.get_bytes(f"{name}/{JOB}"))
    job = Job(body["name"], body.get("parent"), TrainSettings.model_validate(body["settings"]))
    return job, store.snapshots.get_file(f"{name}/{SNAPSHOT}", Path(into) / SNAPSHOT)


def fail(store: Store, name: str, code: int, reason: str) -> None:
    body = json.dumps({"exit": code, "reason": reason[-2000:]}).encode()
    with contextlib.suppress(ObjectExists):
        store.snapshots.put_bytes(f"{name}/{FAILED}", body)


def retire(store: Store, name: str) -> None:
    """Delete a finished job's snapshot from the bucket (its markers stay as the record):
    the server keeps its own copy beside its checkpoints, where `onjob forget` finds it,
    and no copy of the groups lingers where forgetting would not reach."""
    store.snapshots.delete(f"{name}/{SNAPSHOT}")


def outcome(store: Store, name: str) -> Outcome:
    if published(store.checkpoints, name):
        return Outcome("published")
    if store.snapshots.exists(f"{name}/{FAILED}"):
        body = json.loads(store.snapshots.get_bytes(f"{name}/{FAILED}"))
        return Outcome("failed", int(body.get("exit", 1)), str(body.get("reason", "")))
    return Outcome("waiting")
