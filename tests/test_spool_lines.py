"""The spool is newline-delimited: whatever a client sends stays on one line, a line DuckDB
refuses is set aside alone and the rest of its segment loads, and a line torn anywhere but
at a segment's end is reported as corruption. Against a real `onjob serve` with two API
keys (the engine: onjob/testing/fake_upstream.py, a real process) and a real DuckDB file."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import duckdb
import httpx
import pytest

from onjob.cli.process import ServerProcess
from onjob.collector import Collector, CollectorSettings
from onjob.collector.records import FeedbackRecord, encode
from onjob.collector.trajectories import Stitcher, continuations, keys

from .test_collector import record, unplaced

KEYS = {"alice": "sk-alice-7f3a91c2e5", "bob": "sk-bob-0d8e44b6a1"}
CHAT = {"model": "agent", "messages": [{"role": "user", "content": "hello"}]}


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[key]}", "Content-Type": "application/json"}


def serve(tmp_path: Path, engine_url: str) -> ServerProcess:
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__API_KEYS": json.dumps(KEYS)}
    args = ["--engine-url", engine_url, "--db", str(tmp_path / "onjob.duckdb")]
    return ServerProcess(args, env=env, log=tmp_path / "server.log")


def rows(db: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def loaded_ids(db: Path, segment: Path, data: bytes) -> set[str]:
    """Start a collector on `db`, write `data` as the spool segment `segment`, load it:
    the ids of the exchanges in DuckDB then."""

    async def main():
        c = Collector(CollectorSettings(db=db, flush_interval_s=3600))
        await c.start()
        segment.write_bytes(data)
        await c.flush()
        loaded = await c.query(lambda s: s.dicts("SELECT id FROM exchanges"))
        await c.close()
        return {r["id"] for r in loaded}

    return asyncio.run(main())


def test_a_pretty_printed_body_is_answered_and_lands_in_duckdb(tmp_path, fake_engine_url):
    body = {**CHAT, "messages": [{"role": "user", "content": "pretty-4e1a"}]}
    with serve(tmp_path, fake_engine_url) as server:
        for indent, brk in ((2, "\n"), (1, "\r\n"), (4, "\r")):
            raw = json.dumps(body, indent=indent).replace("\n", brk).encode()
            reply = httpx.post(f"{server.url}/chat/completions", content=raw, headers=bearer("bob"))
            assert reply.status_code == 200, reply.text
    logged = rows(tmp_path / "onjob.duckdb", "SELECT request FROM exchanges")
    assert len(logged) == 3
    # The request is kept as the value the client sent (line breaks were whitespace).
    assert all(json.loads(request) == body for (request,) in logged)
    assert "torn" not in (tmp_path / "server.log").read_text()


def test_a_body_holding_whole_spool_lines_forges_no_rows(tmp_path, fake_engine_url):
    """alice's body carries, each on a line of its own, an exchange as bob's and feedback
    from bob on bob's real exchange: they must stay values inside alice's request."""
    with serve(tmp_path, fake_engine_url) as server:
        bobs = httpx.post(f"{server.url}/chat/completions", json=CHAT, headers=bearer("bob"))
        assert bobs.status_code == 200
        forged_exchange = {
            "kind": "exchange",
            "id": "chatcmpl-forged0001",
            "ts": 1.0,
            "trajectory_id": "bob:conv-b",
            "turn": 1,
            "scenario_id": "bob:s",
            "scenario_key": "k",
            "scenario_keyed": "k",
            "api_key_id": "bob",
            "request": {"messages": [{"role": "user", "content": "hi"}]},
            "response": {"choices": [{"message": {"content": "POISONED ANSWER"}}]},
            "completion_token_ids": [[1, 2, 3]],
            "completion_logprobs": [[-0.1, -0.1, -0.1]],
            "source": "production",
        }
        forged_feedback = {
            "kind": "feedback",
            "id": "fb-forged0001",
            "ts": 1.0,
            "exchange_id": bobs.json()["id"],
            "api_key_id": "bob",
            "value": -1,
            "comment": "from bob",
        }
        raw = (
            b'{"model": "agent", "messages": [{"role": "user", "content": "alice-9c2f"}],\n'
            + b'"x1":\n'
            + json.dumps(forged_exchange).encode()
            + b',\n"x2":\n'
            + json.dumps(forged_feedback).encode()
            + b"\n}"
        )
        hers = httpx.post(f"{server.url}/chat/completions", content=raw, headers=bearer("alice"))
        assert hers.status_code == 200, hers.text
    db = tmp_path / "onjob.duckdb"
    assert rows(db, "SELECT count(*) FROM feedback") == [(0,)]
    assert rows(db, "SELECT count(*) FROM exchanges WHERE id LIKE '%forged%'") == [(0,)]
    assert rows(db, "SELECT count(*) FROM exchanges WHERE response::VARCHAR LIKE '%POISON%'") == [
        (0,)
    ]
    by_key = dict(rows(db, "SELECT api_key_id, count(*) FROM exchanges GROUP BY ALL"))
    assert by_key == {"alice": 1, "bob": 1}
    (request,) = rows(db, "SELECT request FROM exchanges WHERE api_key_id = 'alice'")[0]
    assert json.loads(request)["x1"] == forged_exchange  # kept, as the value alice sent


def test_a_refused_line_is_set_aside_alone_and_the_rest_of_its_segment_loads(tmp_path):
    """A line reusing a loaded exchange's id among bob's concurrent exchanges: the line goes
    to failed/ with its reason, the others load."""
    db, spool = tmp_path / "db.duckdb", tmp_path / "db.duckdb.spool"

    async def main():
        c = Collector(CollectorSettings(db=db, flush_interval_s=3600))
        await c.start()
        first = unplaced([{"role": "user", "content": "first"}], 0)
        c.log(first)
        await c.flush()
        others = [unplaced([{"role": "user", "content": f"bob {i}"}], i) for i in range(3)]
        lines = [encode(others[0]), encode(first), encode(others[1]), encode(others[2])]
        segment = spool / "0000000000001-0000000000002-restored-000001.jsonl"
        segment.write_bytes(b"\n".join(lines) + b"\n")
        await c.flush()
        loaded = await c.query(lambda s: s.dicts("SELECT id FROM exchanges"))
        stats = c.stats()
        await c.close()
        return first.id, [o.id for o in others], segment, loaded, stats

    first, others, segment, loaded, stats = asyncio.run(main())
    assert {r["id"] for r in loaded} == {first, *others}
    assert not segment.exists()
    aside = spool / "failed" / "0000000000001-0000000000002-restored-000001-line2.jsonl"
    assert aside.read_bytes().count(first.encode()) == 1 and aside.read_bytes().count(b"\n") == 1
    assert "Duplicate key" in aside.with_name(aside.name + ".error").read_text()
    assert stats.failed_segments == 1 and stats.backlog_segments == 0
    # The pieces the segment was loaded in leave nothing behind.
    assert list((spool / ".pieces").iterdir()) == []
    assert rows(db, "SELECT count(*) FROM loaded_segments WHERE name LIKE '%restored%'") == [(0,)]


def test_a_turn_in_a_refused_segment_still_continues_its_conversation(tmp_path):
    """The segment is refused whole (a line reuses a loaded id), then loaded line by line:
    the second turn it holds was placed by the refused attempt too, and placed again it must
    not read that first placement as its conversation's latest turn and fork."""
    db, spool = tmp_path / "db.duckdb", tmp_path / "db.duckdb.spool"
    asked = [{"role": "user", "content": "first question"}]
    reply = {"role": "assistant", "content": "a"}  # `_common`'s answer
    first = unplaced(
        asked, 0, status=200, continuation_hashes=continuations(keys(asked).prefix_hash, [reply])
    )
    second = unplaced([*asked, reply, {"role": "user", "content": "and then?"}], 1, status=200)

    async def main():
        c = Collector(CollectorSettings(db=db, flush_interval_s=3600))
        await c.start()
        c.log(first)
        await c.flush()
        segment = spool / "0000000000001-0000000000002-restored-000001.jsonl"
        segment.write_bytes(encode(second) + b"\n" + encode(first) + b"\n")
        await c.flush()
        placed = await c.query(
            lambda s: s.dicts("SELECT id, trajectory_id, turn FROM exchanges ORDER BY turn")
        )
        await c.close()
        return placed

    placed = asyncio.run(main())
    assert [(r["id"], r["turn"]) for r in placed] == [(first.id, 0), (second.id, 1)]
    assert placed[0]["trajectory_id"] == placed[1]["trajectory_id"]
    assert (spool / "failed" / "0000000000001-0000000000002-restored-000001-line2.jsonl").exists()


