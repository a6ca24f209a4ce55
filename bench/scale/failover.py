"""How long loading stops when the loader dies: two `onjob serve` servers on one bucket
(moto's S3 server), at `collector.host_lease_s` (30 s by default); the one holding the
loader's lease (`collector/lease.py`) is killed with SIGKILL while an agent keeps
sending to the standby, and the clock runs until the standby loads.

Reported, per repeat: the seconds from the kill until the standby holds the lease
(expected: the rest of the dead loader's lease on the bucket's clock, plus up to a
third of a lease until the standby's next try), and until the first exchange answered
after the kill is in the new loader's database (it first restores the dead loader's
copy of its database and the segments it archived since: `collector/snapshots.py`). And
for a clean stop (SIGINT), the same: the lease is given back, and the standby takes it at
its next try.

    .venv/bin/python -m bench.scale.failover                 # ~3 minutes at the default lease
    .venv/bin/python -m bench.scale.failover --lease 6 --repeats 3

Writes bench/results/failover-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench import harness
from bench.proxy import proxy_overhead
from bench.scale import handoff

ADMIN = "bench-admin"


def serve(name: str, work: Path, engine_port: int, bucket: str, endpoint: str, lease: float):
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__ADMIN_KEY": ADMIN,
        "ONJOB_COLLECTOR__BUCKET": bucket,
        "ONJOB_COLLECTOR__BUCKET_ENDPOINT_URL": endpoint,
        "ONJOB_COLLECTOR__HOST_ID": name,
        "ONJOB_COLLECTOR__HOST_LEASE_S": str(lease),
    }
    (work / name).mkdir()
    return proxy_overhead.proxy(engine_port, work / name / "onjob.duckdb", 0, **env)


def loader(port: int) -> str:
    as_admin = {"Authorization": f"Bearer {ADMIN}"}  # `/health`'s counters are its alone
    health = httpx.get(f"http://127.0.0.1:{port}/health", headers=as_admin, timeout=30)
    return health.json()["collector"]["loader"]


def holds(port: int, exchange: str) -> bool:
    answer = httpx.post(
        f"http://127.0.0.1:{port}/admin/sql",
        json={"query": f"SELECT count(*) FROM exchanges WHERE id = '{exchange}'"},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=60,
    )
    return answer.status_code == 200 and answer.json()["rows"] == [[1]]


def ask(port: int, i: int) -> str:
    answer = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": "agent", "messages": [{"role": "user", "content": f"q{i}"}]},
        headers={"Authorization": "Bearer bench"},
        timeout=60,
    )
    return answer.json()["id"]


def one(how: signal.Signals, work: Path, engine_port: int, endpoint: str, lease: float) -> dict:
    bucket = f"s3://failover-{os.getpid()}-{time.monotonic_ns()}/onjob"
    httpx.put(f"{endpoint}/{bucket.removeprefix('s3://').split('/')[0]}")  # moto: a new bucket
    first, p1 = serve("first", work, engine_port, bucket, endpoint, lease)
    deadline = time.monotonic() + 60
    while not loader(p1).startswith("this server"):
        assert time.monotonic() < deadline, "the first server never took the lease"
        time.sleep(0.1)
    second, p2 = serve("second", work, engine_port, bucket, endpoint, lease)
    try:
        assert loader(p2).startswith("standby"), loader(p2)
        time.sleep(lease / 2)  # mid-lease, as a death would come
        killed = time.monotonic()
        first.send_signal(how)
        first.wait()
        asked = ask(p2, 0)
        took_lease = took_load = None
        i = 1
        while took_load is None:
            now = time.monotonic() - killed
            assert now < 4 * lease + 60, "the standby never took over"
            if took_lease is None and loader(p2).startswith("this server"):
                took_lease = now
            if took_lease is not None and holds(p2, asked):
                took_load = time.monotonic() - killed
            ask(p2, i)  # the agent goes on meanwhile
            i += 1
            time.sleep(0.1)
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=30)
    return {"stop": how.name, "lease_s": round(took_lease, 2), "loaded_s": round(took_load, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lease", type=float, default=30.0, help="host_lease_s (30)")
    parser.add_argument("--repeats", type=int, default=2, help="kills, then clean stops (2)")
    args = harness.parse(parser)
    moto, endpoint = handoff.moto()
    engine, engine_port = proxy_overhead.fake_engine(core=1)
    rows = []
    try:
        for how in (signal.SIGKILL, signal.SIGINT):
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as tmp:
                    row = one(how, Path(tmp), engine_port, endpoint, args.lease)
                print(
                    f"{row['stop']:7s}: the standby held the lease {row['lease_s']:6.1f} s "
                    f"after, loaded {row['loaded_s']:6.1f} s after"
                )
                rows.append(row)
    finally:
        for proc in (engine, moto):
            proc.terminate()
            proc.wait()
    summary = {
        how: statistics.median(r["loaded_s"] for r in rows if r["stop"] == how)
        for how in ("SIGKILL", "SIGINT")
    }
    print(f"median seconds without loading: {summary}")
    fields = {"args": vars(args), "rows": rows, "median_loaded_s": summary}
    harness.save("failover", fields, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
