"""An engine started by `onjob serve --start-engine` never outlives the server (issue 36
item 7): killed with SIGKILL, where none of the server's shutdown code runs, its engine
exits too; and a start that finds the engine's port already served refuses, naming what
serves it, instead of serving through an engine it did not start (and makes no database
nor key first). The child's adapter token is kept beside the database, where `onjob
doctor` finds it. Real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx

from onjob.cli.process import ServerProcess, free_port

from .conftest import admin_of
from .test_serve_stopping import alive, children


def test_the_engine_dies_with_a_killed_server_and_a_second_start_on_its_port_refuses(
    tmp_path, tiny_model_dir
):
    engine_port = free_port()
    url = f"http://127.0.0.1:{engine_port}/v1"
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_ENGINE__ARGS": json.dumps(["--model", str(tiny_model_dir), "--threads", "1"]),
    }
    args = ["--start-engine", "--engine-url", url, "--db", str(tmp_path / "db")]
    server = ServerProcess(args, env=env).start()
    engine_pid = 0
    try:
        [engine_pid] = children(server.proc.pid)
        served = httpx.get(f"{url}/models", timeout=10).json()["data"][0]["id"]

        # A second server asked to start an engine on the same port refuses before
        # starting anything, and says what holds the port.
        again = [*args[:3], "--db", str(tmp_path / "db2"), "--port", str(free_port())]
        second = subprocess.run(
            [sys.executable, "-m", "onjob.cli", "serve", *again],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env},
        )
        assert second.returncode == 2, second.stderr
        assert f"port {engine_port} is already taken (it serves {served}" in second.stderr
        assert "drop --start-engine and point --engine-url at it" in second.stderr
        assert alive(engine_pid)  # the refusal touched nothing
        # Not even its database, nor the admin key it would have shown once.
        assert not any(p.name.startswith("db2") for p in tmp_path.iterdir())

        # The child's adapter routes answer only the token the server keeps beside its
        # database (0600), which `onjob doctor` finds there as the server's other commands do.
        token = tmp_path / "db.engine-token"
        assert token.stat().st_mode & 0o777 == 0o600
        refused = httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "x"}, timeout=10)
        assert refused.status_code == 401
        doctor = subprocess.run(
            [sys.executable, "-m", "onjob.cli", "doctor", "--engine-url", url],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, **env, "ONJOB_COLLECTOR__DB": str(tmp_path / "db")},
            cwd=tmp_path,
        )
        assert "ok       runtime LoRA loading" in doctor.stdout, doctor.stdout + doctor.stderr

        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while alive(engine_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(engine_pid), "the engine outlived the server killed with SIGKILL"
    finally:
        server.kill()
        if engine_pid and alive(engine_pid):
            os.kill(engine_pid, signal.SIGKILL)


def test_a_killed_engine_child_is_seen_restarted_and_past_its_limit_the_server_exits_1(
    tmp_path, tiny_model_dir
):
    """Was a zombie child, 502 "cannot reach the engine" with no Retry-After, and /health
    answering ok for ever."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__HEALTH_INTERVAL_S": "0.2",
        "ONJOB_ENGINE__RESTARTS": "1",  # one restart, then the next death ends the server
        "ONJOB_ENGINE__ARGS": json.dumps(["--model", str(tiny_model_dir), "--threads", "1"]),
    }
    args = ["--start-engine", "--engine-url", url, "--db", str(tmp_path / "db")]
    log = tmp_path / "serve.log"
    server = ServerProcess(args, env=env, log=log).start()
    chat = {"model": "agent", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        [first] = children(server.proc.pid)
        assert httpx.post(f"{server.url}/chat/completions", json=chat, timeout=60).is_success
        os.kill(first, signal.SIGKILL)

        # Seen at once: the next request is a 503 to retry (logged), and /health is not ok.
        down = httpx.post(f"{server.url}/chat/completions", json=chat, timeout=30)
        # 2 s, or the restart's estimate once the supervisor has seen the death.
        assert down.status_code == 503 and int(down.headers["Retry-After"]) >= 2, down.text
        assert "No engine answers" in down.json()["error"]["message"]
        assert down.headers["X-Onjob-Exchange-Id"]
        admin = admin_of(server)  # the engines' states are the operator's to read
        deadline = time.monotonic() + 10  # the refusal wakes the pool's health check
        while (health := httpx.get(f"{server.base}/health", headers=admin)).status_code != 503:
            assert time.monotonic() < deadline, health.text
            time.sleep(0.05)
        assert (health.json()["status"], health.json()["engines"]) == ("engine down", ["down"])

        # Started again by the server, and served through once its health check passes.
        deadline = time.monotonic() + 120
        while (health := httpx.get(f"{server.base}/health", headers=admin)).status_code != 200:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        assert (health.json()["status"], health.json()["engines"]) == ("ok", ["up"])
        [second] = children(server.proc.pid)
        assert second != first and not alive(first)
        answered = httpx.post(f"{server.url}/chat/completions", json=chat, timeout=60)
        assert answered.status_code == 200, answered.text
        assert "starting it again in 1 s (restart 1 of 1 within 600 s)" in log.read_text()

        # A second death within the window: the server stops, exit 1, saying why.
        os.kill(second, signal.SIGKILL)
        assert server.proc.wait(timeout=60) == 1
        said = log.read_text()
        assert "onjob serve: the engine child exited with code -9, after 1 restarts" in said
    finally:
        server.kill()


def test_an_openai_client_rides_through_an_engine_restart(tmp_path, tiny_model_dir):
    """While its engine child is being started again, the server's 503s say when to come
    back: the restart's own estimate (its back-off, the child's last start, the proxy's
    look), not the 2 s an `openai` client waits twice and then gives up on (a restart
    of the bundled model takes 7 s on 2 cores)."""
    from openai import OpenAI

    url = f"http://127.0.0.1:{free_port()}/v1"
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__HEALTH_INTERVAL_S": "0.2",
        "ONJOB_ENGINE__ARGS": json.dumps(["--model", str(tiny_model_dir), "--threads", "1"]),
    }
    args = ["--start-engine", "--engine-url", url, "--db", str(tmp_path / "db")]
    server = ServerProcess(args, env=env, log=tmp_path / "serve.log").start()
    chat = {"model": "agent", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        [first] = children(server.proc.pid)
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:  # a probe: the supervisor has seen the death and is restarting it
            down = httpx.post(f"{server.url}/chat/completions", json=chat, timeout=30)
            assert down.status_code == 503, down.text  # the restart takes seconds
            if int(down.headers["Retry-After"]) > 2:
                break
            assert time.monotonic() < deadline, down.headers
            time.sleep(0.05)
        assert int(down.headers["Retry-After"]) <= 60  # what clients honour
        client = OpenAI(base_url=server.url, api_key="unused", timeout=60)  # 2 retries
        reply = client.chat.completions.create(**chat)
        assert reply.choices[0].message is not None
        [second] = children(server.proc.pid)
        assert second != first
    finally:
        server.kill()
