"""The admin key of a server configured with none (`proxy.admin_key` unset).

A server without an admin key used to answer admin calls from anyone who reached its port,
which on loopback still means every local process and, through the browser, every web
page. So `onjob serve` makes a key at its first start, says it once on stderr, and keeps
it in `<database>.admin-key` (mode 0600, the owner's alone); later starts reuse it, and
the other commands (`onjob status`, `promote`, `sql`, ...) read it from there, so the
path of one developer on one machine needs no configuration. The file grants nothing its
reader could not already take: it lies beside the database, with the same owner.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from ..errors import OnjobError

PREFIX = "onjob-admin-"


class KeyFileError(OnjobError):
    """The key file exists but cannot be used (unreadable, empty, or open to others)."""


def path_for(db: Path) -> Path:
    return db.with_name(db.name + ".admin-key")


def read(db: Path) -> str | None:
    """The key kept beside `db`; None when there is no file."""
    path = path_for(db)
    try:
        mode = path.stat().st_mode
        key = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KeyFileError(f"cannot read the admin key in {path}: {exc}") from exc
    if mode & 0o077:
        raise KeyFileError(
            f"{path} can be read by others (mode {mode & 0o777:o}): run `chmod 600 {path}`, "
            "or delete it for a new key"
        )
    if not key:
        raise KeyFileError(f"{path} is empty: delete it for a new key")
    return key


def ensure(db: Path) -> tuple[str, bool]:
    """The key kept beside `db`, made (and written 0600) if there is none; and whether it
    was made now."""
    key = read(db)
    if key is not None:
        return key, False
    key = PREFIX + secrets.token_urlsafe(32)
    path = path_for(db)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Created with its mode: never readable by others, not even for a moment.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: its key is the key
        made = read(db)
        if made is None:
            raise KeyFileError(f"{path} vanished while it was being made") from None
        return made, False
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key, True
