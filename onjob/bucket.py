"""Object storage: the small client every part that hands files between hosts uses.

A `Bucket` is one S3-compatible bucket and a key prefix (`s3://name/prefix`), reached with
boto3 (the optional extra `s3`). Keys given to its methods are relative to the prefix.
Objects are written whole: `put_bytes` / `put_file` create an object only if no object of
that key exists (`If-None-Match: *`, which S3 honours since 2024, as do MinIO and moto),
so two hosts that race to write one key never overwrite each other silently: the loser
gets `ObjectExists` (moto, the tests' server, checks the header but not atomically
under concurrent writers). `overwrite=True` is for objects meant to change (a watermark).

One single PUT carries an object (up to S3's 5 GB): enough for a spool segment
(`collector.max_segment_bytes`) or a LoRA checkpoint, and the conditional header needs no
multipart bookkeeping. Every botocore error is translated here into `BucketError` and
its subclasses, once.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .errors import OnjobError

__all__ = ["Bucket", "BucketError", "ObjectChanged", "ObjectExists", "ObjectInfo", "ObjectMissing"]


class BucketError(OnjobError):
    """The object store refused a request or cannot be reached."""


class ObjectExists(BucketError):
    """A create-only write found an object under its key already."""


class ObjectMissing(BucketError):
    """No object under the key read."""


class ObjectChanged(BucketError):
    """A conditional write (`if_match`) found the object written anew since that ETag."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object as a listing shows it; `key` relative to the bucket's prefix. `etag`
    changes whenever the object is written with other content (`modified` has whole
    seconds only). `seen` is the bucket's clock when it answered (its `Date`, whole
    seconds): `seen - modified` is the object's age on one clock, whatever the hosts'."""

    key: str
    size: int
    modified: datetime
    etag: str = ""
    seen: datetime | None = None

    @property
    def age_s(self) -> float:
        """Seconds since the object was written, on the bucket's clock (0 if unknown)."""
        return max(0.0, (self.seen - self.modified).total_seconds()) if self.seen else 0.0


