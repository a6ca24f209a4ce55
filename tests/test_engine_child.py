"""An engine started by `onjob serve --start-engine` never outlives the server (issue 36
item 7): killed with SIGKILL, where none of the server's shutdown code runs, its engine
exits too; and a start that finds the engine's port already served refuses, naming what
serves it, instead of serving through an engine it did not start. Real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx

from onjob.cli.process import ServerProcess, free_port

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
