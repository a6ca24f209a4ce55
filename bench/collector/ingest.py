"""The collector's ingest rate: exchanges/s from `collector.log()` to rows in DuckDB, the
size on disk per million exchanges, and the process's peak memory.

Synthetic agent traffic takes the proxy's path into the collector: each request's
stitching keys are computed (as `Exchange.open()` computes them), its record filled
as `Exchange.record()` fills it (the request bytes the client sent, the answer it got,
the engine's prompt and completion token ids and float32 logprobs), its reply
hashed as a continuation, and the record handed to `collector.log()`, one append
to the spool. The collector's own loop loads the spool into DuckDB at its default
settings (`--loader-nice` changes the loader's priority), placing each line in its
trajectory as it goes. Traffic: 200 scenarios (a
system prompt and 3-6 tool schemas each), 256 conversations in flight, 1-8 turns of
tool calls and tool results before an answer, sometimes a follow-up question; 1% of
exchanges fail (502) and are retried.

Building records runs in this process and is timed apart. Reported: the append rate
(time inside `log()`), the load rate (the loader thread's CPU time; its waits on the
disk are not in it), and the sustained rate: the wall time from the first `log()`
until the loader has caught up (a last `flush()`), which is bounded by building
records when the loader is the faster side. `--proxy-seconds S` first measures, in the
same run, what one `onjob serve` process answers (bench/proxy/proxy_overhead.py's layout), and
compares the loader's rate per CPU-second with it: both are what one core does.

    .venv/bin/python -m bench.collector.ingest          # 100,000 exchanges, ~1-3 minutes
    .venv/bin/python -m bench.collector.ingest --exchanges 1000000 --loader-nice 0
    .venv/bin/python -m bench.collector.ingest --lake   # into a DuckLake, Postgres catalog

At a million, expect ~10x the default's time, ~8 GB of database and up to ~22 GB of
spool on disk while the loader catches up (in segments of `collector.max_segment_bytes`,
so memory stays bounded; DuckDB's own buffers by `collector.duckdb_memory_limit`).

Writes bench/results/ingest-<timestamp>.json, with the load average before and after:
on a shared machine the rates are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path

import duckdb
import msgspec

from bench import harness
from onjob.collector import Collector, CollectorSettings, ExchangeRecord, Store, extensions
from onjob.collector.ids import new_id
from onjob.collector.linear import stored
from onjob.collector.records import encode, to_json
from onjob.collector.trajectories import Keys, continuations, keys
from onjob.proxy.routing import canary_share
from onjob.testing.postgres import Postgres

SCENARIOS = 200
AGENTS = 256  # conversations in flight at once: a segment holds turns of many
FAILURE_RATE = 0.01
CANARY = "ckpt-20261121-152144-116410"
CANARY_FRACTION = 0.1
EQUAL_QUESTION = 300  # characters of each turn's question in --turns mode
EQUAL_ANSWER = 600  # and of each answer
TOOLS = ["search_orders", "get_customer", "issue_refund", "lookup_docs", "run_sql", "read_file"]


class Traffic:
    """Multi-turn tool-using conversations, recorded as the proxy records them (the loader
    places them).

    Text, token ids and logprobs are slices at random offsets of large random pools, so
    no two exchanges carry the same payload while building one costs little next to
    logging it (the proxy's own shaping is measured by bench/proxy/proxy_overhead.py).
    """

    def __init__(
        self, collector: Collector, seed: int, *, turns: int = 0, linear: bool = True
    ) -> None:
        self.collector = collector
        self.turns = turns  # 0: the agent mix; N: conversations of N equal turns
        self.linear = linear
        self.rng = random.Random(seed)
        syllables = ["ka", "to", "ri", "men", "sol", "da", "vi", "ne", "lo", "par", "us", "ing"]
        words = [
            "".join(self.rng.choices(syllables, k=self.rng.randint(1, 4))) for _ in range(4000)
        ]
        self.corpus = " ".join(self.rng.choices(words, k=1_500_000))  # ~8 MB of "prose"
        # Token ids of a 64k vocabulary; vLLM's logprobs are float32 values, whose shortest
        # JSON form is ~20 characters.
        self.token_pool = array("H", self.rng.randbytes(8_000_000))
        self.logprob_pool = array("f", [-self.rng.expovariate(2.5) for _ in range(1_000_000)])
        self.scenarios = [self._scenario(i) for i in range(SCENARIOS)]
        self.agents = [self._conversation() for _ in range(AGENTS)]
        self.payload = dict.fromkeys(
            [
                "spool_bytes",
                "request_bytes",
                "response_bytes",
                "prompt_tokens",
                "completion_tokens",
                "failed",
            ],
            0,
        )

    def text(self, chars: int) -> str:
        at = self.rng.randrange(len(self.corpus) - chars)
        return self.corpus[at : at + chars]

    def tokens(self, chars: int) -> list[int]:
        n = max(1, chars // 4)
        at = self.rng.randrange(len(self.token_pool) - n)
        return self.token_pool[at : at + n].tolist()

    def logprobs(self, n: int) -> list[float]:
        at = self.rng.randrange(len(self.logprob_pool) - n)
        return self.logprob_pool[at : at + n].tolist()

    def _scenario(self, i: int) -> dict:
        tools = [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": self.text(self.rng.randint(60, 200)),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            arg: {"type": "string", "description": self.text(40)}
                            for arg in ("query", "id", "limit")[: self.rng.randint(1, 3)]
                        },
                        "required": ["query"],
                    },
                },
            }
            for name in self.rng.sample(TOOLS, self.rng.randint(3, 6))
        ]
        system = f"You are agent {i}. " + self.text(self.rng.randint(600, 1800))
        # The chat template renders the system prompt and the tool schemas into the same
        # prompt ids in every conversation of the scenario.
        preamble = self.tokens(len(system) + len(json.dumps(tools)))
        return {"system": system, "tools": tools, "preamble": preamble}

    def _conversation(self) -> dict:
        scenario = self.rng.choice(self.scenarios)
        question = self.text(EQUAL_QUESTION if self.turns else self.rng.randint(80, 600))
        return {
            "scenario": scenario,
            "messages": [
                {"role": "system", "content": scenario["system"]},
                {"role": "user", "content": question},
            ],
            "prompt": scenario["preamble"] + self.tokens(len(question)),
            # turns until the answer (equal turns: N answers, no tools called)
            "left": self.turns or self.rng.choice([1, 2, 2, 3, 3, 4, 4, 5, 6, 8]),
        }

    def _reply(self, conversation: dict) -> dict:
        """The assistant's next message: tool calls while turns are left, then a text answer."""
        if self.turns:
            return {"role": "assistant", "content": self.text(EQUAL_ANSWER)}
        if conversation["left"] > 1:
            names = [t["function"]["name"] for t in conversation["scenario"]["tools"]]
            calls = [
                {
                    "id": new_id("call_")[:29],
                    "type": "function",
                    "function": {
                        "name": self.rng.choice(names),
                        "arguments": json.dumps({"query": self.text(self.rng.randint(20, 120))}),
                    },
                }
                for _ in range(self.rng.choice([1, 1, 1, 2]))
            ]
            thought = self.text(self.rng.randint(40, 300)) if self.rng.random() < 0.5 else None
            return {"role": "assistant", "content": thought, "tool_calls": calls}
        return {"role": "assistant", "content": self.text(self.rng.randint(200, 1200))}

    def next(self) -> ExchangeRecord:
        """One exchange as the proxy's `finish()` hands it to the collector."""
        slot = self.rng.randrange(AGENTS)
        conversation = self.agents[slot]
        messages = list(conversation["messages"])
        body = {
            "model": "agent",
            "messages": messages,
            "tools": conversation["scenario"]["tools"],
            "temperature": 0.7,
            "max_tokens": 1024,
        }
        raw = msgspec.json.encode(body)
        # As `Exchange.open` does: the stitching keys (the loader places the line) and the
        # arm from the conversation's opening.
        k = keys(messages)
        canary = canary_share(f"agents\0{k.opening}", CANARY) < CANARY_FRACTION
        turn = sum(m.get("role") == "assistant" for m in messages)
        exchange_id = new_id("chatcmpl-")
        shared = {
            "id": exchange_id,
            "ts": time.time(),
            "stitch": k.candidates or None,
            "prefix_hash": k.prefix_hash,
            "scenario_key": k.scenario_key,
            "scenario_keyed": k.scenario_keyed,
            "model_alias": "agent",
            "api_key_id": "agents",
            "checkpoint": CANARY if canary else None,
            "arm": "canary" if canary else "live",
            "latency_ms": self.rng.uniform(300, 20_000),  # agents wait seconds for a model
        }
        self.payload["request_bytes"] += len(raw)
        if self.rng.random() < FAILURE_RATE:
            # Logged with its status and no answer; the agent retries the same turn.
            answer = {
                "id": exchange_id,
                "object": "chat.completion",
                "created": 0,
                "model": "agent",
                "choices": [],
                "usage": None,
            }
            record = ExchangeRecord(
                **shared,
                **self._stored(shared, k, body, raw, None, None, []),
                response=to_json(answer),
                status=502,
                error="the engine is unreachable: connection refused",
            )
            self.payload["failed"] += 1
        else:
            reply = self._reply(conversation)
            completion = self.tokens(len(json.dumps(reply)))
            prompt = conversation["prompt"]
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(completion),
                "total_tokens": len(prompt) + len(completion),
            }
            # The answer as the client got it: the engine's, with the exchange id and the
            # alias in, and the token ids and logprobs (which it did not ask for) out.
            answer = msgspec.json.encode(
                {
                    "id": exchange_id,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": "agent",
                    "choices": [
                        {
                            "index": 0,
                            "message": reply,
                            "logprobs": None,
                            "finish_reason": "tool_calls" if "tool_calls" in reply else "stop",
                        }
                    ],
                    "usage": usage,
                }
            )
            hashes = continuations(k.prefix_hash, [reply])
            record = ExchangeRecord(
                **shared,
                **self._stored(shared, k, body, raw, prompt, completion, hashes),
                response=msgspec.Raw(answer),
                completion_token_ids=[completion],
                completion_logprobs=[self.logprobs(len(completion))],
                usage=to_json(usage),
                continuation_hashes=hashes,
            )
            self._advance(slot, reply, completion)
            self.payload["prompt_tokens"] += len(prompt)
            self.payload["completion_tokens"] += len(completion)
        self.payload["response_bytes"] += len(record.response)
        line = len(encode(record)) + 1
        self.payload["spool_bytes"] += line
        if self.turns:
            by_turn = self.payload.setdefault("spool_bytes_by_turn", {})
            by_turn.setdefault(turn, []).append(line)
        return record

    def _stored(
        self,
        shared: dict,
        k: Keys,
        body: dict,
        raw: bytes,
        prompt: list[int] | None,
        completion,
        hashes: list[str],
    ) -> dict:
        """The record's request and prompt fields as `Exchange.record()` stores them: whole,
        or (linear storage) only what this turn adds to its conversation's last one."""
        if not self.linear:
            return {"request": msgspec.Raw(raw), "prompt_token_ids": prompt}
        request, prompt_ids, delta = stored(
            self.collector.lineage,
            keys=k,
            api_key_id="agents",
            continuations=hashes,
            exchange_id=shared["id"],
            request=body,
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            answered=prompt is not None,
        )
        return {
            "request": msgspec.Raw(request or raw),
            "prompt_token_ids": prompt_ids,
            "parent_id": delta.parent_id,
            "messages_kept": delta.messages_kept,
            "prompt_kept": delta.prompt_kept,
            "request_kept": delta.request_kept,
        }

    def _advance(self, slot: int, reply: dict, completion: list[int]) -> None:
        conversation = self.agents[slot]
        messages = conversation["messages"]
        messages.append(reply)
        conversation["prompt"] = conversation["prompt"] + completion
        conversation["left"] -= 1
        if self.turns:  # equal turns: the same size of question and answer each time
            if conversation["left"] == 0:
                self.agents[slot] = self._conversation()
                return
            question = self.text(EQUAL_QUESTION)
            messages.append({"role": "user", "content": question})
            conversation["prompt"] = conversation["prompt"] + self.tokens(len(question))
            return
        for call in reply.get("tool_calls") or ():
            result = self.text(self.rng.randint(150, 1500))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            conversation["prompt"] = conversation["prompt"] + self.tokens(len(result))
        if conversation["left"] == 0:
            if self.rng.random() < 0.3:  # a follow-up question: the conversation goes on
                question = self.text(self.rng.randint(40, 300))
                messages.append({"role": "user", "content": question})
                conversation["prompt"] = conversation["prompt"] + self.tokens(len(question))
                conversation["left"] = self.rng.randint(1, 3)
            else:
                self.agents[slot] = self._conversation()


