"""Load with faults: every client gets a well-formed answer or an OpenAI-shaped error, and
nothing answered is missing from DuckDB.

`onjob serve` (a canary on `agent`, a short `proxy.read_timeout_s`) in front of
`onjob.testing.faulty_upstream`, whose base model and (more often) whose canary adapter answer
500s, stall past the read timeout, drop connections and cut answers short; concurrent
clients send a mix of streamed and whole requests, each its own conversation; part-way
through, the engine is killed and restarted under the load. Counted and checked:

- every answer: a chat completion (200, the exchange id as its id), an OpenAI-shaped
  error (4xx/5xx, `{"error": {...}}`), or a stream that ends with `[DONE]` or an error
  event; never a dropped connection or anything else;
- `/health` polled throughout answers every time: 200, or 503 ("engine down") between
  the kill and a moment after the restart; and the server is up at the end;
- a conversation that hashes to the canary but was answered by live has the canary's
  failed attempt in DuckDB, and every failed canary attempt the client never saw was
  retried on live (the same trajectory and turn);
- after a clean stop, every exchange id a client received is in `exchanges`, with the
  status and arm the client saw; the server's log holds no traceback.

`run(workdir, parser().parse_args([...]))` runs the scenario and returns the report;
`violations(report)` names every check that found something. The bench
(`python -m bench.proxy.faults --minutes 5`) runs it for minutes and writes
bench/results/faults-<timestamp>.json; tests/test_faults_under_load.py runs it for ~15 s.
The helpers here (`chat`, `load`, `exchanges`) drive the crash test and the soak too.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict
from urllib.request import urlopen

import aiohttp
import duckdb

from onjob.cli.process import ServerProcess, free_port
from onjob.proxy.routing import canary_share
from onjob.testing.faulty_upstream import FaultyEngine

CANARY = "canary-a"


@dataclass
class Answer:
    """What one client request got. `kind`: ok (a completion, or a stream that reached
    [DONE]), error (an OpenAI error body), stream_error (a stream that ended with an error
    event), transport (no HTTP answer at all), malformed (anything else)."""

    trajectory: str
    stream: bool
    started: float
    ended: float
    kind: str
    status: int | None = None  # HTTP status; for stream_error, the error event's code
    exchange_id: str | None = None
    arm: str | None = None
    detail: str = ""
    reply: str | None = None  # the assistant's text, when ok


def _error_shaped(body: object) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
    )


def _classify_stream(data: bytes, answer: Answer) -> None:
    payloads = [
        event[6:] for event in data.split(b"\n\n") if event.strip() and event[:6] == b"data: "
    ]
    if not payloads:
        answer.detail = f"a stream with no events: {data[:200]!r}"
        return
    *events, last = payloads
    text = []
    for payload in events:
        chunk = json.loads(payload)
        if chunk.get("id") != answer.exchange_id or not isinstance(chunk.get("choices"), list):
            answer.detail = f"a stream event not of this exchange: {payload[:200]!r}"
            return
        text += [(c.get("delta") or {}).get("content") or "" for c in chunk["choices"]]
    if last == b"[DONE]":
        answer.kind, answer.reply = "ok", "".join(text)
        return
    error = json.loads(last)
    if _error_shaped(error) and isinstance(error["error"].get("code"), int):
        answer.kind, answer.status = "stream_error", error["error"]["code"]
        answer.detail = error["error"]["message"][:200]
        return
    answer.detail = f"a stream that ends with neither [DONE] nor an error: {last[:200]!r}"


async def chat(
    session: aiohttp.ClientSession,
    base: str,
    *,
    stream: bool,
    trajectory: str,
    messages: list[dict] | None = None,
    explicit: bool = True,
    model: str = "agent",
) -> Answer:
    """One request through the proxy at `base` (http://host:port), its answer classified.
    `explicit`: name the trajectory in `X-Onjob-Trajectory`; else the proxy finds it by the
    messages (the conversation's earlier turns)."""
    body = {
        "model": model,
        "messages": messages or [{"role": "user", "content": f"question of {trajectory}"}],
        "max_tokens": 20,
        "stream": stream,
    }
    started = time.monotonic()
    answer = Answer(trajectory, stream, started, started, "malformed")
    try:
        async with session.post(
            f"{base}/v1/chat/completions",
            json=body,
            headers={"X-Onjob-Trajectory": trajectory} if explicit else None,
        ) as resp:
            data = await resp.read()
            answer.status = resp.status
            answer.exchange_id = resp.headers.get("X-Onjob-Exchange-Id")
            answer.arm = resp.headers.get("X-Onjob-Arm")
            event_stream = resp.headers.get("Content-Type", "").startswith("text/event-stream")
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        answer.kind, answer.detail = "transport", repr(exc)
        answer.ended = time.monotonic()
        return answer
    answer.ended = time.monotonic()
    try:
        if resp.status == 200 and stream and event_stream:
            _classify_stream(data, answer)
        elif resp.status == 200 and not stream:
            reply = json.loads(data)
            ok = reply.get("object") == "chat.completion" and reply.get("id") == answer.exchange_id
            choices = reply.get("choices")
            if ok and choices and all(isinstance(c.get("message"), dict) for c in choices):
                answer.kind, answer.reply = "ok", choices[0]["message"].get("content") or ""
            else:
                answer.detail = f"not a chat completion: {data[:200]!r}"
        elif resp.status >= 400 and _error_shaped(json.loads(data)):
            answer.kind = "error"
            answer.detail = json.loads(data)["error"]["message"][:200]
        else:
            answer.detail = f"status {resp.status}: {data[:200]!r}"
    except (ValueError, AttributeError) as exc:
        answer.kind, answer.detail = "malformed", f"{exc!r}: {data[:200]!r}"
    return answer


async def load(
    base: str,
    *,
    seconds: float,
    concurrency: int,
    stream_share: float = 0.5,
    stop: asyncio.Event | None = None,
    seed: int = 0,
    prefix: str = "conv",
) -> list[Answer]:
    """`concurrency` clients, each sending the next request when its last is answered, for
    `seconds` or until `stop` is set. Each request is a conversation of its own."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    stop = stop or asyncio.Event()
    answers: list[Answer] = []
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def client(c: int) -> None:
            for n in itertools.count():
                if stop.is_set() or time.monotonic() >= deadline:
                    return
                answers.append(
                    await chat(
                        session,
                        base,
                        stream=rng.random() < stream_share,
                        trajectory=f"{prefix}-{c}-{n}",
                    )
                )

        await asyncio.gather(*(client(c) for c in range(concurrency)))
    return answers


async def poll_health(base: str, stop: asyncio.Event, every: float = 0.2) -> list[dict]:
    """`/health` every `every` seconds until `stop`: its status (None: no answer) and time."""
    polls = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while not stop.is_set():
            started = time.monotonic()
            try:
                async with session.get(f"{base}/health") as resp:
                    await resp.read()
                    status = resp.status
            except (TimeoutError, aiohttp.ClientError, OSError):
                status = None
            polls.append(
                {"status": status, "at": started, "ms": (time.monotonic() - started) * 1000}
            )
            await asyncio.sleep(every)
    return polls


class ExchangeRow(TypedDict):
    """What the checks read of an `exchanges` row."""

    id: str
    trajectory_id: str
    turn: int
    arm: str
    status: int
    error: str | None


class Report(TypedDict, total=False):
    """What a run found, printed and saved as JSON: `check`'s counts (`requests` to `db`),
    then `run`'s `health`, `restart` and `server_log_problems`."""

    requests: int
    requests_per_s: float
    answers: dict[str, int]
    streamed: int
    malformed: list[dict[str, Any]]
    canary: dict[str, Any]
    db: dict[str, Any]
    health: dict[str, Any]
    restart: dict[str, Any]
    server_log_problems: list[str]


def exchanges(db: Path) -> Mapping[str, ExchangeRow]:
    """Every row of `exchanges` by id, from a database no server holds (read-only)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute("SELECT id, trajectory_id, turn, arm, status, error FROM exchanges")
        names = [d[0] for d in cur.description]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}
    finally:
        con.close()


def server_problems(log: Path) -> list[str]:
    """What the server's log says went wrong inside it: each such line with the traceback
    that follows it (up to the next timestamped line), so a failure names its exception."""
    markers = ("Traceback", "Exception in", "request failed", "could not spool")
    problems: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        if any(m in line for m in markers) and not line.startswith("Traceback"):
            problems.append(line)
        elif problems and not re.match(r"\d\d:\d\d:\d\d ", line):
            problems[-1] += "\n" + line  # the traceback of the line before
        elif line.startswith("Traceback"):
            problems.append(line)
    return problems


async def _under_faults(
    base: str, engine: FaultyEngine, args: argparse.Namespace
) -> tuple[list[Answer], list[dict], dict]:
    """The load, /health polled beside it, and the engine killed and restarted part-way."""
    stop_polling = asyncio.Event()
    polling = asyncio.create_task(poll_health(base, stop_polling))
    loading = asyncio.create_task(
        load(base, seconds=args.seconds, concurrency=args.concurrency, seed=args.seed)
    )
    start = time.monotonic()
    await asyncio.sleep(args.seconds * args.restart_at)
    before = await asyncio.to_thread(engine.stats)
    await asyncio.to_thread(engine.kill)
    killed = time.monotonic()
    await asyncio.sleep(args.down_s)
    restarting = time.monotonic()  # the engine may answer before start() sees it has
    await asyncio.to_thread(engine.start)
    up = time.monotonic()
    restart = {
        "killed_at_s": round(killed - start, 3),
        "restarting_at_s": round(restarting - start, 3),
        "up_at_s": round(up - start, 3),
        "engine_fates_before_kill": before,
    }
    answers = await loading
    stop_polling.set()
    polls = await polling
    restart["window"] = (killed, restarting, up)
    return answers, polls, restart


def run(workdir: Path, args: argparse.Namespace) -> Report:
    """The scenario, start to clean stop; returns the counts and every violation found."""
    db, log = workdir / "onjob.duckdb", workdir / "serve.log"
    engine_args = ["--seed", args.seed, "--fault-rate", args.fault_rate]
    engine_args += ["--adapter-fault-rate", args.canary_fault_rate]
    engine_args += ["--stall-s", args.read_timeout * 3]
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__READ_TIMEOUT_S": str(args.read_timeout),
        "ONJOB_PROXY__CANARIES": json.dumps(
            {"agent": {"checkpoint": CANARY, "fraction": args.fraction}}
        ),
    }
    with FaultyEngine(free_port(), engine_args) as engine:
        server = ServerProcess(["--engine-url", engine.url, "--db", str(db)], env=env, log=log)
        with server:
            answers, polls, restart = asyncio.run(_under_faults(server.base, engine, args))
            with urlopen(f"{server.base}/health", timeout=10) as resp:
                up_at_end = resp.status == 200 and server.proc.poll() is None
            restart["engine_fates_after_restart"] = engine.stats()
    rows = exchanges(db)
    report = check(answers, rows, args.fraction)
    killed, restarting, up = restart.pop("window")
    during = Counter(
        f"{a.kind} {a.status}" for a in answers if a.started >= killed and a.ended <= restarting
    )
    restart["ok_after_restart"] = sum(a.kind == "ok" and a.started >= up for a in answers)
    # 503 is /health's answer while the engine is down, until the pool's next check (every
    # proxy.health_interval_s, 1 s) finds it back.
    failed_polls = [
        p
        for p in polls
        if p["status"] != 200 and not (p["status"] == 503 and killed <= p["at"] <= up + 2)
    ]
    for p in polls:
        del p["at"]
    report.update(
        {
            "health": {
                "polls": len(polls),
                "failed": failed_polls,
                "max_ms": round(max(p["ms"] for p in polls), 1),
                "server_up_at_end": up_at_end,
            },
            "restart": {**restart, "answers_while_engine_down": dict(during)},
            "server_log_problems": server_problems(log),
        }
    )
    return report


def check(answers: list[Answer], rows: Mapping[str, ExchangeRow], fraction: float) -> Report:
    """The answers against each other and against DuckDB."""
    by_trajectory: dict[str, list[ExchangeRow]] = {}
    for row in rows.values():
        by_trajectory.setdefault(row["trajectory_id"], []).append(row)
    received = {a.exchange_id for a in answers if a.exchange_id}
    missing, disagree, no_failed_attempt, not_retried = [], [], [], []
    fell_back = Counter()
    for a in answers:
        if a.exchange_id is None:
            continue
        row = rows.get(a.exchange_id)
        if row is None:
            missing.append(asdict(a))
            continue
        if row["status"] != (200 if a.kind == "ok" else a.status) or row["arm"] != a.arm:
            disagree.append({"answer": asdict(a), "row": row})
        if a.arm == "live" and canary_share(a.trajectory, CANARY) < fraction:
            attempts = [
                r
                for r in by_trajectory.get(a.trajectory, [])
                if r["arm"] == "canary" and r["status"] >= 400
            ]
            fell_back[f"{a.kind} {a.status}"] += 1
            if not attempts:
                no_failed_attempt.append(asdict(a))
    for row in rows.values():
        if row["arm"] == "canary" and row["status"] >= 400 and row["id"] not in received:
            live = [
                r
                for r in by_trajectory[row["trajectory_id"]]
                if r["arm"] == "live" and r["turn"] == row["turn"]
            ]
            if not live:
                not_retried.append(row)
    seconds = max(a.ended for a in answers) - min(a.started for a in answers)
    return {
        "requests": len(answers),
        "requests_per_s": round(len(answers) / seconds, 1),
        "answers": dict(Counter(f"{a.kind} {a.status}" for a in answers).most_common()),
        "streamed": sum(a.stream for a in answers),
        "malformed": [asdict(a) for a in answers if a.kind in ("malformed", "transport")],
        "canary": {
            "conversations_in_canary_share": sum(
                canary_share(a.trajectory, CANARY) < fraction for a in answers
            ),
            "answered_by_canary": sum(a.arm == "canary" for a in answers),
            "fell_back_to_live": dict(fell_back),
            "fallbacks_without_a_failed_canary_row": no_failed_attempt,
            "failed_canary_attempts_not_retried_on_live": not_retried,
        },
        "db": {
            "rows": len(rows),
            "rows_by_arm_and_status": {
                f"{arm} {status}": n
                for (arm, status), n in sorted(
                    Counter((r["arm"], r["status"]) for r in rows.values()).items()
                )
            },
            "exchange_ids_received": len(received),
            "received_ok": sum(a.kind == "ok" for a in answers),
            "missing": missing,
            "status_or_arm_disagrees": disagree,
        },
    }


def violations(report: Report) -> Mapping[str, list]:
    """Every check that found something, by name (empty: all held)."""
    found = {
        "malformed answers": report["malformed"],
        "failed /health polls": report["health"]["failed"],
        "received exchanges missing from DuckDB": report["db"]["missing"],
        "rows that disagree with the answer": report["db"]["status_or_arm_disagrees"],
        "fallbacks without a failed canary row": report["canary"][
            "fallbacks_without_a_failed_canary_row"
        ],
        "failed canary attempts not retried": report["canary"][
            "failed_canary_attempts_not_retried_on_live"
        ],
        "server log problems": report["server_log_problems"],
    }
    if not report["health"]["server_up_at_end"]:
        found["server down at the end"] = [True]
    return {name: items for name, items in found.items() if items}


def parser() -> argparse.ArgumentParser:
    """The scenario's options (the bench adds `--minutes` and `--out`)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--fraction", type=float, default=0.5, help="the canary's share")
    p.add_argument("--fault-rate", type=float, default=0.15, help="base model's faulty share")
    p.add_argument("--canary-fault-rate", type=float, default=0.6, help="the canary's")
    p.add_argument("--read-timeout", type=float, default=1.0, help="proxy.read_timeout_s")
    p.add_argument("--restart-at", type=float, default=0.4, help="engine kill, share of the run")
    p.add_argument("--down-s", type=float, default=1.0, help="engine down for this long")
    p.add_argument("--seed", type=int, default=0)
    return p
