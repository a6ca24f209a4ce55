"""Routing changes through the admin API and the CLI, on a real server and engine: a canary
set by hand serves its slice with its adapter loaded, survives a restart, is promoted;
each change is a `deployments` row; with no server the CLI records it for the next start."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import httpx
from openai import OpenAI

from onjob.cli.process import ServerProcess, free_port
from onjob.collector import Store
from onjob.deploy.act import registry

from .conftest import rows

# The columns of each table (schema.py), as the admin API has always answered them.
ROUTING_COLUMNS = ("ts", "model_alias", "live", "canary", "fraction", "reason", "actor", "evidence")
CHECKPOINT_COLUMNS = ("name", "parent", "base_model", "path", "created", "train_run", "status")
ONJOB = str(Path(sys.executable).with_name("onjob"))
ADMIN = {"Authorization": "Bearer adm-secret"}


def onjob(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ONJOB_PROXY__ADMIN_KEY": "adm-secret"}
    return subprocess.run([ONJOB, *args], capture_output=True, text=True, env=env, timeout=120)


def adapters_in(engine) -> set[str]:
    models = httpx.get(f"{engine.url}/models").json()["data"]
    return {m["id"] for m in models if m.get("parent")}


def test_canary_set_served_restored_after_restart_and_promoted(
    tmp_path, engine, tiny_adapter_dir, tiny_model_dir
):
    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    registry.add(store, tiny_adapter_dir, "cand-1", tiny_model_dir)
    store.close()
    port = free_port()
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__ADMIN_KEY": "adm-secret"}
    args = ["--engine-url", engine.url, "--db", str(db)]
    server_flag = ["--server", f"http://127.0.0.1:{port}"]
    try:
        with ServerProcess(args, port=port, env=env) as server:
            canary = {"alias": "agent", "checkpoint": "cand-1", "fraction": 0.5}
            assert httpx.post(f"{server.base}/admin/canary", json=canary).status_code == 401
            wrong = {"Authorization": "Bearer nope"}
            assert httpx.get(f"{server.base}/admin/status", headers=wrong).status_code == 401
            done = onjob("canary", "agent", "cand-1", "--fraction", "0.5", *server_flag)
            assert done.returncode == 0, done.stderr
            assert "canary cand-1 (50%)" in done.stdout
            assert "cand-1" in adapters_in(engine)  # loaded by the server

            client = OpenAI(base_url=server.url, api_key="unused", max_retries=0)
            arms = [
                client.chat.completions.with_raw_response.create(
                    model="agent", messages=[{"role": "user", "content": f"c{i}"}], max_tokens=2
                ).headers["x-onjob-arm"]
                for i in range(40)
            ]
            assert 5 < arms.count("canary") < 35

        httpx.post(f"{engine.url}/unload_lora_adapter", json={"lora_name": "cand-1"})
        assert "cand-1" not in adapters_in(engine)
        with ServerProcess(args, port=port, env=env) as server:
            status = httpx.get(f"{server.base}/admin/status", headers=ADMIN).json()
            assert status["aliases"]["agent"] == {"live": None, "canary": "cand-1", "fraction": 0.5}
            # The rows as JSON objects, each column by name, times as ISO strings.
            [change] = status["deployments"]
            assert change.keys() == set(ROUTING_COLUMNS)
            assert (change["canary"], change["actor"]) == ("cand-1", "admin-api")
            assert datetime.fromisoformat(change["ts"]).tzinfo is not None
            listed = httpx.get(f"{server.base}/admin/checkpoints", headers=ADMIN).json()
            [checkpoint] = listed["checkpoints"]
            assert checkpoint.keys() == set(CHECKPOINT_COLUMNS)
            assert (checkpoint["name"], checkpoint["status"]) == ("cand-1", "canary")
            assert datetime.fromisoformat(checkpoint["created"]).tzinfo is not None
            assert "cand-1" in adapters_in(engine)  # reloaded at start
            done = onjob("promote", "agent", "--reason", "it won", *server_flag)
            assert done.returncode == 0, done.stderr
            assert "live cand-1" in done.stdout
            r = OpenAI(base_url=server.url, api_key="unused").chat.completions.with_raw_response
            reply = r.create(
                model="agent", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
            assert reply.headers["x-onjob-arm"] == "live"
            done = onjob("rollback", "agent", *server_flag)
            assert done.returncode == 2 and "no canary to roll back" in done.stderr
            listed = onjob("status", *server_flag)
            assert "agent: live cand-1" in listed.stdout and "it won" in listed.stdout
    finally:
        httpx.post(f"{engine.url}/unload_lora_adapter", json={"lora_name": "cand-1"})

    served = rows(db, "SELECT checkpoint, arm FROM exchanges WHERE arm = 'live' ORDER BY ts")
    assert served[-1]["checkpoint"] == "cand-1"
    history = rows(db, "SELECT * FROM deployments ORDER BY ts")
    assert [(h["live"], h["canary"], h["actor"]) for h in history] == [
        (None, "cand-1", "admin-api"),
        ("cand-1", None, "admin-api"),
    ]
    assert history[1]["reason"] == "it won"
    assert rows(db, "SELECT status FROM checkpoints") == [{"status": "live"}]


def test_with_no_server_the_cli_records_the_change_for_the_next_start(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    registry.add(store, tiny_adapter_dir, "cand-2", tiny_model_dir)
    store.close()
    nowhere = ["--server", f"http://127.0.0.1:{free_port()}", "--db", str(db)]
    done = onjob("canary", "agent", "cand-2", "--fraction", "0.2", *nowhere)
    assert done.returncode == 0, done.stderr
    assert "recorded in the database" in done.stdout
    status = onjob("status", *nowhere)
    assert "agent: live base, canary cand-2 (20%)" in status.stdout
    done = onjob("canary", "agent", "missing", *nowhere)
    assert done.returncode == 2 and "not in the checkpoints table" in done.stderr
    done = onjob("rollback", "agent", *nowhere)
    assert done.returncode == 0
    assert rows(db, "SELECT status FROM checkpoints") == [{"status": "retired"}]
