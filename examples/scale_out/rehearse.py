"""A rehearsal of onjob beyond one host, on one machine, in one command:

    python -m examples.scale_out.rehearse                 # two local engines (SmolLM2-135M)
    python -m examples.scale_out.rehearse --engine fake   # canned answers, no model

It starts an S3 API server (moto's), two engines, the primary (the one loader, with the
Parquet export on) and two proxy "hosts" with spool directories of their own, all
sharing nothing but the bucket. A client then holds conversations whose turns alternate
between the two hosts; halfway, host b answers a conversation alone and is killed with
SIGKILL while its segment holds those answers, a conversation on host a loads once b's
lease runs out, b starts again on its spool, and the last conversations alternate again. At the end
it checks, and prints, that every answered exchange is in DuckDB exactly once, that
every conversation is one trajectory with its turns in order, and that the Parquet
export in the bucket reads back with DuckDB. Exit status 0 when all of that holds.

Needs `pip install 'onjob[s3,demo]' 'moto[server]'` (and `onjob[local]` for the real
engines). Everything runs under a temporary directory (`--dir` to keep it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from onjob.bucket import Bucket
from onjob.cli.process import EngineProcess, ServerProcess, free_port

ADMIN = "rehearsal-admin"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "rehearsal",
    "AWS_SECRET_ACCESS_KEY": "rehearsal",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def ready(url: str, proc: subprocess.Popen, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{what} did not start") from None
            time.sleep(0.05)


def start_s3(stack: contextlib.ExitStack) -> str:
    """moto's S3 API server on a free port: the bucket every part shares."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stack.callback(lambda: (proc.terminate(), proc.wait()))
    url = f"http://127.0.0.1:{port}"
    ready(url, proc, "moto's S3 server")
    return url


def start_engines(kind: str, work: Path, stack: contextlib.ExitStack) -> list[str]:
    urls = []
    for i in range(2):
        if kind == "fake":
            port = free_port()
            cmd = [sys.executable, "-m", "onjob.testing.fake_upstream", "--port", str(port)]
            proc = subprocess.Popen(cmd)
            stack.callback(lambda p=proc: (p.terminate(), p.wait()))
            url = f"http://127.0.0.1:{port}/v1"
            ready(f"{url}/models", proc, "the fake engine")
        else:  # the bundled model, one thread each: the two share the machine's cores
            engine = EngineProcess(
                ["--threads", "1", "--served-model-name", "agent"], log=work / f"engine{i}.log"
            )
            stack.enter_context(engine)
            url = engine.url
        say(f"engine {i}: {url}")
        urls.append(url)
    return urls


