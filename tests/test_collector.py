"""The collector on a real DuckDB file: batched loading, aggregates, replay after kill -9."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import duckdb
import pytest

from onjob.collector import (
    Collector,
    CollectorSettings,
    ExchangeRecord,
    Stitcher,
    StorageError,
    Store,
)
from onjob.collector.records import encode, to_json
from onjob.collector.schema import MIGRATIONS, migrate, version
from onjob.collector.trajectories import continuations, keys


def record(placement, i: int, **extra) -> ExchangeRecord:
    """A line placed already (as a spool of an older onjob holds)."""
    return ExchangeRecord(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        ts=time.time(),
        trajectory_id=placement.trajectory_id,
        turn=placement.turn,
        scenario_id=placement.scenario_id,
        **_common(i, placement.scenario_key, placement.scenario_keyed),
        **extra,
    )


def unplaced(messages: list[dict], i: int, **extra) -> ExchangeRecord:
    """A line as the proxy writes it: the loader places it from its keys."""
    k = keys(messages)
    return ExchangeRecord(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        ts=time.time(),
        stitch=k.candidates,
        prefix_hash=k.prefix_hash,
        **_common(i, k.scenario_key, k.scenario_keyed),
        **extra,
    )


def _common(i: int, scenario_key: str, scenario_keyed: str) -> dict:
    return dict(
        scenario_key=scenario_key,
        scenario_keyed=scenario_keyed,
        model_alias="agent",
        request=to_json({"messages": [{"role": "user", "content": f"q{i}"}]}),
        response=to_json({"choices": [{"message": {"role": "assistant", "content": "a"}}]}),
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[[4, 5]],
        completion_logprobs=[[-0.5, -0.25]],
        usage=to_json({"prompt_tokens": 3, "completion_tokens": 2}),
        latency_ms=12.5,
    )


async def log_conversations(collector: Collector, conversations: int, turns: int) -> list[str]:
    ids = []
    for c in range(conversations):
        messages = [{"role": "user", "content": f"conversation {c}"}]
        for t in range(turns):
            answer = {"role": "assistant", "content": f"answer {t}"}
            hashes = continuations(keys(messages).prefix_hash, [answer])
            r = unplaced(messages, t, continuation_hashes=hashes)
            collector.log(r)
            ids.append(r.id)
            messages = [*messages, answer, {"role": "user", "content": f"more {t}"}]
    return ids


def test_logged_exchanges_land_with_trajectories_and_scenarios(tmp_path):
    db = tmp_path / "onjob.duckdb"

    async def main():
        c = Collector(CollectorSettings(db=db, flush_interval_s=0.05))
        await c.start()
        ids = await log_conversations(c, conversations=3, turns=4)
        await c.close()
        return ids

    ids = asyncio.run(main())
    con = duckdb.connect(str(db), read_only=True)
    assert {r[0] for r in con.execute("SELECT id FROM exchanges").fetchall()} == set(ids)
    rows = con.execute("SELECT n_turns, first_exchange, last_exchange FROM trajectories").fetchall()
    assert sorted(r[0] for r in rows) == [4, 4, 4]
    turns = con.execute(
        "SELECT trajectory_id, list(turn ORDER BY turn) FROM exchanges GROUP BY 1"
    ).fetchall()
    assert all(t == [0, 1, 2, 3] for _, t in turns)
    assert con.execute("SELECT count(*), sum(count) FROM scenarios").fetchone() == (3, 3)
    tokens = con.execute(
        "SELECT prompt_token_ids, completion_token_ids, completion_logprobs, "
        "request->>'$.messages[0].content' FROM exchanges LIMIT 1"
    ).fetchone()
    assert tokens[:3] == ([1, 2, 3], [[4, 5]], [[-0.5, -0.25]])
    assert tokens[3].startswith("q")
    assert not list((tmp_path / "onjob.duckdb.spool").glob("*.jsonl"))  # all loaded


def test_segments_are_capped_while_loading_lags_and_all_of_them_land(tmp_path):
    db = tmp_path / "onjob.duckdb"
    cap = 1 << 16

    async def main():
        # A flush interval longer than the test: nothing is loaded until close().
        c = Collector(CollectorSettings(db=db, flush_interval_s=3600, max_segment_bytes=cap))
        await c.start()
        ids = await log_conversations(c, conversations=150, turns=4)
        sizes = [s.stat().st_size for s in c.spool.segments()]
        await c.close()
        return ids, sizes

    ids, sizes = asyncio.run(main())
    assert len(sizes) > 3  # the backlog was split, not one growing file
    assert max(sizes) < cap + 4096
    con = duckdb.connect(str(db), read_only=True)
    assert {r[0] for r in con.execute("SELECT id FROM exchanges").fetchall()} == set(ids)
    assert con.execute("SELECT sum(n_turns) FROM trajectories").fetchone() == (600,)
    # A conversation's turns span loads: its row is updated, not inserted again.
    assert con.execute(
        """
        SELECT count(*) FROM trajectories t
        WHERE n_turns = 4
          AND first_exchange = (SELECT id FROM exchanges WHERE trajectory_id = t.id AND turn = 0)
          AND last_exchange = (SELECT id FROM exchanges WHERE trajectory_id = t.id AND turn = 3)
          AND last_ts = (SELECT max(ts) FROM exchanges WHERE trajectory_id = t.id)
        """
    ).fetchone() == (150,)
    assert con.execute("SELECT count(*), sum(count) FROM scenarios").fetchone() == (150, 150)


def test_loading_the_same_segment_twice_changes_nothing(tmp_path):
    store = Store(tmp_path / "db.duckdb")
    from onjob.collector import Stitcher

    s = Stitcher()
    p = s.place([{"role": "user", "content": "hi"}])
    segment = tmp_path / "000000000001-abc.jsonl"
    segment.write_bytes(encode(record(p, 0)) + b"\n")
    assert store.load_segment(segment) == 1
    # A crash between the commit and the file's deletion: the replay loads nothing.
    assert store.load_segment(segment) == 0
    assert store.dicts("SELECT n_turns FROM trajectories") == [{"n_turns": 1}]
    assert store.dicts("SELECT count FROM scenarios") == [{"count": 1}]


def test_rows_come_back_as_typed_records_by_column_name(tmp_path):
    """`Store.rows` fills a record's fields by the columns' names, whatever their order,
    and a column the record does not have is an error, not a value in the wrong field."""
    import msgspec

    class Turn(msgspec.Struct, frozen=True):
        trajectory_id: str
        n_turns: int

    store = Store(tmp_path / "db.duckdb")
    p = Stitcher().place([{"role": "user", "content": "hi"}])
    segment = tmp_path / "000000000001-abc.jsonl"
    segment.write_bytes(encode(record(p, 0)) + b"\n")
    store.load_segment(segment)
    sql = "SELECT n_turns, id AS trajectory_id FROM trajectories"
    assert store.rows(Turn, sql) == [Turn(trajectory_id=p.trajectory_id, n_turns=1)]
    with pytest.raises(TypeError):
        store.rows(Turn, "SELECT n_turns, id AS trajectory_id, first_ts FROM trajectories")
    store.close()


def test_trajectories_and_scenarios_come_out_the_same_looked_up_or_merged(tmp_path):
    """A load upserts trajectory and scenario rows by index lookups when it touches few rows
    of a large table, by DuckDB's merge otherwise: both give the same rows."""
    stitcher = Stitcher()
    segments = []
    conversations = [[{"role": "user", "content": f"conversation {c}"}] for c in range(12)]
    for load in range(4):  # each load adds a turn to some conversations, starts others
        lines = []
        for c, messages in enumerate(conversations):
            if (c + load) % 3 == 0:
                continue
            p = stitcher.place(messages)
            lines.append(encode(record(p, c)))
            answer = {"role": "assistant", "content": f"answer {load}"}
            stitcher.register(p, continuations(p.prefix_hash, [answer]))
            messages += [answer, {"role": "user", "content": f"more {load}"}]
        segments.append(b"\n".join(lines) + b"\n")

    tables = []
    for name, scan_per_lookup in (("looked-up", 0), ("merged", 10**9)):
        store = Store(tmp_path / f"{name}.duckdb", scan_per_lookup=scan_per_lookup)
        for i, lines in enumerate(segments):
            path = tmp_path / f"{name}-{i:013d}.jsonl"
            path.write_bytes(lines)
            store.load_segment(path)
        tables.append(
            [
                store.con.execute(f"SELECT * FROM {t} ORDER BY id").fetchall()
                for t in ("trajectories", "scenarios")
            ]
        )
        store.close()
    assert tables[0] == tables[1]
    trajectories, scenarios = tables[0]
    assert sorted(t[6] for t in trajectories) == [2] * 4 + [3] * 8  # n_turns across loads
    assert sum(s[-1] for s in scenarios) == 12