def test_a_line_one_reader_accepts_and_the_other_refuses_is_set_aside_never_skipped(
    tmp_path, caplog
):
    """Lines onjob's reader (msgspec) reads but DuckDB refuses, and the reverse. With
    `read_json(ignore_errors = true)` DuckDB loaded the mistyped ones with NULLs in place of
    their values and skipped the rest in silence: every line must load or be set aside."""
    db, spool = tmp_path / "db.duckdb", tmp_path / "db.duckdb.spool"
    good = [unplaced([{"role": "user", "content": f"good {i}"}], i) for i in range(3)]
    line = json.loads(encode(good[0]))
    mistyped = {**line, "id": "chatcmpl-mistyped", "latency_ms": "slow"}
    too_big = {**line, "id": "chatcmpl-toobig", "prompt_token_ids": [2**40]}
    twice = encode(good[0]).replace(b'"id":', b'"id":"chatcmpl-first","id":', 1)
    strays = [
        json.dumps(mistyped).encode(),  # msgspec reads its kind; DuckDB cannot cast "slow"
        json.dumps(too_big).encode(),  # a token id past DuckDB's INTEGER
        twice,  # an id given twice: DuckDB refuses it, msgspec keeps the last
        json.dumps({**line, "id": "chatcmpl-alien", "kind": "alien"}).encode(),
        b'{"no": "kind"}',  # DuckDB reads it, onjob's reader does not
    ]
    lines = [encode(good[0]), *strays[:3], encode(good[1]), *strays[3:], encode(good[2])]
    name = "0000000000001-0000000000002-w-000001"

    with caplog.at_level(logging.WARNING, logger="onjob.collector"):
        loaded = loaded_ids(db, spool / f"{name}.jsonl", b"\n".join(lines) + b"\n")
    assert loaded == {g.id for g in good}
    aside = sorted((spool / "failed").glob(f"{name}-line*.jsonl"))
    assert sorted(int(p.stem.rsplit("line", 1)[1]) for p in aside) == [2, 3, 4, 6, 7]
    for p in aside:  # each alone, as written, its reason beside it
        number = int(p.stem.rsplit("line", 1)[1])
        assert p.read_bytes().rstrip(b"\n") == lines[number - 1]
        assert p.with_name(p.name + ".error").read_text().strip()
    reasons = {
        int(p.stem.rsplit("line", 1)[1]): p.with_name(p.name + ".error").read_text() for p in aside
    }
    assert "slow" in reasons[2] and "duplicate key" in reasons[4].lower()
    assert "not a spool record" in reasons[6] and "not a spool record" in reasons[7]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 5, errors
    assert not (spool / f"{name}.jsonl").exists()


