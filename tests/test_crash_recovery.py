"""`onjob serve` killed with SIGKILL in the middle of sustained load, then restarted on the
same database and spool, twice: every answer a client received before a kill (a whole
completion, or a stream that reached [DONE]) is in DuckDB afterwards, exactly once.

Real processes on loopback: `onjob.testing.faulty_upstream` with no faults as the engine, 16
concurrent clients, half of them streaming. The loader runs every second, so at each kill
part of the traffic is in DuckDB and part only in the spool. ONJOB_CRASH_CYCLES sets
how many kills (2 here, ~6 s of load each).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections import Counter
from pathlib import Path

from onjob.cli.process import ServerProcess, free_port
from onjob.testing import faults
from onjob.testing.faulty_upstream import FaultyEngine

CYCLES = int(os.environ.get("ONJOB_CRASH_CYCLES", "2"))


async def load_until_killed(server: ServerProcess, kill_after: float, cycle: int):
    """Clients load the server; after `kill_after` seconds it gets SIGKILL mid-load."""
    stop = asyncio.Event()
    loading = asyncio.create_task(
        faults.load(
            server.base,
            seconds=kill_after + 30,
            concurrency=16,
            stop=stop,
            seed=cycle,
            prefix=f"c{cycle}",
        )
    )
    await asyncio.sleep(kill_after)
    await asyncio.to_thread(server.kill)
    stop.set()
    return await loading


def replayed(log: Path) -> int:
    """How many exchanges the server loaded from a previous run's spool when it started."""
    found = re.search(r"replayed (\d+) exchanges", log.read_text())
    return int(found.group(1)) if found else 0


def test_every_answer_received_before_sigkill_is_in_duckdb_after_restart(tmp_path):
    db = tmp_path / "onjob.duckdb"
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_COLLECTOR__FLUSH_INTERVAL_S": "1"}
    rng = random.Random(8)
    received: list[str] = []
    outcomes: Counter = Counter()
    replays: list[int] = []
    with FaultyEngine(free_port(), ["--fault-rate", "0", "--adapter-fault-rate", "0"]) as engine:
        args = ["--engine-url", engine.url, "--db", str(db)]
        for cycle in range(CYCLES):
            log = tmp_path / f"serve-{cycle}.log"
            server = ServerProcess(args, env=env, log=log).start()
            answers = asyncio.run(load_until_killed(server, rng.uniform(4, 6), cycle))
            replays.append(replayed(log))
            received += [a.exchange_id for a in answers if a.kind == "ok"]
            outcomes.update(f"{a.kind} {a.status}" for a in answers)
        last = tmp_path / "serve-last.log"
        with ServerProcess(args, env=env, log=last):
            pass  # starting replays the spool; a clean stop loads the rest
        replays.append(replayed(last))
    rows = faults.exchanges(db)
    missing = [i for i in received if i not in rows]
    print(
        f"{CYCLES} kills: {dict(outcomes)}; {len(received)} answers received, "
        f"{len(missing)} missing; {len(rows)} exchanges in DuckDB; replayed at each start: "
        f"{replays}"
    )
    assert len(received) > 200 * CYCLES
    assert outcomes["transport None"] > 0, "the kills should have caught requests in flight"
    assert set(outcomes) <= {"ok 200", "transport None"}
    assert sum(replays[1:]) > 0, "some answered exchanges should have been only in the spool"
    assert missing == []
    assert len(set(received)) == len(received)
    assert all(rows[i]["status"] == 200 for i in received)