class Bucket:
    """One bucket and key prefix. Thread-safe (one boto3 client, which is)."""

    def __init__(self, name: str, prefix: str = "", *, client: Any) -> None:
        self.name = name
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._client = client

    @classmethod
    def from_url(
        cls, url: str, *, endpoint_url: str | None = None, region: str | None = None
    ) -> Bucket:
        """`s3://name` or `s3://name/prefix`. Credentials come from boto3's usual chain
        (environment, `~/.aws`, instance role); `endpoint_url` for MinIO, moto, R2...
        (boto3 also reads `AWS_ENDPOINT_URL`)."""
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise BucketError(f"not a bucket URL (want s3://name/prefix): {url!r}")
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:  # the optional extra
            raise BucketError(
                "object storage needs boto3: pip install -e '.[s3]' in onjob's checkout"
            ) from exc
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            # A store that hangs (no refusal, no answer) costs a round at most
            # 3 x (5 + 30) s, not botocore's 5 x (60 + 60) s: what waits on it gives up
            # and tries again later (`collector/spooler.py` backs off).
            config=Config(
                connect_timeout=5,
                read_timeout=30,
                retries={"max_attempts": 3, "mode": "standard"},
            ),
        )
        return cls(parts.netloc, parts.path, client=client)

    @property
    def url(self) -> str:
        return f"s3://{self.name}/{self.prefix}"

    def _key(self, key: str) -> str:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise BucketError(f"bad object key: {key!r}")
        return self.prefix + key

    # -- writing -------------------------------------------------------------------------

    def put_bytes(
        self, key: str, data: bytes, *, overwrite: bool = False, if_match: str | None = None
    ) -> str:
        """Write `data` as object `key`; its new ETag. `ObjectExists` if one is there and not
        `overwrite`; with `if_match`, it replaces the object only while that is its ETag
        (`ObjectChanged` if it was written anew since, `ObjectMissing` if it is gone)."""
        return self._put(key, data, overwrite, if_match)

    def put_file(self, key: str, path: Path, *, overwrite: bool = False) -> str:
        """Upload the file at `path` as object `key` (streamed; see `put_bytes`)."""
        with open(path, "rb") as body:
            return self._put(key, body, overwrite, None)

    def _put(self, key: str, body: Any, overwrite: bool, if_match: str | None) -> str:
        if if_match is not None:
            extra = {"IfMatch": if_match}
        else:
            extra = {} if overwrite else {"IfNoneMatch": "*"}
        try:
            answer = self._client.put_object(
                Bucket=self.name, Key=self._key(key), Body=body, **extra
            )
        except Exception as exc:
            error = _translate(exc, key)
            if if_match is not None and isinstance(error, ObjectExists):
                error = ObjectChanged(f"object written anew: {key}")
            raise error from exc
        return answer.get("ETag", "")

    def delete(self, key: str) -> None:
        """Delete object `key` (no error if it is gone already)."""
        try:
            self._client.delete_object(Bucket=self.name, Key=self._key(key))
        except Exception as exc:
            raise _translate(exc, key) from exc

    # -- reading -------------------------------------------------------------------------

    def get_bytes(self, key: str) -> bytes:
        try:
            answer = self._client.get_object(Bucket=self.name, Key=self._key(key))
            return answer["Body"].read()
        except Exception as exc:
            raise _translate(exc, key) from exc

    def get_file(self, key: str, path: Path) -> Path:
        """Download object `key` to `path`, atomically (a temporary file renamed): a reader
        of `path` sees the whole object or nothing."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as out:
                self._client.download_fileobj(self.name, self._key(key), out)
            os.replace(tmp, path)
        except Exception as exc:
            Path(tmp).unlink(missing_ok=True)
            raise _translate(exc, key) from exc
        return path

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, in key order."""
        out: list[ObjectInfo] = []
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.name, Prefix=self.prefix + prefix
        )
        try:
            for page in pages:
                seen = _date(page)
                for item in page.get("Contents", ()):
                    key = item["Key"][len(self.prefix) :]
                    etag = item.get("ETag", "")
                    out.append(ObjectInfo(key, item["Size"], item["LastModified"], etag, seen))
        except Exception as exc:
            raise _translate(exc, prefix) from exc
        return out

    def stat(self, key: str) -> ObjectInfo | None:
        """Object `key`'s size and time of writing, None if there is none."""
        try:
            head = self._client.head_object(Bucket=self.name, Key=self._key(key))
        except Exception as exc:
            error = _translate(exc, key)
            if isinstance(error, ObjectMissing):
                return None
            raise error from exc
        return ObjectInfo(
            key, head["ContentLength"], head["LastModified"], head.get("ETag", ""), _date(head)
        )

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None

    def clock_bounds_ms(self) -> tuple[int, int]:
        """Bounds on the bucket's clock minus this host's, in ms, from one request's `Date`
        (whole seconds): a second and a round trip wide (`handoff.Clock` narrows them).
        (-inf, inf) for a store that states no time."""
        sent = time.time()
        try:
            answer = self._client.head_bucket(Bucket=self.name)
        except Exception as exc:
            raise _translate(exc, "") from exc
        back = time.time()
        date = _date(answer)
        if date is None:
            return -math.inf, math.inf
        at = date.timestamp()
        return math.floor((at - back) * 1000), math.ceil((at + 1 - sent) * 1000)


def _date(answer: dict) -> datetime | None:
    """The bucket's clock when it answered: the HTTP `Date` of a boto3 answer."""
    date = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return parsedate_to_datetime(date) if date else None
    except (TypeError, ValueError):
        return None


def _translate(exc: Exception, key: str) -> BucketError:
    """botocore's errors as this module's (the one place that knows them)."""
    if isinstance(exc, BucketError):
        return exc
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in {"PreconditionFailed", "ConditionalRequestConflict"} or status == 412:
            return ObjectExists(f"object exists: {key}")
        if code in {"NoSuchKey", "404", "NotFound"}:
            return ObjectMissing(f"no object: {key}")
        return BucketError(f"{key}: {code or status}: {exc}")
    return BucketError(f"{key}: {type(exc).__name__}: {exc}")
