"""`onjob serve` stopped as a process manager stops it: SIGTERM stops accepting, lets the
requests in flight finish (within proxy.shutdown_grace_s), flushes the collector, stops
the engine child and exits 0; a second signal exits at once. Real processes throughout;
the slow engine is a socket server (tests/fake_engine.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from onjob.cli.process import ServerProcess, free_port

from .conftest import rows
from .fake_engine import RawEngine, completion

CHAT = {"model": "agent", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children(pid: int) -> list[int]:
    """Its child processes, whichever of its threads started them (a restarted engine
    child is the supervisor thread's)."""
    tasks = Path(f"/proc/{pid}/task").glob("*/children")
    return [int(p) for task in tasks for p in task.read_text().split()]


def slow_engine(seconds: float) -> tuple[RawEngine, threading.Event]:
    """An engine that answers a chat request after `seconds`; the event is set when one
    arrives."""
    asked = threading.Event()

    def answer(conn, body):
        asked.set()
        time.sleep(seconds)
        payload = json.dumps(completion()).encode()
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}"
        )
        with contextlib.suppress(OSError):  # the proxy may have given up on it
            conn.sendall(head.encode() + b"\r\n\r\n" + payload)

    return RawEngine(answer), asked


def in_flight(server: ServerProcess, asked: threading.Event) -> dict:
    """Start one request through the proxy; return once the engine has it."""
    outcome: dict = {}

    def post():
        try:
            outcome["response"] = httpx.post(
                f"{server.url}/chat/completions", json=CHAT, timeout=60
            )
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    outcome["thread"] = threading.Thread(target=post)
    outcome["thread"].start()
    assert asked.wait(30), "the engine never got the request"
    return outcome


def exit_code(server: ServerProcess, within: float) -> int:
    try:
        return server.proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        pytest.fail(f"onjob serve still running {within} s after the signal:\n{server.output()}")


def terminal_ctrl_c(server: ServerProcess) -> None:
    """What a terminal does on Ctrl-C: SIGINT to the whole foreground process group."""
    os.killpg(os.getpgid(server.proc.pid), signal.SIGINT)


@pytest.mark.parametrize(
    "stop",
    [
        lambda server: server.proc.send_signal(signal.SIGTERM),  # a process manager
        terminal_ctrl_c,
        lambda server: server.proc.send_signal(signal.SIGHUP),  # the terminal closed
    ],
    ids=["sigterm", "ctrl-c", "sighup"],
)
def test_a_signal_stops_the_engine_child_last_and_exits_0(tmp_path, tiny_model_dir, stop):
    engine_port = free_port()
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_ENGINE__ARGS": json.dumps(["--model", str(tiny_model_dir), "--threads", "1"]),
    }
    url = f"http://127.0.0.1:{engine_port}/v1"
    args = ["--start-engine", "--engine-url", url, "--db", str(tmp_path / "db")]
    # In a session of its own, as in a terminal: a Ctrl-C does not reach pytest.
    with ServerProcess(args, env=env, new_session=True) as server:
        assert (
            httpx.post(f"{server.url}/chat/completions", json=CHAT, timeout=60).status_code == 200
        )
        [engine_pid] = children(server.proc.pid)
        # The terminal's signals reach the server alone; it stops the engine when done.
        assert os.getpgid(engine_pid) != os.getpgid(server.proc.pid)
        stop(server)
        assert exit_code(server, within=30) == 0, server.output()
        # A clean exit says nothing more (DuckDB's binding once reported "leaked" objects:
        # a frozen GC generation kept its module alive past its teardown).
        assert "leaked" not in server.output()
    deadline = time.monotonic() + 5
    while alive(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(engine_pid), "the engine child outlived onjob serve"
    assert rows(tmp_path / "db", "SELECT status FROM exchanges") == [{"status": 200}]


def test_a_request_in_flight_at_sigterm_is_answered_and_logged(tmp_path):
    engine, asked = slow_engine(2)
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    try:
        with ServerProcess(
            ["--engine-url", engine.url, "--db", str(tmp_path / "db")], env=env
        ) as server:
            outcome = in_flight(server, asked)
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            # No new connections once stopping.
            with pytest.raises(httpx.TransportError):
                httpx.post(f"{server.url}/chat/completions", json=CHAT, timeout=5)
            outcome["thread"].join(30)
            assert outcome["response"].status_code == 200
            assert exit_code(server, within=30) == 0, server.output()
    finally:
        engine.close()
    # The collector flushed it into DuckDB before the process left.
    assert rows(tmp_path / "db", "SELECT status FROM exchanges") == [{"status": 200}]


def test_requests_still_in_flight_after_the_grace_period_are_cut(tmp_path):
    engine, asked = slow_engine(60)
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__SHUTDOWN_GRACE_S": "1"}
    try:
        with ServerProcess(
            ["--engine-url", engine.url, "--db", str(tmp_path / "db")], env=env
        ) as server:
            outcome = in_flight(server, asked)
            started = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            assert exit_code(server, within=15) == 0, server.output()
            assert time.monotonic() - started < 10
            outcome["thread"].join(30)
            assert "response" not in outcome or outcome["response"].status_code != 200
    finally:
        engine.close()


def test_a_second_signal_exits_at_once(tmp_path):
    engine, asked = slow_engine(60)
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}  # the default grace: 30 s
    try:
        with ServerProcess(
            ["--engine-url", engine.url, "--db", str(tmp_path / "db")], env=env
        ) as server:
            in_flight(server, asked)
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            assert server.proc.poll() is None  # waiting for the request
            started = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            assert exit_code(server, within=5) != 0
            assert time.monotonic() - started < 3
    finally:
        engine.close()
