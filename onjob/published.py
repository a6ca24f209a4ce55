"""Checkpoints published to object storage, and a host's cache of them by name.

Under a bucket prefix (`trainer.bucket` + `/checkpoints`, an engine's `adapter_bucket`)
each checkpoint is `<name>/<file>` for every file of its adapter directory, then
`<name>/COMPLETE`, written last: a reader takes a checkpoint only once that marker is
there, so a publisher that dies half way leaves nothing a replica loads. A published name
never changes (the marker is a create-only write), so a host's cached copy is never stale.

`fetch` downloads into a temporary directory beside the cache entry and renames it into
place: a reader of the cache (vLLM's filesystem resolver, the local engine) sees a whole
adapter directory or none.
"""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

from .bucket import Bucket, ObjectExists

COMPLETE = "COMPLETE"

# What a checkpoint may be called: the names onjob gives (`ckpt-<time>-<id>`) and any a
# person picks within it; never a path (a request's `model` reaches `fetch`).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def valid_name(name: str) -> bool:
    return bool(NAME.fullmatch(name)) and ".." not in name


def publish(bucket: Bucket, directory: Path, name: str) -> bool:
    """Upload the adapter directory `directory` as checkpoint `name`; False when a
    checkpoint of that name is published already (nothing is written then)."""
    if not valid_name(name):
        raise ValueError(f"not a checkpoint name: {name!r}")
    if bucket.exists(f"{name}/{COMPLETE}"):
        return False
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        # Overwrite: a publisher that died half way left some of these, never the marker.
        bucket.put_file(f"{name}/{path.relative_to(directory).as_posix()}", path, overwrite=True)
    try:
        bucket.put_bytes(f"{name}/{COMPLETE}", b"")
    except ObjectExists:
        return False  # another publisher finished the same name first
    return True


def published(bucket: Bucket, name: str) -> bool:
    return valid_name(name) and bucket.exists(f"{name}/{COMPLETE}")


def fetch(bucket: Bucket, name: str, cache: Path) -> Path | None:
    """`cache/<name>`, downloaded from the bucket unless it is there already; None when
    the bucket holds no complete checkpoint of that name."""
    if not valid_name(name):
        return None
    dest = Path(cache) / name
    if (dest / "adapter_config.json").is_file():
        return dest
    if not bucket.exists(f"{name}/{COMPLETE}"):
        return None
    tmp = Path(cache) / f".{name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        for obj in bucket.list(f"{name}/"):
            relative = obj.key[len(name) + 1 :]
            if relative != COMPLETE:
                bucket.get_file(obj.key, tmp / relative)
        try:
            tmp.rename(dest)
        except OSError:
            if not (dest / "adapter_config.json").is_file():
                raise
            # another fetch of the same name finished first: the same bytes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
