"""Ids (`collector/ids.py`) carry 80 bits from the kernel's CSPRNG, each handed out once,
never shared with a forked child (issue 34: ids from a seeded `random.Random` could be
predicted from the ids already issued)."""

from __future__ import annotations

import os
import time

from onjob.collector import ids


def test_the_random_part_is_the_kernels_bytes_in_order(monkeypatch):
    handed: list[bytes] = []

    def urandom(n: int) -> bytes:
        data = os.getrandom(n) if hasattr(os, "getrandom") else bytes(n)
        handed.append(data)
        return data

    monkeypatch.setattr(os, "urandom", urandom)  # the stdlib's, to see what it hands out
    ids._pool.clear()
    made = [ids.new_id("resp_") for _ in range(500)]
    kernel = b"".join(handed).hex()
    parts = [kernel[i : i + 20] for i in range(0, len(kernel), 20)]
    # Every id's 80 random bits are 10 bytes the kernel gave, none used twice.
    assert {m[-20:] for m in made} <= set(parts)
    assert len({m[-20:] for m in made}) == 500
    assert all(m.startswith("resp_") and len(m) == 5 + 32 for m in made)
    assert abs(int(made[0][5:17], 16) - time.time_ns() // 1_000_000) < 60_000


def test_a_forked_child_never_hands_out_its_parents_buffered_ids():
    ids.new_id("x")  # the buffer holds ids now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, "".join(ids.new_id("")[-20:] for _ in range(50)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    theirs = {child[i : i + 20] for i in range(0, len(child), 20)}
    ours = {ids.new_id("")[-20:] for _ in range(50)}
    assert len(theirs) == 50 and not theirs & ours