def thread_cpu_s(tid: int) -> float:
    """CPU seconds (user + system) a thread of this process has used (Linux)."""
    stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def spool_bytes(settings: CollectorSettings) -> int:
    """What the spool holds on disk: logged, not yet in DuckDB (the segment loading included)."""
    total = 0
    for segment in settings.spool.glob("*.jsonl"):
        with contextlib.suppress(FileNotFoundError):  # loaded and deleted meanwhile
            total += segment.stat().st_size
    return total


async def ingest(
    settings: CollectorSettings,
    exchanges: int,
    seed: int,
    progress_s: float,
    *,
    turns: int = 0,
    linear: bool = True,
) -> dict:
    collector = Collector(settings)
    await collector.start()
    loader_tid = await collector.query(lambda _store: threading.get_native_id())
    traffic = Traffic(collector, seed, turns=turns, linear=linear)
    setup_rss = rss_mb()  # the traffic's random pools and the empty collector
    loader_cpu0 = thread_cpu_s(loader_tid)
    build_s = append_s = append_cpu_s = 0.0
    started = last = time.perf_counter()
    samples = []
    logged = 0
    while logged < exchanges:
        batch = min(64, exchanges - logged)
        t0 = time.perf_counter()
        records = [traffic.next() for _ in range(batch)]
        t1, c1 = time.perf_counter(), time.thread_time()
        for record in records:
            collector.log(record)
        t2 = time.perf_counter()
        build_s += t1 - t0
        append_s += t2 - t1
        append_cpu_s += time.thread_time() - c1
        logged += batch
        # The proxy's event loop turns over all the time; this one must too, or the
        # collector's loop could not hand the loader its next segment.
        await asyncio.sleep(0)
        if t2 - last >= progress_s or logged == exchanges:
            last = t2
            sample = {
                "s": round(t2 - started, 2),
                "logged": logged,
                "loaded": collector.loaded,
                "spool_mb": round(spool_bytes(settings) / 1e6, 1),
                "rss_mb": round(rss_mb()),
            }
            samples.append(sample)
            print(
                f"[{sample['s']:6.1f} s] logged {logged:>9,}  loaded {sample['loaded']:>9,}  "
                f"spool {sample['spool_mb']:>8,.1f} MB  RSS {sample['rss_mb']:>6,} MB",
                flush=True,
            )
    logged_at = time.perf_counter()
    # Exchanges not yet committed to DuckDB: `collector.loaded` moves only when a whole
    # flush ends, the spool's bytes as each segment is.
    behind = round(spool_bytes(settings) / (traffic.payload["spool_bytes"] / exchanges))
    rss_logging = peak_rss_mb()
    await collector.flush()  # every closed segment loaded: the loader has caught up
    caught_up = time.perf_counter()
    loader_cpu = thread_cpu_s(loader_tid) - loader_cpu0
    assert collector.loaded == exchanges, (collector.loaded, exchanges)
    await collector.close()
    # Before `size_on_disk`, whose own connection's CHECKPOINT is no part of serving.
    rss_peak = peak_rss_mb()
    print(
        f"[{caught_up - started:6.1f} s] caught up: {exchanges:,} exchanges in DuckDB", flush=True
    )
    return {
        "exchanges": exchanges,
        "payload": traffic.payload,
        "wall_s": caught_up - started,
        "logging_s": logged_at - started,
        "build_records_s": build_s,
        "append_s": append_s,
        "append_cpu_s": append_cpu_s,
        "not_loaded_when_logging_ended": behind,
        "catch_up_s": caught_up - logged_at,
        "loader_cpu_s": loader_cpu,
        "rss_after_setup_mb": setup_rss,
        "peak_rss_while_logging_mb": rss_logging,
        "peak_rss_mb": rss_peak,
        "samples": samples,
    }