def test_scenario_counts_trajectories_not_turns(tmp_path):
    async def main():
        c = Collector(CollectorSettings(db=tmp_path / "db.duckdb", flush_interval_s=60))
        await c.start()
        await log_conversations(c, conversations=1, turns=2)
        await c.flush()
        await log_conversations(c, conversations=1, turns=1)  # same first message: same scenario
        await c.flush()
        rows = await c.query(lambda s: s.dicts("SELECT count FROM scenarios"))
        await c.close()
        return rows

    assert asyncio.run(main()) == [{"count": 2}]


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from onjob.collector import Collector, CollectorSettings
    from tests.test_collector import log_conversations

    async def main():
        c = Collector(CollectorSettings(db=Path(sys.argv[1]), flush_interval_s=3600))
        await c.start()
        ids = await log_conversations(c, conversations=5, turns=3)
        print("\\n".join(ids), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def test_exchanges_survive_kill_9_and_are_replayed_at_start(tmp_path):
    db = tmp_path / "onjob.duckdb"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    ids = [proc.stdout.readline().strip() for _ in range(15)]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert all(ids)

    async def restart():
        c = Collector(CollectorSettings(db=db))
        await c.start()
        replayed = c.loaded
        # The stitcher was warmed from the database: conversation 0 continues at turn 3.
        msgs = [{"role": "user", "content": "conversation 0"}]
        for t in range(3):
            msgs += [
                {"role": "assistant", "content": f"answer {t}"},
                {"role": "user", "content": f"more {t}"},
            ]
        placement = c.stitcher.place(msgs)
        rows = await c.query(lambda s: s.dicts("SELECT id FROM exchanges"))
        await c.close()
        return replayed, placement, rows

    replayed, placement, rows = asyncio.run(restart())
    assert replayed == 15
    assert {r["id"] for r in rows} == set(ids)
    assert placement.turn == 3


def test_torn_last_line_is_skipped_and_the_rest_loaded(tmp_path):
    spool = tmp_path / "db.duckdb.spool"
    spool.mkdir()
    from onjob.collector import Stitcher
    from onjob.collector.records import encode

    p = Stitcher().place([{"role": "user", "content": "hi"}])
    good = record(p, 0)
    (spool / "000000000001.jsonl").write_bytes(encode(good) + b"\n" + encode(record(p, 1))[:40])

    async def main():
        c = Collector(CollectorSettings(db=tmp_path / "db.duckdb"))
        await c.start()
        rows = await c.query(lambda s: s.dicts("SELECT id FROM exchanges"))
        await c.close()
        return rows

    assert asyncio.run(main()) == [{"id": good.id}]


def test_a_segment_duckdb_refuses_is_set_aside_and_the_segments_after_it_load(tmp_path):
    """A segment whose line is already loaded (a spool restored from a backup) used to fail
    its whole batch on every round, so nothing after it ever loaded."""
    db, spool = tmp_path / "db.duckdb", tmp_path / "db.duckdb.spool"

    async def main():
        c = Collector(CollectorSettings(db=db, flush_interval_s=3600))
        await c.start()
        first = unplaced([{"role": "user", "content": "first"}], 0)
        c.log(first)
        await c.flush()
        # Opened long ago, closed far ahead: every later segment overlaps it, so they all
        # go to DuckDB in one batch with it.
        bad = spool / "0000000000001-9999999999999-restored-000001.jsonl"
        bad.write_bytes(encode(first) + b"\n")
        ids = await log_conversations(c, conversations=2, turns=3)
        await c.flush()
        stats = c.stats()
        rows = await c.query(lambda s: s.dicts("SELECT id FROM exchanges"))
        await c.close()
        return first.id, bad, ids, stats, rows

    first, bad, ids, stats, rows = asyncio.run(main())
    assert {r["id"] for r in rows} == {first, *ids}
    assert stats.failed_segments == 1 and stats.backlog_segments == 0
    aside = spool / "failed" / bad.name
    assert aside.read_bytes().count(first.encode()) == 1  # kept as it was
    assert "Duplicate key" in (spool / "failed" / f"{bad.name}.error").read_text()


def test_a_segment_duckdb_refuses_at_start_does_not_stop_the_server_starting(tmp_path):
    db, spool = tmp_path / "db.duckdb", tmp_path / "db.duckdb.spool"
    p = Stitcher().place([{"role": "user", "content": "hi"}])
    loaded, good = record(p, 0), record(p, 1)
    Store(db).close()
    spool.mkdir()
    (spool / "0000000000001.jsonl").write_bytes(encode(loaded) + b"\n")
    (spool / "0000000000002.jsonl").write_bytes(encode(loaded) + b"\n")  # the same line again
    (spool / "0000000000003.jsonl").write_bytes(encode(good) + b"\n")

    async def main():
        c = Collector(CollectorSettings(db=db))
        await c.start()
        rows = await c.query(lambda s: s.dicts("SELECT id FROM exchanges ORDER BY id"))
        stats = c.stats()
        await c.close()
        return rows, stats

    rows, stats = asyncio.run(main())
    assert sorted(r["id"] for r in rows) == sorted([loaded.id, good.id])
    assert stats.failed_segments == 1
    # Names from before several writers carry no times: either copy may have gone first.
    assert [p.name for p in (spool / "failed").glob("*.jsonl")] in (
        ["0000000000001.jsonl"],
        ["0000000000002.jsonl"],
    )


def test_opening_an_older_database_upgrades_it(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    migrate(con, MIGRATIONS[:1])
    con.execute("INSERT INTO feedback VALUES ('f1', 'x', NULL, NULL, 1.0, 'kept', now())")
    newer = [*MIGRATIONS, "ALTER TABLE feedback ADD COLUMN source VARCHAR DEFAULT 'app'"]
    assert migrate(con, newer) == 1
    assert version(con) == len(newer)
    assert con.execute("SELECT comment, source FROM feedback").fetchall() == [("kept", "app")]
    with pytest.raises(RuntimeError, match="newer than this onjob"):
        migrate(con, MIGRATIONS)


def test_a_database_held_by_another_process_is_a_clear_error(tmp_path):
    path = tmp_path / "held.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, time; c = duckdb.connect({str(path)!r}); print('ok', flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ok"
        with pytest.raises(StorageError, match="one read-write process"):
            Store(path)
    finally:
        holder.kill()
        holder.wait()


def test_duckdb_spills_beside_the_database_not_where_onjob_runs(tmp_path, monkeypatch):
    from onjob.collector.store import Store

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    store = Store(tmp_path / "onjob.duckdb")
    try:
        store.con.execute("SET memory_limit = '64MB'; SET threads = 1")
        # A sort larger than the limit: DuckDB must write temporary files somewhere.
        store.con.execute("SELECT * FROM range(10000000) t(i) ORDER BY hash(i)").fetchone()
        assert (tmp_path / "onjob.duckdb.tmp").is_dir()
    finally:
        store.close()
    assert list(cwd.iterdir()) == []
