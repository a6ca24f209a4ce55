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

Then, with `--load-seconds`, every server takes single-turn chat requests from two
clients of its own at once for that long: answered/s, and how fast the lake took them
(exchanges/s from the phase's start until its last answer was in the lake, and the
lake's commits/s: DuckLake snapshots made in that time). `--file` runs that phase alone
against one server on the embedded file, for the side by side. Last, the leader's
take-over: the server that leads is killed with SIGKILL, and the time until another says
it leads is measured; then that one is stopped (SIGINT, giving the lease back) and timed
the same way.

    .venv/bin/python -m bench.collector.lake_servers                  # 2 servers
    .venv/bin/python -m bench.collector.lake_servers --servers 8 --load-seconds 20
    .venv/bin/python -m bench.collector.lake_servers --file --load-seconds 20
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
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


def load(urls: list[str], seconds: float) -> list[str]:
    """Two clients per server sending single-turn chat requests for `seconds`; the ids
    answered."""
    answered: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(url: str, k: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            n = 0
            while time.monotonic() < stop:
                body = {"model": "agent", "messages": [{"role": "user", "content": f"{k}/{n}"}]}
                reply = http.post("/chat/completions", json=body)
                reply.raise_for_status()
                with lock:
                    answered.append(reply.json()["id"])
                n += 1

    threads = [threading.Thread(target=client, args=(u, k)) for k, u in enumerate(urls + urls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answered


def load_phase(urls: list[str], seconds: float, count) -> dict:
    """`load` and how fast the log took it: `count(since)` gives the rows logged since a
    time and the commits made since then (None for a file)."""
    since = datetime.now(UTC)
    started = time.monotonic()
    answered = load(urls, seconds)
    took = time.monotonic() - started
    while (rows := count(since))[0] < len(answered):
        if time.monotonic() - started > seconds + 120:
            break
        time.sleep(0.1)
    logged_s = time.monotonic() - started
    rows, commits = count(since)
    return {
        "answered": len(answered),
        "answered_per_s": len(answered) / took,
        "logged": rows,
        "logged_per_s": rows / logged_s,
        "logged_s": logged_s,
        "commits": commits,
        "commits_per_s": None if commits is None else commits / logged_s,
    }


def takeover(servers: list[ServerProcess], admin: dict) -> dict:
    """Seconds from the leader's SIGKILL until another server leads, then from that one's
    stop (SIGINT, its lease given back) until a third does."""

    def loader(s: ServerProcess) -> str:
        status = httpx.get(f"{s.base}/admin/status", headers=admin, timeout=30).json()
        return status["collector"]["loader"] or ""

    def leader(alive: list[ServerProcess]) -> ServerProcess:
        return next(s for s in alive if "leads the DuckLake" in loader(s))

    def next_leader(alive: list[ServerProcess], since: float) -> float:
        while True:
            for s in alive:
                if "leads the DuckLake" in loader(s):
                    return time.monotonic() - since
            time.sleep(0.1)

    alive = list(servers)
    first = leader(alive)
    alive.remove(first)
    started = time.monotonic()
    first.kill()
    killed_s = next_leader(alive, started)
    second = leader(alive)
    alive.remove(second)
    started = time.monotonic()
    second.stop()
    stopped_s = next_leader(alive, started)
    return {"after_sigkill_s": killed_s, "after_stop_s": stopped_s}


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
    parser.add_argument(
        "--load-seconds", type=float, default=0, help="the load phase's length (0: none)"
    )
    parser.add_argument(
        "--file", action="store_true", help="the load phase alone, one server on a file"
    )
    args = harness.parse(parser)
    if args.file:
        return _file(args)
    work = Path(tempfile.mkdtemp(prefix="onjob-lake-servers-"))
    port = procs.free_port()
    engine = procs.start(procs.fake_engine_cmd(port), port, ready="/v1/models")
    servers: list[ServerProcess] = []
    phase = moves = None
    try:
        with Postgres() as postgres:
            catalog, data = postgres.database("servers"), work / "data"
            env = {
                **ENV,
                "ONJOB_COLLECTOR__CATALOG": catalog,
                "ONJOB_COLLECTOR__DATA_PATH": str(data),
            }
            for n in range(args.servers):
                db = str(work / f"s{n}.duckdb")
                args_ = ["--engine-url", f"http://127.0.0.1:{port}/v1", "--db", db]
                servers.append(ServerProcess(args_, env=env, log=work / f"s{n}.log").start())
            latency, ids = traffic([s.url for s in servers], args.conversations, args.turns)
            reader = duckdb.connect()
            lake.attach(reader, catalog, str(data), read_only=True)
            if args.load_seconds:
                phase = load_phase([s.url for s in servers], args.load_seconds, _lake_count(reader))
            if args.servers >= 3:
                moves = takeover(servers, ADMIN)
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
            reader.close()
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
    if phase:
        _say(phase, f"{args.servers} servers into one lake")
    if moves:
        print(
            f"the lead moved {moves['after_sigkill_s']:.1f} s after the leader's SIGKILL, "
            f"{moves['after_stop_s']:.1f} s after the next one's stop"
        )
    settings = {
        "servers": args.servers,
        "conversations": args.conversations,
        "turns": args.turns,
        "load_seconds": args.load_seconds,
    }
    fields = {"settings": settings, "latency": latency, "lake": held, "load": phase}
    harness.save("lake_servers", fields | {"takeover": moves}, args.out)
    whole_all = held["conversations_whole"] == held["chains_whole"] == held["conversations"]
    return 0 if whole_all else 1


ADMIN_KEY = "adm-bench-lake"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
ENV = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__ADMIN_KEY": ADMIN_KEY}


def _lake_count(reader: duckdb.DuckDBPyConnection):
    def count(since: datetime) -> tuple[int, int]:
        rows = reader.execute("SELECT count(*) FROM exchanges WHERE ts >= ?", [since]).fetchone()[0]
        commits = reader.execute(
            f"SELECT count(*) FROM ducklake_snapshots('{lake.NAME}') WHERE snapshot_time >= ?",
            [since],
        ).fetchone()[0]
        return rows, commits

    return count


def _say(phase: dict, what: str) -> None:
    commits = (
        f", {phase['commits_per_s']:.1f} commits/s" if phase["commits_per_s"] is not None else ""
    )
    print(
        f"{what}: {phase['answered_per_s']:.0f} answered/s ({phase['answered']}), "
        f"{phase['logged_per_s']:.0f} logged/s ({phase['logged']} in "
        f"{phase['logged_s']:.1f} s){commits}"
    )


def _file(args: argparse.Namespace) -> int:
    """The load phase against one server on the embedded file."""
    work = Path(tempfile.mkdtemp(prefix="onjob-lake-servers-"))
    port = procs.free_port()
    engine = procs.start(procs.fake_engine_cmd(port), port, ready="/v1/models")
    db = work / "f.duckdb"
    args_ = ["--engine-url", f"http://127.0.0.1:{port}/v1", "--db", str(db)]
    try:
        with ServerProcess(args_, env=ENV, log=work / "f.log") as server:

            def count(since: datetime) -> tuple[int, None]:
                asked = httpx.post(
                    f"{server.base}/admin/sql",
                    json={
                        "query": f"SELECT count(*) FROM exchanges WHERE ts >= '{since.isoformat()}'"
                    },
                    headers=ADMIN,
                    timeout=60,
                )
                asked.raise_for_status()
                return asked.json()["rows"][0][0], None

            phase = load_phase([server.url], args.load_seconds or 20, count)
    finally:
        engine.kill()
        shutil.rmtree(work, ignore_errors=True)
    _say(phase, "one server into the file")
    settings = {"file": True, "load_seconds": args.load_seconds or 20}
    harness.save("lake_servers", {"settings": settings, "load": phase}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