def loaded(primary: ServerProcess, sql: str) -> list[list]:
    answer = httpx.post(
        f"{primary.base}/admin/sql",
        json={"query": sql},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=120,
    )
    answer.raise_for_status()
    return answer.json()["rows"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["bundled", "fake"], default="bundled")
    parser.add_argument("--conversations", type=int, default=6, help="at least 4")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--dir", type=Path, help="keep everything here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.conversations < 4:
        parser.error("--conversations must be at least 4")
    from openai import OpenAI  # the demo extra

    work = args.dir or Path(tempfile.mkdtemp(prefix="onjob-rehearsal-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.update(CREDENTIALS)  # moto takes any; the children inherit them
    with contextlib.ExitStack() as stack:
        s3 = start_s3(stack)
        import boto3

        boto3.client("s3", endpoint_url=s3).create_bucket(Bucket="rehearsal")
        bucket_url = "s3://rehearsal/onjob"
        say(f"bucket {bucket_url} on {s3}")
        engines = start_engines(args.engine, work, stack)
        env = {
            "ONJOB_LOOP__INTERVAL_S": "0",  # no training in a rehearsal of the plumbing
            "ONJOB_PROXY__ADMIN_KEY": ADMIN,
            "ONJOB_PROXY__ENGINE_URLS": json.dumps(engines),
            "ONJOB_COLLECTOR__BUCKET": bucket_url,
            "ONJOB_COLLECTOR__BUCKET_ENDPOINT_URL": s3,
            "ONJOB_COLLECTOR__ROTATE_S": "0.5",
            "ONJOB_COLLECTOR__HOST_LEASE_S": "5",
            "ONJOB_COLLECTOR__EXPORT_S": "2",
        }
        for name in ("primary", "a", "b"):
            (work / name).mkdir(exist_ok=True)
        primary = ServerProcess(
            ["--engine-url", engines[0], "--db", str(work / "primary" / "onjob.duckdb")],
            env=env,
            log=work / "primary.log",
        )
        stack.enter_context(primary)
        say(f"primary (the loader): {primary.base}")

        def host(name: str) -> ServerProcess:
            db = str(work / name / "onjob.duckdb")
            return ServerProcess(
                ["--engine-url", engines[0], "--db", db, "--primary", primary.base],
                env={**env, "ONJOB_COLLECTOR__HOST_ID": f"host-{name}"},
                log=work / f"{name}.log",
            )

        hosts = {"a": host("a").start(), "b": host("b").start()}
        for name, h in hosts.items():
            stack.callback(h.stop)
            say(f"host {name}: {h.base} (spool {work / name / 'onjob.duckdb.spool'})")

        answered: list[str] = []
        conversations: list[list[str]] = []

        def converse(c: int, servers: list[ServerProcess]) -> list[str]:
            """One conversation, its turns alternating between `servers`."""
            messages = [
                {"role": "system", "content": "You are a shop's support agent. Answer briefly."},
                {"role": "user", "content": f"Where is my order number {c}?"},
            ]
            ids = []
            for turn in range(args.turns):
                server = servers[(c + turn) % len(servers)]
                client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=300)
                reply = client.chat.completions.create(
                    model="agent", messages=messages, max_tokens=8
                )
                ids.append(reply.id)
                messages += [
                    {"role": "assistant", "content": reply.choices[0].message.content or ""},
                    {"role": "user", "content": f"And then ({turn})?"},
                ]
            conversations.append(ids)
            answered.extend(ids)
            where = "+".join(k for k, h in hosts.items() if h in servers)
            say(f"conversation {c}: {len(ids)} turns on host {where}")
            return ids

        def wait_loaded(ids: list[str]) -> None:
            deadline = time.monotonic() + 120
            while not set(ids) <= {r[0] for r in loaded(primary, "SELECT id FROM exchanges")}:
                if time.monotonic() > deadline:
                    raise SystemExit("the primary did not load what was answered in 120 s")

        half = args.conversations // 2
        for c in range(half):
            converse(c, [hosts["a"], hosts["b"]])
        wait_loaded(answered)
        say("loaded so far: every turn, whichever host answered it")
        converse(half, [hosts["b"]])
        hosts["b"].kill()
        say("host b killed (SIGKILL) with answers in its open segment")
        wait_loaded(converse(half + 1, [hosts["a"]]))
        say("host a's answers loaded though b's watermark went stale: b's lease ran out")
        hosts["b"] = host("b").start()
        stack.callback(hosts["b"].stop)
        say("host b started again on its spool: the segment it had open goes to the bucket")
        for c in range(half + 2, args.conversations):
            converse(c, [hosts["a"], hosts["b"]])

        say("waiting until the primary has loaded every answered exchange")
        wait_loaded(answered)
        have = {r[0] for r in loaded(primary, "SELECT id FROM exchanges")}
        trajectories = loaded(
            primary,
            "SELECT trajectory_id, list(id ORDER BY turn) FROM exchanges GROUP BY 1",
        )
        count = loaded(primary, "SELECT count(*), count(DISTINCT id) FROM exchanges")[0]
        for h in hosts.values():
            h.stop()
        primary.stop()  # its last export round runs at exit

        bucket = Bucket.from_url(bucket_url, endpoint_url=s3)
        for info in bucket.list("exchanges/"):
            bucket.get_file(info.key, work / "export" / info.key)
        import duckdb

        files = str(work / "export" / "exchanges" / "*" / "*.parquet")
        exported = duckdb.sql(
            f"SELECT day, count(*) FROM read_parquet('{files}', hive_partitioning = true) "
            "GROUP BY day ORDER BY day"
        ).fetchall()

    checks = {
        "every answered exchange loaded": set(answered) <= have,
        "each exactly once": count[0] == count[1] == len(answered),
        "each conversation one trajectory, turns in order": sorted(t[1] for t in trajectories)
        == sorted(conversations),
        "the export holds every exchange": sum(n for _, n in exported) == len(answered),
    }
    say(f"answered {len(answered)}; loaded {count[0]}; trajectories {len(trajectories)}")
    say(f"Parquet export by day: {[(str(d), n) for d, n in exported]}")
    for what, ok in checks.items():
        say(f"{'ok  ' if ok else 'FAIL'} {what}")
    say(f"logs and spools in {work}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