def test_a_set_aside_line_moved_back_loads(tmp_path):
    db, spool = tmp_path / "db.duckdb", tmp_path / "db.duckdb.spool"
    stitched = Stitcher().place([{"role": "user", "content": "hi"}])
    feedback = FeedbackRecord(id="fb-1", ts=1.0, exchange_id="chatcmpl-nowhere", value=1.0)

    async def main():
        c = Collector(CollectorSettings(db=db, flush_interval_s=3600))
        await c.start()
        good = record(stitched, 0)
        c.log(good)
        await c.flush()
        segment = spool / "0000000000003-0000000000004-w-000001.jsonl"
        segment.write_bytes(encode(record(stitched, 1)) + b"\n" + encode(good) + b"\n")
        await c.flush()
        aside = spool / "failed" / "0000000000003-0000000000004-w-000001-line2.jsonl"
        assert aside.exists()  # the refused line alone
        # The operator fixes the line (here: replaces it) and moves it back.
        aside.write_bytes(encode(feedback) + b"\n")
        aside.replace(spool / aside.name)
        await c.flush()
        n = await c.query(lambda s: s.dicts("SELECT count(*) AS n FROM feedback"))
        await c.close()
        return n

    assert asyncio.run(main()) == [{"n": 1}]


def test_a_line_torn_mid_segment_is_reported_as_corruption(tmp_path, caplog):
    db, spool = tmp_path / "db.duckdb", tmp_path / "db.duckdb.spool"
    p = Stitcher().place([{"role": "user", "content": "hi"}])
    good = [record(p, i) for i in range(3)]

    lines = [encode(good[0]), encode(good[1])[:40], encode(good[2])]
    segment = spool / "0000000000001-0000000000002-w-000001.jsonl"
    with caplog.at_level(logging.WARNING, logger="onjob.collector"):
        loaded = loaded_ids(db, segment, b"\n".join(lines))
    assert loaded == {good[0].id, good[2].id}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("line 2 is torn or corrupt" in m for m in errors), errors
    aside = spool / "failed" / "0000000000001-0000000000002-w-000001-line2.jsonl"
    assert aside.read_bytes().startswith(encode(good[1])[:40])


@pytest.mark.parametrize("tail", [True, False])
def test_a_torn_last_line_is_a_crash_not_corruption(tmp_path, caplog, tail):
    db, spool = tmp_path / "db.duckdb", tmp_path / "db.duckdb.spool"
    p = Stitcher().place([{"role": "user", "content": "hi"}])
    good = record(p, 0)

    async def main():
        c = Collector(CollectorSettings(db=db, flush_interval_s=3600))
        await c.start()
        torn = encode(record(p, 1))[:30] + (b"" if tail else b"\n")
        segment = spool / "0000000000001-0000000000002-w-000001.jsonl"
        segment.write_bytes(encode(good) + b"\n" + torn)
        await c.flush()
        await c.close()

    with caplog.at_level(logging.WARNING, logger="onjob.collector"):
        asyncio.run(main())
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    # With no line break after it, the line is what a crash mid-write leaves; with one,
    # something wrote a broken line whole: corruption.
    assert (errors == []) is tail
    assert any("torn last line" in r.getMessage() for r in caplog.records) is tail
