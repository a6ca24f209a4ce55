"""Ids for exchanges, trajectories and feedback, cheap enough for the hot path.

32 hex digits: the time in milliseconds (12), then 80 random bits (20). Time first
keeps DuckDB's primary-key indexes small: ids that arrive in order share their prefixes,
and the index over `exchanges.id` (which DuckDB holds in memory whole once a load touches
it) took ~46 bytes per exchange against ~107 for fully random ids (issue 19 item 3). 80
random bits keep ids unique and unguessable. `uuid.uuid4()` asks the kernel for entropy on
every call (a syscall that costs ~5% of a proxied request here); a generator seeded once
from the kernel is just as good for this.
"""

from __future__ import annotations

import os
import random
import time

_rng = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _rng.seed(os.urandom(32)))


def new_id(prefix: str) -> str:
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{_rng.getrandbits(80):020x}"
