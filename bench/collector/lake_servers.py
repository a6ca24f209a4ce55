"""Servers writing one DuckLake, a conversation's turns spread over them: what an agent
behind a round-robin load balancer sees, and what the lake holds after (issue 65's many
hosts, on one machine).

`--servers` `onjob serve`s share one lake (its catalog a throwaway Postgres cluster, its
files in a directory) and one fast fake engine (`onjob.testing.fake_upstream`). An
`openai` agent runs `--conversations` conversations of `--turns` turns, each turn sent to
the next server the moment the last one answered; then as many Responses chains, each
call to the next server with the previous `previous_response_id`, and feedback on each
chat answer sent to the server after the one that gave it. Reported: each kind of
request's latency (p50, p99; a chained call or feedback naming another server's answer
waits until that server's load is committed: the lag), and what the lake holds once
every server has loaded: conversations whole (every turn in one trajectory, in order),
Responses chains whole, feedback rows.

    .venv/bin/python -m bench.collector.lake_servers                  # 2 servers
    .venv/bin/python -m bench.collector.lake_servers --servers 3 --conversations 60
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import httpx
from openai import OpenAI

from bench import harness
from bench.harness import procs
from onjob.cli.process import ServerProcess
from onjob.collector import lake
from onjob.testing.postgres import Postgres


def _ms(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def traffic(urls: list[str], conversations: int, turns: int) -> tuple[dict, dict]:
    """The agent's requests, round robin over `urls`; their latencies by kind, and the ids
    to look for in the lake."""
    clients = [OpenAI(base_url=u, api_key="unused", max_retries=0, timeout=60) for u in urls]
    n = len(clients)
    took: dict[str, list[float]] = {"chat": [], "chained": [], "unchained": [], "feedback": []}
    chats, chains, answers = [], [], []
    k = 0
    for c in range(conversations):
        messages = [{"role": "user", "content": f"Conversation {c}: where do we start?"}]
        ids = []
        for t in range(turns):
            started = time.perf_counter()
            reply = clients[k % n].chat.completions.create(model="agent", messages=messages)
            took["chat"].append(time.perf_counter() - started)
            ids.append(reply.id)
            answers.append((k % n, reply.id))
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"And after step {t + 1}?"},
            ]
            k += 1
        chats.append(ids)
    for c in range(conversations):
        previous, ids = None, []
        for t in range(turns):
            started = time.perf_counter()
            r = clients[k % n].responses.create(
                model="agent", input=f"Chain {c}, step {t}.", previous_response_id=previous
            )
            took["chained" if previous else "unchained"].append(time.perf_counter() - started)
            ids.append(r.id)
            previous = r.id
            k += 1
        chains.append(ids)
    for i, (server, exchange_id) in enumerate(answers):
        other = urls[(server + 1) % n]
        started = time.perf_counter()
        answer = httpx.post(
            f"{other}/feedback", json={"exchange_id": exchange_id, "value": i % 2}, timeout=60
        )
        answer.raise_for_status()
        took["feedback"].append(time.perf_counter() - started)
    return {kind: _ms(s) for kind, s in took.items() if s}, {"chats": chats, "chains": chains}


def whole(con: duckdb.DuckDBPyConnection, conversations: list[list[str]]) -> int:
    """How many of these conversations (their exchange ids in turn order) the lake holds as
    one trajectory, turns 0, 1, 2, ... in order."""
    rows = dict(
        (i, (t, turn))
        for i, t, turn in con.execute(
            "SELECT id, trajectory_id, turn FROM exchanges WHERE list_contains(?, id)",
            [[i for ids in conversations for i in ids]],
        ).fetchall()
    )
    return sum(
        all(i in rows for i in ids)
        and len({rows[i][0] for i in ids}) == 1
        and [rows[i][1] for i in ids] == list(range(len(ids)))
        for ids in conversations
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=30)
    parser.add_argument("--turns", type=int, default=4)
    args = harness.parse(parser)
    work = Path(tempfile.mkdtemp(prefix="onjob-lake-servers-"))
    port = procs.free_port()
    engine = procs.start(procs.fake_engine_cmd(port), port, ready="/v1/models")
    servers: list[ServerProcess] = []
    try:
        with Postgres() as postgres:
            catalog, data = postgres.database("servers"), work / "data"
            env = {
                "ONJOB_LOOP__INTERVAL_S": "0",
                "ONJOB_COLLECTOR__CATALOG": catalog,
                "ONJOB_COLLECTOR__DATA_PATH": str(data),
            }
            for n in range(args.servers):
                db = str(work / f"s{n}.duckdb")
                args_ = ["--engine-url", f"http://127.0.0.1:{port}/v1", "--db", db]
                servers.append(ServerProcess(args_, env=env, log=work / f"s{n}.log").start())
            latency, ids = traffic([s.url for s in servers], args.conversations, args.turns)
            for s in servers:  # each loads what its spool holds as it stops
                s.stop()
            con = duckdb.connect()
            lake.attach(con, catalog, str(data), read_only=True)
            held = {
                "conversations_whole": whole(con, ids["chats"]),
                "chains_whole": whole(con, ids["chains"]),
                "conversations": len(ids["chats"]),
                "feedback_rows": con.execute("SELECT count(*) FROM feedback").fetchone()[0],
            }
            con.close()
    finally:
        for s in servers:
            s.stop()
        engine.kill()
        shutil.rmtree(work, ignore_errors=True)
    for kind, m in latency.items():
        print(f"{kind}: p50 {m['p50_ms']:.0f} ms, p99 {m['p99_ms']:.0f} ms ({m['n']} requests)")
    print(
        f"in the lake: {held['conversations_whole']} of {held['conversations']} conversations "
        f"whole, {held['chains_whole']} of {held['conversations']} chains whole, "
        f"{held['feedback_rows']} feedback rows"
    )
    settings = {"servers": args.servers, "conversations": args.conversations, "turns": args.turns}
    harness.save("lake_servers", {"settings": settings, "latency": latency, "lake": held}, args.out)
    whole_all = held["conversations_whole"] == held["chains_whole"] == held["conversations"]
    return 0 if whole_all else 1


if __name__ == "__main__":
    sys.exit(main())
