"""Several proxy processes, one loader: real `onjob serve` processes sharing one spool
directory, a real engine with a real adapter as the canary, the `openai` client."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess

from .conftest import rows

ADMIN = "admin-secret"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}  # `/health`'s counters are its alone
SYSTEM = {"role": "system", "content": "You are the support agent of a shop. Answer briefly."}


def admin_sql(base: str, query: str) -> httpx.Response:
    """`onjob sql` through the admin API of the server at `base`."""
    return httpx.post(
        f"{base}/admin/sql",
        json={"query": query},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )


def servers(tmp_path, engine_url: str, canary: str | None = None, **env: str):
    """The primary (owns the database) and a proxy-only server sharing its spool."""
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__ADMIN_KEY": ADMIN, **env}
    if canary:
        env["ONJOB_PROXY__CANARIES"] = json.dumps(
            {"agent": {"checkpoint": canary, "fraction": 0.5}}
        )
    db = str(tmp_path / "onjob.duckdb")
    primary = ServerProcess(
        ["--engine-url", engine_url, "--db", db], env=env, log=tmp_path / "primary.log"
    ).start()
    proxy = ServerProcess(
        ["--engine-url", engine_url, "--db", db, "--primary", primary.base],
        env=env,
        log=tmp_path / "proxy.log",
    )
    try:
        proxy.start()
    except BaseException:
        primary.stop()
        raise
    return primary, proxy


def test_a_conversation_whose_turns_alternate_between_two_servers_is_one_trajectory_on_one_arm(
    tmp_path, engine, adapter_loaded
):
    primary, proxy = servers(tmp_path, engine.url, adapter_loaded)
    try:
        clients = [
            OpenAI(base_url=s.url, api_key="unused", max_retries=0, timeout=60)
            for s in (primary, proxy)
        ]
        arms: dict[int, set[str]] = {}
        sent: list[dict] = []
        for c in range(12):
            # One agent's system prompt: each server stores the conversations it starts
            # against an opening of its own making (linear.py), loaded by the primary.
            messages = [SYSTEM, {"role": "user", "content": f"conversation {c}"}]
            arms[c] = set()
            for turn in range(4):
                raw = clients[(c + turn) % 2].chat.completions.with_raw_response.create(
                    model="agent", messages=messages, max_tokens=3
                )
                sent.append({"model": "agent", "messages": list(messages), "max_tokens": 3})
                arms[c].add(raw.headers["x-onjob-arm"])
                reply = raw.parse().choices[0].message.content
                messages += [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": f"and then {turn}?"},
                ]
        # Through the proxy-only server, the admin API is the primary's.
        status = httpx.get(
            f"{proxy.base}/admin/status", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
        )
        assert status.status_code == 200
        assert status.json()["aliases"]["agent"]["canary"] == adapter_loaded
    finally:
        proxy.stop()
        primary.stop()
    assert all(len(a) == 1 for a in arms.values()), arms  # a conversation keeps its arm
    assert set().union(*arms.values()) == {"live", "canary"}
    db = tmp_path / "onjob.duckdb"
    logged = rows(
        db,
        "SELECT trajectory_id, list(turn ORDER BY turn) AS turns, list(DISTINCT arm) AS arms, "
        "min(request->>'$.messages[1].content') AS opening FROM exchanges_full GROUP BY 1",
    )
    assert len(logged) == 12
    assert all(r["turns"] == [0, 1, 2, 3] and len(r["arms"]) == 1 for r in logged)
    assert sorted(r["opening"] for r in logged) == sorted(f"conversation {c}" for c in range(12))
    # Every request reads back as the client sent it, whichever server stored it against
    # what (its previous turn, or an opening).
    full = rows(db, "SELECT request FROM exchanges_full")
    assert sorted(json.dumps(json.loads(r["request"]), sort_keys=True) for r in full) == sorted(
        json.dumps(s, sort_keys=True) for s in sent
    )
    opened = rows(db, "SELECT count(*) AS n FROM exchanges WHERE parent_id LIKE 'opn_%'")
    assert opened[0]["n"] >= 8  # each server's first conversation of the prompt is whole


def test_feedback_and_a_responses_chain_through_the_proxy_only_server_reach_the_primary(
    tmp_path, fake_engine_url
):
    primary, proxy = servers(tmp_path, fake_engine_url)
    try:
        first = OpenAI(base_url=primary.url, api_key="unused", max_retries=0).responses.create(
            model="agent", input="Hello"
        )
        via_proxy = OpenAI(base_url=proxy.url, api_key="unused", max_retries=0)
        second = via_proxy.responses.create(
            model="agent", input="And then?", previous_response_id=first.id
        )
        assert via_proxy.responses.retrieve(second.id).id == second.id
        fb = httpx.post(f"{proxy.url}/feedback", json={"exchange_id": second.id, "value": 1.0})
        assert fb.status_code == 200, fb.text
    finally:
        proxy.stop()
        primary.stop()
    logged = rows(tmp_path / "onjob.duckdb", "SELECT id, trajectory_id, turn FROM exchanges")
    assert {r["trajectory_id"] for r in logged} == {logged[0]["trajectory_id"]}
    assert sorted(r["turn"] for r in logged) == [0, 1]
    assert rows(tmp_path / "onjob.duckdb", "SELECT exchange_id FROM feedback") == [
        {"exchange_id": second.id}
    ]


def test_a_proxy_killed_with_its_segment_open_loses_nothing_it_answered(tmp_path, fake_engine_url):
    # The proxy never closes its segment by itself: the kill finds every line in it.
    primary, proxy = servers(tmp_path, fake_engine_url, ONJOB_COLLECTOR__ROTATE_S="3600")
    try:
        client = OpenAI(base_url=proxy.url, api_key="unused", max_retries=0)
        ids = [
            client.chat.completions.create(
                model="agent", messages=[{"role": "user", "content": f"q{i}"}]
            ).id
            for i in range(20)
        ]
        assert list((tmp_path / "onjob.duckdb.spool").glob("*.part"))
        proxy.kill()
        answer = admin_sql(primary.base, "SELECT id FROM exchanges")
        assert answer.status_code == 200, answer.text
        assert {r[0] for r in answer.json()["rows"]} == set(ids)
    finally:
        proxy.stop()
        primary.stop()


def pid_of(server: ServerProcess) -> int:
    """Which process answered a new connection (`/health` tells the admin key)."""
    return httpx.get(f"{server.base}/health", headers=AS_ADMIN, timeout=10).json()["pid"]


def test_workers_share_the_port_and_the_database(tmp_path, fake_engine_url):
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__ADMIN_KEY": ADMIN}
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", fake_engine_url, "--db", str(db), "--workers", "2"]
    with ServerProcess(args, env=env, log=tmp_path / "server.log") as server:
        pids, ids = set(), []
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:  # a new connection each time
            pids.add(pid_of(server))
        assert len(pids) == 2, "the kernel never handed a connection to the worker"
        for i in range(40):
            answer = httpx.post(
                f"{server.url}/chat/completions",
                json={"model": "agent", "messages": [{"role": "user", "content": f"w{i}"}]},
                timeout=30,
            )
            assert answer.status_code == 200
            ids.append(answer.json()["id"])
            status = httpx.get(
                f"{server.base}/admin/status",
                headers={"Authorization": f"Bearer {ADMIN}"},
                timeout=30,
            )
            assert status.status_code == 200  # answered by the primary, or forwarded to it
        worker = (pids - {server.proc.pid}).pop()
    with pytest.raises(ProcessLookupError):  # stopped with the server
        os.kill(worker, 0)
    logged = rows(db, "SELECT id FROM exchanges")
    assert {r["id"] for r in logged} == set(ids)


def test_with_the_loader_apart_only_workers_answer_and_nothing_is_lost(tmp_path, fake_engine_url):
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__ADMIN_KEY": ADMIN}
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", fake_engine_url, "--db", str(db), "--workers", "2", "--loader-apart"]
    with ServerProcess(args, env=env, log=tmp_path / "server.log") as server:
        pids, ids = set(), []
        for i in range(30):  # a new connection each time: the kernel picks a process
            pids.add(pid_of(server))
            answer = httpx.post(
                f"{server.url}/chat/completions",
                json={"model": "agent", "messages": [{"role": "user", "content": f"a{i}"}]},
                timeout=30,
            )
            assert answer.status_code == 200
            ids.append(answer.json()["id"])
        assert server.proc.pid not in pids, "the process that owns the database answered"
        assert len(pids) == 2
        # What needs the database goes through a worker to the primary.
        fb = httpx.post(f"{server.url}/feedback", json={"exchange_id": ids[0], "value": 1.0})
        assert fb.status_code == 200, fb.text
        answer = admin_sql(server.base, "SELECT count(*) FROM exchanges")
        assert answer.status_code == 200, answer.text
    for pid in pids:
        with pytest.raises(ProcessLookupError):  # stopped with the server
            os.kill(pid, 0)
    assert {r["id"] for r in rows(db, "SELECT id FROM exchanges")} == set(ids)
    assert rows(db, "SELECT exchange_id FROM feedback") == [{"exchange_id": ids[0]}]


def test_a_proxy_only_process_takes_no_loader_apart_flag(tmp_path):
    from onjob.cli.main import main

    args = ["serve", "--db", str(tmp_path / "x.duckdb"), "--primary", "http://127.0.0.1:9"]
    assert main([*args, "--loader-apart"]) == 2


def test_workers_are_started_without_the_primarys_own_flags():
    from onjob.cli.workers import worker_argv

    argv = worker_argv(["serve", "--workers", "3", "--loader-apart", "--port", "8000"], "http://x")
    assert argv[-5:] == ["serve", "--port", "8000", "--primary", "http://x"]