def size_on_disk(db: Path) -> tuple[int, int]:
    """(file bytes, bytes in used blocks) after a CHECKPOINT folded the WAL in. The file
    keeps the blocks that rewritten row groups freed (DuckDB reuses them, never returns them)."""
    con = duckdb.connect(str(db))
    con.execute("CHECKPOINT")
    block, used = con.execute(
        "SELECT block_size, used_blocks FROM pragma_database_size()"
    ).fetchone()
    con.close()
    wal = db.with_name(db.name + ".wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0), block * used


def empty_size(directory: Path) -> tuple[int, int]:
    """A migrated database with no rows: the fixed part of the file."""
    db = directory / "empty.duckdb"
    Store(db).close()
    return size_on_disk(db)


def lake_size(postgres: Postgres, database: str, data: Path) -> int:
    """A lake's bytes: its data files, and its catalog's Postgres database."""
    con = duckdb.connect()
    extensions.load(con, "postgres")
    dsn = postgres.dsn.replace("dbname=postgres", f"dbname={database}")
    con.execute(f"ATTACH '{dsn}' AS pg (TYPE postgres, READ_ONLY)")
    (catalog,) = con.execute(
        "SELECT * FROM postgres_query('pg', 'SELECT pg_database_size(current_database())')"
    ).fetchone()
    con.close()
    return int(catalog) + sum(f.stat().st_size for f in data.rglob("*") if f.is_file())


def empty_lake_size(postgres: Postgres, directory: Path) -> int:
    """A lake made with no rows: its fixed part."""
    dsn = postgres.database("empty")
    Store(directory / "empty.duckdb", catalog=dsn, data_path=str(directory / "empty")).close()
    return lake_size(postgres, "empty", directory / "empty")


def proxy_rate(seconds: float, directory: Path) -> dict:
    """Requests/s one `onjob serve` process answers, logging on (bench/proxy/proxy_overhead.py's
    layout: the proxy and a fake engine on one core, the load generator on the other)."""
    import proxy_overhead

    cores = sorted(os.sched_getaffinity(0))
    load_core, server_core = cores[0], cores[-1]
    engine, engine_port = proxy_overhead.fake_engine(server_core)
    server, port = proxy_overhead.proxy(engine_port, directory / "proxy.duckdb", server_core)
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {load_core})
    args = argparse.Namespace(seconds=seconds, warmup=1.0)
    try:
        out = {
            ("stream" if stream else "whole"): proxy_overhead.load(port, "agent", stream, 64, args)
            for stream in (False, True)
        }
    finally:
        os.sched_setaffinity(0, mask)
        for proc in (server, engine):
            proc.terminate()
            proc.wait(timeout=60)
    for mode, point in out.items():
        print(f"one onjob serve process, c64 {mode}: {point['rps']:,.0f} req/s", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--exchanges", type=int, default=100_000, help="exchanges to log (default 100,000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic traffic")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="a fresh folder for the database and its spool, kept after the run (default: a "
        "temporary folder, removed after)",
    )
    parser.add_argument(
        "--loader-nice",
        type=int,
        default=CollectorSettings.model_fields["loader_nice"].default,
        help="collector.loader_nice: the loader's priority below this process's (default 10, "
        "as `onjob serve`; 0 loads at the same priority)",
    )
    parser.add_argument(
        "--duckdb-memory-limit",
        default=CollectorSettings.model_fields["duckdb_memory_limit"].default,
        help="collector.duckdb_memory_limit (default as `onjob serve`)",
    )
    parser.add_argument(
        "--max-segment-bytes",
        type=int,
        default=CollectorSettings.model_fields["max_segment_bytes"].default,
        help="collector.max_segment_bytes: the most one load reads (default as `onjob serve`)",
    )
    parser.add_argument(
        "--flush-interval-s",
        type=float,
        default=CollectorSettings.model_fields["flush_interval_s"].default,
        help="collector.flush_interval_s: how often the loader loads what the spool holds "
        "(default as `onjob serve`)",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=0,
        help="conversations of this many equal turns (a question and an answer of fixed "
        "size, no tools called) instead of the agent mix",
    )
    parser.add_argument(
        "--whole",
        action="store_true",
        help="store every request and prompt whole, as before linear storage (to compare)",
    )
    parser.add_argument(
        "--progress", type=float, default=5.0, help="seconds between progress lines"
    )
    parser.add_argument(
        "--lake",
        action="store_true",
        help="log into a DuckLake (collector.catalog) instead of the file: its catalog a "
        "throwaway Postgres cluster on this machine (Debian's postgresql), its data files "
        "in a directory beside; the size is the files' plus the catalog database's",
    )
    parser.add_argument(
        "--proxy-seconds",
        type=float,
        default=0,
        help="first, in this same run: what one `onjob serve` process answers (fake engine, "
        "c64, this many seconds not streamed and as many streamed; bench/proxy/proxy_overhead.py's "
        "layout), to compare with the loader's rate per CPU-second (0: skip)",
    )
    args = harness.parse(parser)

    directory = args.dir or Path(tempfile.mkdtemp(prefix="onjob-ingest-"))
    directory.mkdir(parents=True, exist_ok=True)
    db = directory / "ingest.duckdb"
    if db.exists():
        parser.error(f"{db} exists: give --dir a fresh folder")
    postgres = Postgres().start() if args.lake else None
    lake = (
        {"catalog": postgres.database("ingest"), "data_path": str(directory / "lake")}
        if postgres
        else {}
    )
    settings = CollectorSettings(
        db=db,
        loader_nice=args.loader_nice,
        duckdb_memory_limit=args.duckdb_memory_limit,
        max_segment_bytes=args.max_segment_bytes,
        flush_interval_s=args.flush_interval_s,
        **lake,
    )
    proxied = proxy_rate(args.proxy_seconds, directory) if args.proxy_seconds else None
    load_before = os.getloadavg()
    print(f"logging {args.exchanges:,} exchanges into {db} (load average {load_before[0]:.2f})")
    try:
        run = asyncio.run(
            ingest(
                settings,
                args.exchanges,
                args.seed,
                args.progress,
                turns=args.turns,
                linear=not args.whole,
            )
        )
        if postgres:
            size = used = lake_size(postgres, "ingest", directory / "lake")
            empty = empty_used = empty_lake_size(postgres, directory)
        else:
            size, used = size_on_disk(db)
            empty, empty_used = empty_size(directory)
    finally:
        if postgres:
            postgres.stop()
            shutil.rmtree(postgres.dir, ignore_errors=True)
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    load_after = os.getloadavg()

    n = run["exchanges"]
    payload = run["payload"]
    per_exchange = (size - empty) / n
    behind, catch_up = run["not_loaded_when_logging_ended"], run["catch_up_s"]
    f = {
        "sustained_exchanges_per_s": n / run["wall_s"],
        "append_exchanges_per_s": n / run["append_s"],
        "append_us_per_exchange": run["append_s"] / n * 1e6,
        "append_cpu_us_per_exchange": run["append_cpu_s"] / n * 1e6,
        "load_exchanges_per_cpu_s": n / run["loader_cpu_s"],
        "load_cpu_us_per_exchange": run["loader_cpu_s"] / n * 1e6,
        "catch_up_exchanges_per_s": behind / catch_up if behind > n / 10 else None,
        "loader_busy_share": run["loader_cpu_s"] / run["wall_s"],
        "build_records_us_per_exchange": run["build_records_s"] / n * 1e6,
        "spool_bytes_per_exchange": payload["spool_bytes"] / n,
        "request_bytes_per_exchange": payload["request_bytes"] / n,
        "response_bytes_per_exchange": payload["response_bytes"] / n,
        "prompt_tokens_per_exchange": payload["prompt_tokens"] / n,
        "completion_tokens_per_exchange": payload["completion_tokens"] / n,
        "db_file_bytes": size,
        "db_used_bytes": used,
        "empty_db_file_bytes": empty,
        "db_bytes_per_exchange": per_exchange,
        "db_used_bytes_per_exchange": (used - empty_used) / n,
        "db_gb_per_million_exchanges": per_exchange * 1e6 / 1e9,
        "db_used_gb_per_million_exchanges": (used - empty_used) / n * 1e6 / 1e9,
        "spool_to_db_used_ratio": payload["spool_bytes"] / (used - empty_used),
        "turns": args.turns or None,
        "linear": not args.whole,
        "peak_rss_mb": run["peak_rss_mb"],
        "peak_rss_while_logging_mb": run["peak_rss_while_logging_mb"],
        "rss_after_setup_mb": run["rss_after_setup_mb"],
    }
    noisy = max(load_before[0], load_after[0]) > 0.5
    lines = [
        f"{n:,} exchanges of {f['spool_bytes_per_exchange'] / 1e3:.1f} KB on the spool "
        f"(request {f['request_bytes_per_exchange'] / 1e3:.1f} KB, answer "
        f"{f['response_bytes_per_exchange'] / 1e3:.1f} KB, token ids of "
        f"{f['prompt_tokens_per_exchange']:.0f} prompt + {f['completion_tokens_per_exchange']:.0f}"
        " completion tokens, their logprobs)",
        f"sustained, log() to rows in DuckDB: {f['sustained_exchanges_per_s']:,.0f} exchanges/s "
        f"({n:,} in {run['wall_s']:.1f} s; when logging ended {behind:,} were not loaded, "
        f"caught up {catch_up:.1f} s later)",
        f"  spool append, log(): {f['append_exchanges_per_s']:,.0f} exchanges/s "
        f"({f['append_us_per_exchange']:.0f} us each, {f['append_cpu_us_per_exchange']:.0f} us "
        "of CPU)",
        f"  load into DuckDB: {f['load_exchanges_per_cpu_s']:,.0f} exchanges per second of the "
        f"loader's CPU ({f['load_cpu_us_per_exchange']:.0f} us each, waits on the disk not "
        f"counted; {f['loader_busy_share']:.0%} of the wall time)"
        + (
            f"; catching up, {f['catch_up_exchanges_per_s']:,.0f}/s of wall time"
            if f["catch_up_exchanges_per_s"]
            else ""
        ),
        f"  building each record (the proxy's work, stitching included): "
        f"{f['build_records_us_per_exchange']:.0f} us",
        f"{'the lake (files and catalog)' if args.lake else 'DuckDB file after CHECKPOINT'}: "
        f"{size / 1e6:,.1f} MB = {per_exchange / 1e3:.2f} KB per "
        f"exchange -> {f['db_gb_per_million_exchanges']:.1f} GB per million exchanges; in used "
        f"blocks {used / 1e6:,.1f} MB -> {f['db_used_gb_per_million_exchanges']:.1f} GB per "
        f"million, {f['spool_to_db_used_ratio']:.1f}x smaller than the spool",
        f"peak RSS {f['peak_rss_mb']:,.0f} MB ({f['peak_rss_while_logging_mb']:,.0f} MB while "
        f"logging, {f['rss_after_setup_mb']:,.0f} MB after setup)",
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after, "
        f"{os.cpu_count()} CPUs" + (": shared machine, noisy rates" if noisy else ""),
    ]
    if proxied:
        f["proxy"] = proxied
        faster = max(p["rps"] for p in proxied.values())
        f["load_to_proxy_ratio"] = f["load_exchanges_per_cpu_s"] / faster
        lines.insert(
            4,
            "  one proxy process answered "
            + ", ".join(f"{p['rps']:,.0f} req/s {mode}" for mode, p in proxied.items())
            + f": the loader loads {f['load_to_proxy_ratio']:.1f}x the faster of its rates "
            "per CPU-second (each on one core)",
        )
    by_turn = payload.pop("spool_bytes_by_turn", None)
    if by_turn:
        last = max(by_turn)
        f["spool_bytes_first_turn"] = sum(by_turn[0]) / len(by_turn[0])
        f["spool_bytes_last_turn"] = sum(by_turn[last]) / len(by_turn[last])
        lines.insert(
            1,
            f"{args.turns} equal turns per conversation: spool line of turn 1 "
            f"{f['spool_bytes_first_turn'] / 1e3:.1f} KB, of turn {last + 1} "
            f"{f['spool_bytes_last_turn'] / 1e3:.1f} KB",
        )
    print("\n" + "\n".join(lines))
    machine = {
        "duckdb": duckdb.__version__,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }
    fields = {"settings": settings.model_dump(mode="json"), "figures": f, "run": run}
    harness.save("ingest", fields, args.out, machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
