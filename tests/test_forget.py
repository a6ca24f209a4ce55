"""Retention and deletion: `onjob forget` against a running server (admin API) and against a
database no server holds, `collector.retention_days` in a running server, and the spool
never bringing deleted rows back. Real `onjob serve` processes, real DuckDB files; the
engine is onjob/testing/fake_upstream.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess
from onjob.collector import Forget, ForgetError, Stitcher, Store
from onjob.collector.forget import forget
from onjob.collector.records import ExchangeRecord, FeedbackRecord, encode

from .conftest import rows

KEYS = {"alice": "sk-alice-8e21b0f4", "bob": "sk-bob-47c9d3a6"}
ADMIN = "adm-9b3f62e0c1"


def serve(tmp_path: Path, engine_url: str, **env: str) -> ServerProcess:
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__API_KEYS": json.dumps(KEYS),
        "ONJOB_PROXY__ADMIN_KEY": ADMIN,
        **env,
    }
    args = ["--engine-url", engine_url, "--db", str(tmp_path / "onjob.duckdb")]
    return ServerProcess(args, env=env, log=tmp_path / "server.log")


def onjob(*args: str, admin: str | None = ADMIN, **more: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ONJOB_PROXY__ADMIN_KEY": admin} if admin else dict(os.environ)
    env.update(more)
    return subprocess.run(
        [sys.executable, "-m", "onjob.cli", *args], capture_output=True, text=True, env=env
    )


def converse(server: ServerProcess, key: str, topic: str, turns: int = 2) -> list[str]:
    """One conversation of `turns` turns; the ids of its answered exchanges."""
    client = OpenAI(base_url=server.url, api_key=KEYS[key], max_retries=0, timeout=30)
    messages, ids = [{"role": "user", "content": f"{topic}?"}], []
    for t in range(turns):
        reply = client.chat.completions.create(model="agent", messages=messages)
        ids.append(reply.id)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"and {t}?"},
        ]
    return ids


def post_feedback(server: ServerProcess, key: str, exchange_id: str) -> None:
    reply = httpx.post(
        f"{server.url}/feedback",
        json={"exchange_id": exchange_id, "value": 1},
        headers={"Authorization": f"Bearer {KEYS[key]}"},
    )
    assert reply.status_code == 200, reply.text


def judged_and_trained(db: Path, exchange_id: str) -> None:
    """What the judge and the trainer would have left: a group on the exchange (members,
    a judgement, scores), a run that trained on it, its checkpoint and a child of it."""
    store = Store(db)
    try:
        with store.transaction() as con:
            traj = con.execute(
                "SELECT trajectory_id FROM exchanges WHERE id = ?", [exchange_id]
            ).fetchone()[0]
            con.execute(
                "INSERT INTO groups (id, prefix_exchange, kind, status, created) "
                "VALUES ('grp-1', ?, 'turn', 'scored', now())",
                [exchange_id],
            )
            con.execute(
                "INSERT INTO members (id, group_id, position, exchange_id, choice, "
                "trajectory_id, origin) VALUES ('member-1', 'grp-1', 0, ?, 0, ?, 'logged')",
                [exchange_id, traj],
            )
            con.execute(
                "INSERT INTO judgements (id, group_id, judge, cache_key, status, attempts, "
                "created) VALUES ('jdg-1', 'grp-1', 'ruler', 'k', 'ok', 1, now())"
            )
            con.execute(
                "INSERT INTO scores (id, group_id, member_id, source, score, created) "
                "VALUES ('score-1', 'grp-1', 'member-1', 'ruler', 0.5, now())"
            )
            con.execute(
                "INSERT INTO train_runs (id, groups_used, created, config) VALUES "
                "('run-1', ['grp-1', 'grp-other'], now(), '{\"lineage\": \"agent@acme\"}')"
            )
            con.execute(
                "INSERT INTO checkpoints (name, parent, path, created, train_run, status) "
                "VALUES ('ckpt-a', NULL, '/ckpts/ckpt-a', now(), 'run-1', 'live'), "
                "('ckpt-b', 'ckpt-a', '/ckpts/ckpt-b', now(), 'run-2', 'candidate'), "
                "('ckpt-other', NULL, '/ckpts/ckpt-other', now(), 'run-3', 'retired')"
            )
    finally:
        store.close()


def count(db: Path, table: str, where: str = "true", params=None) -> int:
    return rows(db, f"SELECT count(*) AS n FROM {table} WHERE {where}", params)[0]["n"]


def test_forget_a_key_through_the_running_server_while_traffic_flows(tmp_path, fake_engine_url):
    db = tmp_path / "onjob.duckdb"
    answered: list[str] = []  # bob's, sent before, during and after the forget
    with serve(tmp_path, fake_engine_url) as server:
        alices = [converse(server, "alice", f"alice topic {i}") for i in range(3)]
        post_feedback(server, "alice", alices[0][0])
        answered += converse(server, "bob", "bob before")
        stop = threading.Event()

        def bob_talks() -> None:
            i = 0
            while not stop.is_set():
                answered.extend(converse(server, "bob", f"bob during {i}"))
                i += 1

        talker = threading.Thread(target=bob_talks)
        talker.start()
        try:
            done = onjob("forget", "--api-key", "alice", "--server", server.base, "--json")
        finally:
            stop.set()
            talker.join()
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["exchanges"] == 6 and out["trajectories"] == 3 and out["feedback"] == 1
        assert out["trained_on"] == []
        # Alice goes on after the forget: new traffic is logged, a conversation of its own.
        after = converse(server, "alice", "alice topic 0")
        answered += converse(server, "bob", "bob after")
        sql = onjob("sql", "SELECT count(*) AS n FROM exchanges", "--server", server.base)
        assert sql.returncode == 0, sql.stderr
    assert len(answered) > 4
    logged = {r["id"] for r in rows(db, "SELECT id FROM exchanges WHERE api_key_id = 'bob'")}
    assert set(answered) <= logged  # every other answered exchange is in DuckDB
    kept_alice = rows(db, "SELECT id FROM exchanges WHERE api_key_id = 'alice'")
    assert [r["id"] for r in kept_alice] == after
    assert count(db, "feedback", "api_key_id = 'alice'") == 0
    assert count(db, "trajectories") == count(db, "exchanges", "turn = 0")
    assert rows(db, "SELECT api_key_id FROM forgotten") == [{"api_key_id": "alice"}]


def test_forget_a_conversation_in_a_database_no_server_holds(tmp_path, fake_engine_url):
    db = tmp_path / "onjob.duckdb"
    with serve(tmp_path, fake_engine_url) as server:
        gone = converse(server, "bob", "forget me", turns=3)
        kept = converse(server, "bob", "keep me")
        post_feedback(server, "bob", gone[1])
        post_feedback(server, "bob", kept[0])
        # While the server holds the file, --db says so and what to do.
        held = onjob("forget", "--db", str(db), "--trajectory", "x")
        assert held.returncode == 2 and "onjob serve" in held.stderr
    judged_and_trained(db, gone[1])
    # The runs' snapshots, kept beside the checkpoints: one holds the doomed group.
    snapshots = tmp_path / "ckpts" / ".snapshots"
    snapshots.mkdir(parents=True)
    for name, group in (("ckpt-a", "grp-1"), ("ckpt-other", "grp-other")):
        pq.write_table(pa.table({"group_id": [group, group]}), snapshots / f"{name}.parquet")
    trajectory = rows(db, "SELECT trajectory_id FROM exchanges WHERE id = ?", [gone[0]])[0]
    done = onjob(
        "forget",
        "--db",
        str(db),
        "--trajectory",
        trajectory["trajectory_id"],
        ONJOB_TRAINER__CHECKPOINTS_DIR=str(tmp_path / "ckpts"),
    )
    assert done.returncode == 0, done.stderr
    assert [p.name for p in snapshots.iterdir()] == ["ckpt-other.parquet"]
    assert "removed the training snapshot" in done.stdout
    assert "forgot trajectory" in done.stdout and "3 exchanges" in done.stdout
    # The run that used its group, and the checkpoint trained on top of that one.
    listed = done.stdout.split("checkpoints already trained on the deleted data")[1]
    assert "ckpt-a" in listed and "ckpt-b" in listed and "ckpt-other" not in listed
    # Whose adapter each is, and what taking it out of service takes.
    assert "lineage=agent@acme" in listed
    assert "removing it: it is the live adapter of agent@acme: promote another in its " in listed
    assert "`onjob canary agent --tenant acme CKPT`" in listed
    for table in ("groups", "members", "judgements", "scores"):
        assert count(db, table) == 0, table
    assert count(db, "exchanges", "list_contains(?, id)", [gone]) == 0
    assert {r["id"] for r in rows(db, "SELECT id FROM exchanges")} == set(kept)
    assert [r["exchange_id"] for r in rows(db, "SELECT exchange_id FROM feedback")] == [kept[0]]
    assert count(db, "scenarios") == 1 and count(db, "trajectories") == 1
    assert count(db, "checkpoints") == 3  # listed, never deleted: deciding is the operator's


def test_forget_names_exactly_one_thing(tmp_path):
    with pytest.raises(ForgetError):
        Forget()
    with pytest.raises(ForgetError):
        Forget(trajectory="t", api_key="k")
    both = onjob(
        "forget", "--db", str(tmp_path / "x.duckdb"), "--trajectory", "t", "--api-key", "k"
    )
    assert both.returncode == 2 and "not allowed with" in both.stderr
    bad = onjob("forget", "--db", str(tmp_path / "x.duckdb"), "--before", "last week")
    assert bad.returncode == 2 and "not a date" in bad.stderr


def _lines(placement, n: int, api_key_id: str, ts: float) -> list[bytes]:
    out = []
    for i in range(n):
        out.append(
            encode(
                ExchangeRecord(
                    id=f"chatcmpl-{placement.trajectory_id}-{i}",
                    ts=ts + i,
                    trajectory_id=placement.trajectory_id,
                    turn=i,
                    scenario_id=placement.scenario_id,
                    scenario_key=placement.scenario_key,
                    scenario_keyed=placement.scenario_keyed,
                    api_key_id=api_key_id,
                )
            )
        )
    out.append(
        encode(
            FeedbackRecord(
                id=f"fb-{placement.trajectory_id}",
                ts=ts,
                trajectory_id=placement.trajectory_id,
                api_key_id=api_key_id,
                value=1,
            )
        )
    )
    return out


def test_loading_a_spool_segment_again_never_brings_deleted_rows_back(tmp_path):
    s = Stitcher()
    now = time.time()
    alice = s.place([{"role": "user", "content": "a"}], api_key_id="alice")
    bob = s.place([{"role": "user", "content": "b"}], api_key_id="bob")
    old = s.place([{"role": "user", "content": "old"}], api_key_id="bob")
    segment = tmp_path / "000000000001-run.jsonl"
    lines = _lines(alice, 2, "alice", now - 10) + _lines(old, 1, "bob", now - 40 * 86400)
    segment.write_bytes(b"\n".join(lines) + b"\n")
    kept = tmp_path / "000000000002-run.jsonl"
    kept.write_bytes(b"\n".join(_lines(bob, 2, "bob", now - 10)) + b"\n")
    store = Store(tmp_path / "db.duckdb")
    try:
        assert store.load_segment(segment) == 3 and store.load_segment(kept) == 2
        assert forget(store, Forget(api_key="alice")).exchanges == 2
        assert forget(store, Forget(before=_days_ago(30))).exchanges == 1
        # The same lines again: a segment replayed after a crash, or one spooled before the
        # forget and loaded after it.
        for name in ("000000000003-again.jsonl", "000000000004-late.jsonl"):
            shutil.copy(segment, tmp_path / name)
            assert store.load_segment(tmp_path / name) == 0
        ids = {r["id"] for r in store.dicts("SELECT id FROM exchanges")}
        assert ids == {f"chatcmpl-{bob.trajectory_id}-{i}" for i in range(2)}
        feedback = store.dicts("SELECT api_key_id FROM feedback")
        assert feedback == [{"api_key_id": "bob"}]
        # Alice's traffic after the forget is hers to keep.
        late = s.place([{"role": "user", "content": "new"}], api_key_id="alice")
        newer = tmp_path / "000000000005-new.jsonl"
        newer.write_bytes(b"\n".join(_lines(late, 1, "alice", time.time() + 1)) + b"\n")
        assert store.load_segment(newer) == 1
    finally:
        store.close()


def _days_ago(days: float):
    import datetime as dt

    return dt.datetime.now(dt.UTC) - dt.timedelta(days=days)


def test_retention_deletes_old_conversations_in_the_running_server(tmp_path, fake_engine_url):
    db = tmp_path / "onjob.duckdb"
    env = {
        "ONJOB_COLLECTOR__RETENTION_DAYS": str(3 / 86400),  # three seconds
        "ONJOB_COLLECTOR__RETENTION_CHECK_S": "0.2",
    }
    with serve(tmp_path, fake_engine_url, **env) as server:
        first = converse(server, "alice", "soon old")

        def logged(ids: list[str]) -> int:
            query = "SELECT count(*) FROM exchanges WHERE list_contains(?, id)"
            r = httpx.post(
                f"{server.base}/admin/sql",
                json={"query": query.replace("?", json.dumps(ids).replace('"', "'"))},
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            assert r.status_code == 200, r.text
            return r.json()["rows"][0][0]

        deadline = time.monotonic() + 30
        while logged(first) < len(first):  # loaded from the spool
            assert time.monotonic() < deadline, "the conversation was never loaded"
            time.sleep(0.05)
        while logged(first):  # polled: it goes once three seconds have passed
            assert time.monotonic() < deadline, "retention never deleted the conversation"
            time.sleep(0.2)
    assert count(db, "exchanges", "list_contains(?, id)", [first]) == 0
    assert rows(db, "SELECT actor FROM forgotten") == [{"actor": "retention"}]


def record_of(key: str, text: str) -> ExchangeRecord:
    return ExchangeRecord(
        id=f"chatcmpl-{text}",
        ts=time.time(),
        scenario_key="k",
        scenario_keyed="k",
        api_key_id=key,
        request=json.dumps({"messages": [{"role": "user", "content": text}]}).encode(),
    )


def test_forget_leaves_no_copy_it_can_reach_and_says_which_it_cannot(tmp_path, fake_engine_url):
    """After `forget`, the WAL no longer holds the key's text, its lines set aside in
    failed/ are gone (another key's stay), and the answer lists what onjob cannot reach."""
    db, spool = tmp_path / "onjob.duckdb", tmp_path / "onjob.duckdb.spool"
    marker = "bob-wal-5e0c7a"
    with serve(tmp_path, fake_engine_url) as server:
        client = OpenAI(base_url=server.url, api_key=KEYS["bob"], max_retries=0, timeout=30)
        client.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": marker}]
        )
        (spool / "failed").mkdir(exist_ok=True)
        aside = spool / "failed" / "0000000000001-0000000000002-w-000001-line2.jsonl"
        aside.write_bytes(
            encode(record_of("bob", "bob-aside-1"))
            + b"\n"
            + encode(record_of("alice", "alice-aside-1"))
            + b"\n"
        )
        aside.with_name(aside.name + ".error").write_text("why\n")
        onjob("sql", "SELECT count(*) FROM exchanges", "--server", server.base)  # loads
        assert marker.encode() in b"".join(
            p.read_bytes() for p in tmp_path.glob("onjob.duckdb*") if p.is_file()
        )
        done = onjob("forget", "--api-key", "bob", "--server", server.base, "--json")
        assert done.returncode == 0, done.stderr
        wal = Path(f"{db}.wal")
        assert not wal.exists() or marker.encode() not in wal.read_bytes()
        text = done.stdout
        plain = onjob("forget", "--api-key", "bob", "--server", server.base)
        assert plain.returncode == 0, plain.stderr
    out = json.loads(text)
    assert out["checkpointed"] is True and out["exchanges"] == 1
    assert out["set_aside_removed"] == 1 and out["set_aside_kept"] == 1
    assert b"bob-aside" not in aside.read_bytes() and b"alice-aside-1" in aside.read_bytes()
    assert any("judge provider" in copy for copy in out["not_reached"])
    assert "onjob cannot reach these copies" in plain.stdout


def test_the_database_and_the_spool_are_the_owners_alone(tmp_path, fake_engine_url):
    db, spool = tmp_path / "onjob.duckdb", tmp_path / "onjob.duckdb.spool"
    with serve(tmp_path, fake_engine_url, ONJOB_COLLECTOR__FLUSH_INTERVAL_S="3600") as server:
        client = OpenAI(base_url=server.url, api_key=KEYS["bob"], max_retries=0, timeout=30)
        client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "x"}])
        onjob("sql", "SELECT count(*) FROM exchanges", "--server", server.base)  # loads
        wal = Path(f"{db}.wal")
        modes = {p.name: p.stat().st_mode & 0o777 for p in (db, wal, spool) if p.exists()}
        modes |= {p.name: p.stat().st_mode & 0o777 for p in spool.iterdir()}
    assert wal.name in modes and spool.name in modes and len(modes) > 3
    for name, mode in modes.items():
        assert mode in (0o600, 0o700), (name, oct(mode))
