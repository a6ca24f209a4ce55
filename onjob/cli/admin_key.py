"""The admin key of a server configured with none (`proxy.admin_key` unset), and the
adapter token of the engine `onjob serve --start-engine` starts (`proxy.engine_token` unset).

A server without an admin key used to answer admin calls from anyone who reached its port,
which on loopback still means every local process and, through the browser, every web
page. So `onjob serve` makes a key at its first start, says it once on stderr, and keeps
it in `<database>.admin-key` (mode 0600, the owner's alone); later starts reuse it, and
the other commands (`onjob status`, `promote`, `sql`, ...) read it from there, so the
path of one developer on one machine needs no configuration. The file grants nothing its
reader could not already take: it lies beside the database, with the same owner.

The engine's adapter token is kept the same way, in `<database>.engine-token`: the child's
adapter routes answer only who sends it, and `onjob doctor`, `onjob loop` and the other
commands that load adapters into that engine read it from there (`cli/common.py`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Literal

from ..errors import OnjobError

PREFIX = "onjob-admin-"
Kind = Literal["admin-key", "engine-token"]  # the file's suffix
ADMIN_KEY: Kind = "admin-key"
ENGINE_TOKEN: Kind = "engine-token"
_WHAT = {ADMIN_KEY: "the admin key", ENGINE_TOKEN: "the engine's adapter token"}


class KeyFileError(OnjobError):
    """The key file exists but cannot be used (unreadable, empty, or open to others)."""


def path_for(db: Path, kind: Kind = ADMIN_KEY) -> Path:
    return db.with_name(f"{db.name}.{kind}")


def read(db: Path, kind: Kind = ADMIN_KEY) -> str | None:
    """The key kept beside `db`; None when there is no file."""
    path = path_for(db, kind)
    try:
        mode = path.stat().st_mode
        key = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KeyFileError(f"cannot read {_WHAT[kind]} in {path}: {exc}") from exc
    if mode & 0o077:
        raise KeyFileError(
            f"{path} can be read by others (mode {mode & 0o777:o}): run `chmod 600 {path}`, "
            "or delete it for a new key"
        )
    if not key:
        raise KeyFileError(f"{path} is empty: delete it for a new key")
    return key


def ensure(db: Path, kind: Kind = ADMIN_KEY) -> tuple[str, bool]:
    """The key kept beside `db`, made (and written 0600) if there is none; and whether it
    was made now."""
    key = read(db, kind)
    if key is not None:
        return key, False
    key = (PREFIX if kind == ADMIN_KEY else "") + secrets.token_urlsafe(32)
    path = path_for(db, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Created with its mode: never readable by others, not even for a moment.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: its key is the key
        made = read(db, kind)
        if made is None:
            raise KeyFileError(f"{path} vanished while it was being made") from None
        return made, False
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key, True
