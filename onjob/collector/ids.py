"""Random ids for exchanges, trajectories and feedback, cheap enough for the hot path.

`uuid.uuid4()` asks the kernel for entropy on every call (a syscall that costs
~5% of a proxied request here); a generator seeded once from the kernel gives ids
just as unique for our purpose (128 random bits).
"""

from __future__ import annotations

import os
import random

_rng = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _rng.seed(os.urandom(32)))


def new_id(prefix: str) -> str:
    return f"{prefix}{_rng.getrandbits(128):032x}"
