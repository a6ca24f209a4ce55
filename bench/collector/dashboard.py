"""The dashboard with a million exchanges: how long each page takes to render.

    .venv/bin/python -m bench.collector.dashboard [--exchanges 1000000] [--repeat 5]

Fills a fresh DuckDB file with synthetic multi-turn traffic (few-KB requests, 1,000
scenarios, 4 turns per conversation, the last hour of timestamps, two arms), 10,000
judged groups of 8 members with scores, then starts `onjob serve` on it (no engine:
the dashboard only reads the database) and times every page over HTTP, median of
`--repeat` loads. Writes bench/results/dashboard-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench import harness
from onjob.cli.process import ServerProcess
from onjob.collector import Store

FILL = """
INSERT INTO scenarios
SELECT 'scn_' || i, 'system prompt ' || i, 'keyed', now() - INTERVAL 2 HOUR, 0
FROM range(1000) t(i);

INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, model_alias, checkpoint, arm,
                       stream, request, response, usage, latency_ms, status, source)
SELECT 'ex_' || i,
       now() - to_milliseconds(CAST(random() * 3600000 AS BIGINT)),
       'traj_' || (i // 4), i % 4, 'scn_' || ((i // 4) % 1000), 'agent',
       CASE WHEN i % 10 = 0 THEN 'ckpt-b' ELSE NULL END,
       CASE WHEN i % 10 = 0 THEN 'canary' ELSE 'live' END,
       false,
       json_object('model', 'agent', 'messages', json_array(
           json_object('role', 'system', 'content', repeat('You are a helpful agent. ', 60)),
           json_object('role', 'user', 'content', 'Question number ' || i))),
       json_object('choices', json_array(json_object('index', 0, 'message',
           json_object('role', 'assistant', 'content', repeat('An answer. ', 40))))),
       json_object('prompt_tokens', 350, 'completion_tokens', 80),
       20 + random() * 400,
       CASE WHEN i % 97 = 0 THEN 502 ELSE 200 END,
       'production'
FROM range(?) t(i);

INSERT INTO trajectories
SELECT 'traj_' || j, 'scn_' || (j % 1000), NULL, 'live', 'ex_' || (j * 4), 'ex_' || (j * 4 + 3), 4,
       'production', now() - INTERVAL 1 HOUR, now()
FROM range(? // 4) t(j);

UPDATE scenarios SET count = c.n
FROM (SELECT scenario_id, count(*) AS n FROM exchanges GROUP BY 1) c
WHERE c.scenario_id = scenarios.id;

INSERT INTO groups (id, scenario_id, prefix_exchange, kind, checkpoints, status, created)
SELECT 'group_' || g, 'scn_' || (g % 1000), 'ex_' || (g * 8), 'turn',
       [CASE WHEN g % 3 = 0 THEN 'ckpt-b' ELSE NULL END], 'scored',
       now() - to_milliseconds(CAST(random() * 3600000 AS BIGINT))
FROM range(10000) t(g);

INSERT INTO members (id, group_id, position, exchange_id, choice, trajectory_id, origin)
SELECT 'm_' || g || '_' || p, 'group_' || g, p, 'ex_' || (g * 8 + p), 0,
       'traj_' || ((g * 8 + p) // 4), CASE WHEN p = 0 THEN 'logged' ELSE 'sampled' END
FROM range(10000) t(g), range(8) u(p);

INSERT INTO scores (id, group_id, member_id, source, score, created)
SELECT 's_' || g || '_' || p, 'group_' || g, 'm_' || g || '_' || p, 'combined', random(), now()
FROM range(10000) t(g), range(8) u(p);
"""

PAGES = [
    "/dashboard",
    "/dashboard?minutes=1440",
    "/dashboard/scenarios",
    "/dashboard/scenarios?page=10",
    "/dashboard/groups",
    "/dashboard/groups?page=100",
    "/dashboard/groups/group_42",
    "/dashboard/trajectories/traj_42",
    "/dashboard/learning",
    "/dashboard/ab",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchanges", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = harness.parse(parser)
    db = Path(tempfile.mkdtemp(prefix="onjob-dashboard-")) / "onjob.duckdb"
    started = time.perf_counter()
    store = Store(db)
    for statement in filter(str.strip, FILL.split(";\n")):
        store.con.execute(statement, [args.exchanges] * statement.count("?"))
    store.close()
    fill_s = time.perf_counter() - started
    size_mb = db.stat().st_size / 1e6
    print(f"filled {db} with {args.exchanges:,} exchanges in {fill_s:.0f} s ({size_mb:.0f} MB)")
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__ADMIN_KEY": "bench-admin"}
    timings = {}
    server = ServerProcess(["--db", str(db), "--engine-url", "http://127.0.0.1:9/v1"], env=env)
    admin = {"Authorization": "Bearer bench-admin"}
    with server, httpx.Client(base_url=server.base, headers=admin, timeout=120) as client:
        for path in PAGES:
            took = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                reply = client.get(path)
                took.append((time.perf_counter() - t0) * 1000)
                assert reply.status_code == 200, (path, reply.status_code, reply.text[:300])
            timings[path] = {"median_ms": statistics.median(took), "max_ms": max(took)}
            t = timings[path]
            print(f"{path:36s} median {t['median_ms']:7.0f} ms, max {t['max_ms']:7.0f} ms")
    result = {"exchanges": args.exchanges, "db_mb": size_mb, "fill_s": fill_s, "pages": timings}
    harness.save("dashboard", result, args.out)


if __name__ == "__main__":
    main()
