"""Ids for exchanges, trajectories and feedback, cheap enough for the hot path.

32 hex digits: the time in milliseconds (12), then 80 random bits (20). Time first
keeps DuckDB's primary-key indexes small: ids that arrive in order share their prefixes,
and the index over `exchanges.id` (which DuckDB holds in memory whole once a load touches
it) took ~46 bytes per exchange against ~107 for fully random ids (issue 19 item 3).

The 80 bits come from the kernel's CSPRNG (`os.urandom`), read 4 KiB at a time: an id is
a capability (a Response's id retrieves it, a trajectory's id takes feedback), and a
`random.Random` (Mersenne Twister) can be predicted from ~624 of its outputs, which ids
already issued give away. One `os.urandom` call per id costs a syscall (~5% of a
proxied request here, as `uuid.uuid4()` did); the buffer costs one syscall per 408
ids (`bench/collector/ids.py` prints ns per id of each way).
"""

from __future__ import annotations

import os
import time

_BATCH = 4080  # bytes read at once: 408 ids of 10 bytes
_pool: list[str] = []  # 20-hex-digit strings from the kernel, each handed out once


def _refill() -> None:
    digits = os.urandom(_BATCH).hex()
    # `extend` and `pop` are atomic under the GIL: threads that refill at once each add
    # fresh values, and no value is handed out twice.
    _pool.extend([digits[i : i + 20] for i in range(0, len(digits), 20)])


# A forked child must not hand out the ids its parent holds in the buffer.
os.register_at_fork(after_in_child=_pool.clear)


def random_hex() -> str:
    """80 bits from the kernel's CSPRNG, as 20 hex digits."""
    while True:
        try:
            return _pool.pop()
        except IndexError:
            _refill()


def new_id(prefix: str) -> str:
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{random_hex()}"


def created_ms(value: str) -> int | None:
    """When an id of `new_id`'s making was made (ms, its host's clock), whatever its
    prefix; None for any other string (a client's own trajectory id, say)."""
    tail = value[-32:]
    if len(tail) < 32 or any(c not in "0123456789abcdef" for c in tail):
        return None
    return int(tail[:12], 16)
