"""`onjob serve` as a user runs it: settings from flags, variables and TOML; clear refusals;
and no answered exchange lost when the process is killed with SIGKILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess, free_port
from onjob.collector import Store


def onjob(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onjob.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_serve_refuses_to_listen_beyond_loopback_without_keys(tmp_path):
    result = onjob("serve", "--host", "0.0.0.0", "--db", str(tmp_path / "x.duckdb"))
    assert result.returncode == 2
    assert "refusing to listen on 0.0.0.0 with no API keys" in result.stderr


def test_settings_come_from_flags_then_variables_then_toml(tmp_path, engine):
    config = tmp_path / "onjob.toml"
    db = tmp_path / "from-toml.duckdb"
    config.write_text(
        f"""
[proxy]
port = {free_port()}
engine_url = "{engine.url}"

[proxy.aliases]
agent = ""
helper = ""

[collector]
db = "{db}"
"""
    )
    keys = {"ONJOB_PROXY__API_KEYS": json.dumps({"ops": "sk-ops"})}
    server = ServerProcess(["--config", str(config)], env=keys)  # --port P from the flag
    with server:
        assert httpx.get(f"{server.url}/models").status_code == 401
        listed = httpx.get(f"{server.url}/models", headers={"Authorization": "Bearer sk-ops"})
        assert [m["id"] for m in listed.json()["data"]] == ["agent", "helper", "tiny"]
        # A second server on the same database is refused with the reason.
        second = onjob("serve", "--config", str(config), "--port", str(free_port()), env=keys)
        assert second.returncode == 2 and "already running" in second.stderr
    assert db.exists()


def test_server_killed_mid_traffic_loses_no_answered_exchange(tmp_path, engine):
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", engine.url, "--db", str(db)]
    # Nothing is loaded into DuckDB before the kill: every exchange must come back from
    # the spool at the restart.
    env = {"ONJOB_COLLECTOR__FLUSH_INTERVAL_S": "3600"}
    server = ServerProcess(args, env=env).start()
    client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    answered: list[str] = []
    failed: list[Exception] = []
    enough = threading.Event()

    def one(i: int) -> None:
        messages = [{"role": "user", "content": f"question {i}"}]
        try:
            if i % 2:
                stream = client.chat.completions.create(
                    model="agent", messages=messages, max_tokens=12, stream=True
                )
                ids = {c.id for c in stream}  # the openai client ends a stream only at [DONE]
                (exchange_id,) = ids
            else:
                r = client.chat.completions.create(model="agent", messages=messages, max_tokens=12)
                exchange_id = r.id
        except Exception as exc:
            failed.append(exc)
            return
        answered.append(exchange_id)
        if len(answered) >= 12:
            enough.set()

    with ThreadPoolExecutor(6) as pool:
        for i in range(200):
            pool.submit(one, i)
        assert enough.wait(120), server.output()
        server.kill()
    assert len(failed) > 0, "the kill should have caught requests in flight"
    with ServerProcess(args):
        pass  # the restart replays the spool; stopping it loads everything
    store = Store(db)
    try:
        logged = {r["id"] for r in store.dicts("SELECT id FROM exchanges")}
    finally:
        store.close()
    assert set(answered) <= logged
    assert len(answered) >= 12


def test_serve_can_start_the_local_engine_as_its_child(tmp_path, tiny_model_dir):
    engine_port = free_port()
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        # The TOML's / variable's engine flags, then the command line's (which win).
        "ONJOB_ENGINE__ARGS": json.dumps(["--threads", "1", "--model", "/no/such/model"]),
    }
    url = f"http://127.0.0.1:{engine_port}/v1"
    args = ["--start-engine", "--engine-url", url, "--db", str(tmp_path / "db")]
    args += ["--backend", "local", "--model", str(tiny_model_dir)]
    with ServerProcess(args, env=env) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert reply.choices[0].message.content is not None
        assert httpx.get(f"{url}/models").status_code == 200
        # The child's adapter routes need the token the server made for it: another local
        # process cannot load or drop adapters.
        load = {"lora_name": "x", "lora_path": str(tiny_model_dir)}
        assert httpx.post(f"{url}/load_lora_adapter", json=load, timeout=30).status_code == 401
    with pytest.raises(httpx.TransportError):  # stopped with the server
        httpx.get(f"{url}/models", timeout=2)


def test_serve_with_the_vllm_backend_where_vllm_is_missing_says_so_and_exits(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    args = ["--start-engine", "--backend", "vllm", "--model", str(tmp_path), "--engine-url", url]
    # No vLLM virtualenv under this cache directory, and none in onjob's interpreter.
    done = onjob(
        "serve", *args, "--port", str(free_port()), "--db", str(tmp_path / "db"),
        env={"ONJOB_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    assert done.returncode != 0
    assert "`onjob engine install vllm`" in done.stderr and "Traceback" not in done.stderr
    # Engine flags without an engine to start are a usage error, not ignored.
    alone = onjob("serve", "--model", str(tmp_path))
    assert alone.returncode == 2 and "apply with --start-engine" in alone.stderr
