"""What an id costs: ns per id, the way before (a seeded `random.Random`, predictable from
the ids it issued), one `os.urandom` per id, `uuid.uuid4()`, and now (`new_id`: the
kernel's CSPRNG read 4 KiB at a time).

    .venv/bin/python -m bench.collector.ids [--ids 1000000] [--repeat 5]

Prints the best of `--repeat` runs of `--ids` ids for each (one process, one thread).
"""

from __future__ import annotations

import argparse
import os
import random
import time
import uuid

from bench import harness
from onjob.collector.ids import new_id

_rng = random.Random(os.urandom(32))


def before(prefix: str) -> str:  # the generator ids came from until issue 34
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{_rng.getrandbits(80):020x}"


def urandom_each(prefix: str) -> str:
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def uuid4(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def ns_per_id(make, ids: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter_ns()
        for _ in range(ids):
            make("resp_")
        best = min(best, (time.perf_counter_ns() - started) / ids)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = harness.parse(parser, out=False)
    for name, make in [
        ("before: random.Random", before),
        ("os.urandom per id", urandom_each),
        ("uuid.uuid4()", uuid4),
        ("after: new_id (buffered os.urandom)", new_id),
    ]:
        print(f"{name:38} {ns_per_id(make, args.ids, args.repeat):7.0f} ns per id")


if __name__ == "__main__":
    main()
