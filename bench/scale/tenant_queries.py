"""What keeping tenants apart costs the judge's queries on a large database.

Builds a synthetic DuckDB file (N exchanges in two-turn conversations of 5 API keys, all
but 200 conversations already in a trajectory group, one turn group to score) and prints
the CPU time, best of 8, of: the trajectory-group candidates with no API key (as before
groups were one key's) and per key with an untrained key left out; and a group's members
(`members_of`) beside the separate look-up of whose they are (`owners`).

    python -m bench.scale.tenant_queries --exchanges 1000000 --db /tmp/tenants.duckdb
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench import harness
from onjob.collector import Store
from onjob.judge import JudgeSettings, tables

NO_KEY = """
SELECT t.id, t.scenario_id, t.last_exchange FROM trajectories t
WHERE t.source = 'production' AND t.last_ts < now() - to_seconds(CAST(? AS DOUBLE))
  AND NOT coalesce(list_contains(?::VARCHAR[], t.scenario_id), false)
  AND NOT EXISTS (
      SELECT 1 FROM members m JOIN groups g ON g.id = m.group_id
      WHERE g.kind = 'trajectory' AND m.trajectory_id = t.id)
ORDER BY t.last_ts DESC
"""


def build(db: Path, n: int) -> None:
    store = Store(db)
    con = store.con
    con.execute(
        "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, api_key_id, "
        "model_alias, arm, stream, request, status, source) "
        "SELECT 'x-' || i, now() - INTERVAL 1 HOUR, 't-' || (i // 2), i % 2, "
        "'scn-' || (i % 50), 'key' || (i % 5), 'agent', 'live', false, '{}', 200, "
        f"'production' FROM range({n}) r(i)"
    )
    con.execute(
        "INSERT INTO trajectories (id, scenario_id, first_exchange, last_exchange, n_turns, "
        "source, first_ts, last_ts) SELECT 't-' || j, 'scn-' || ((2 * j) % 50), "
        "'x-' || (2 * j), 'x-' || (2 * j + 1), 2, 'production', now() - INTERVAL 1 HOUR, "
        f"now() - INTERVAL 1 HOUR FROM range({n // 2}) r(j)"
    )
    con.execute(
        "INSERT INTO groups (id, scenario_id, kind, checkpoints, status, created) "
        "VALUES ('g', 'scn-0', 'trajectory', [], 'scored', now())"
    )
    con.execute(
        "INSERT INTO members SELECT 'm-' || j, 'g', 0, 'x-' || (2 * j + 1), 0, 't-' || j, "
        f"'production' FROM range({n // 2 - 200}) r(j)"
    )
    con.execute(
        "INSERT INTO groups (id, scenario_id, prefix_exchange, kind, checkpoints, status, "
        "created) VALUES ('gt', 'scn-0', 'x-500', 'turn', [], 'sampled', now())"
    )
    con.execute("INSERT INTO members VALUES ('mt-0', 'gt', 0, 'x-500', 0, 't-250', 'logged')")
    store.close()


def cpu_ms(fn, repeats: int = 8) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path, default=Path("/tmp/onjob-tenant-queries.duckdb"))
    args = harness.parse(parser, out=False)
    if not args.db.exists():
        build(args.db, args.exchanges)
    store = Store(args.db)
    s = JudgeSettings(settle_s=0)
    try:
        figures = {
            "trajectory candidates, no key": cpu_ms(lambda: store.dicts(NO_KEY, [0, []])),
            "trajectory candidates, per key": cpu_ms(
                lambda: tables.scenario_candidates(store, s, [], ["key4"])
            ),
            "members_of, one group": cpu_ms(lambda: tables.members_of(store, "gt")),
            "owners, one group": cpu_ms(lambda: tables.owners(store, ["x-500"])),
        }
    finally:
        store.close()
    print(f"{args.exchanges:,} exchanges ({args.db}), CPU ms, best of 8:")
    for name, ms in figures.items():
        print(f"  {name:32} {ms:8.1f}")


if __name__ == "__main__":
    main()
