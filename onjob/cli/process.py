"""`onjob engine` and `onjob serve` as child processes: started on a free port, ready when
`/health` answers. Used by the demo, the tests and the benchmarks."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import httpx

from ..errors import OnjobError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortTaken(OnjobError, RuntimeError):
    """The port a child is to listen on already answers: refused before starting it."""


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent: int):
    """A preexec_fn: the child gets SIGTERM when the process that started it dies, SIGKILL
    included (an OOM kill, a node drain), where no shutdown code of the parent runs. Linux
    keeps this across exec (`onjob engine --backend vllm` execs `vllm serve`) and sends it
    when the *thread* that forked exits, so start such a child from the main thread.
    SIGTERM, not SIGKILL: vLLM stops its own engine-core processes on SIGTERM."""

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            os._exit(127)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return preexec


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Something listens on `host:port`. SO_REUSEADDR as the servers set it, so a port a
    stopped engine left in TIME_WAIT counts as free and only a listening socket as taken."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def must_be_free(port: int, command: str) -> None:
    """`PortTaken`, saying what serves it and the ways out, when `port` already answers."""
    if port_taken(port):
        base = f"http://127.0.0.1:{port}"
        raise PortTaken(
            f"port {port} is already taken ({_served_models(base)}), so `onjob {command}` "
            f"cannot listen there: stop the process holding it (`ss -ltnp 'sport = :{port}'` "
            "names it); or, to use that engine as it is, drop --start-engine and point "
            "--engine-url at it; or start onjob's on another port, --engine-url "
            f"http://127.0.0.1:{port + 10}/v1 beside --start-engine"
        )


def _served_models(base: str) -> str:
    """What the engine already on a port says it serves, for the refusal's message."""
    try:
        reply = httpx.get(f"{base}/v1/models", timeout=2)
        names = [m.get("id") for m in reply.json().get("data", [])]
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        return "it does not answer GET /v1/models"
    return f"it serves {', '.join(map(str, names)) or 'no model'}"


class OnjobProcess:
    """`with EngineProcess(["--model", path]) as engine: engine.url` -> http://127.0.0.1:PORT/v1"""

    command = ""
    ready = frozenset({200})  # `/health` answers that mean the process serves

    def __init__(
        self,
        args: list[str] = (),
        *,
        port: int = 0,
        env: dict | None = None,
        timeout: float = 300,
        log: Path | None = None,
        new_session: bool = False,
        die_with_parent: bool = False,
    ) -> None:
        self.port = port or free_port()
        self.args = list(args)
        self.env = env
        self.timeout = timeout
        # In a session of its own the child gets none of the signals a terminal sends its
        # foreground group (Ctrl-C, hang-up): the parent decides when it stops.
        self.new_session = new_session
        # Off by default: Linux sends the signal when the starting *thread* exits, and the
        # tests and benchmarks start children from worker threads.
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen | None = None
        if log is None:  # a temporary log, removed with this object
            fd, log = tempfile.mkstemp(prefix=f"onjob-{self.command}-", suffix=".log")
            os.close(fd)
            weakref.finalize(self, os.unlink, log)
        # The child appends; reads go through a handle of their own, so they never move
        # the position the child writes at.
        self._log = open(log, "ab")  # noqa: SIM115 (lives as long as the process)
        self._reader = open(log, "rb")  # noqa: SIM115
        self._read = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/v1"

    def start(self) -> OnjobProcess:
        # A port already served would pass the readiness probe below while the child fails
        # to bind: onjob would serve through a process it did not start or configure (an
        # engine a killed server left behind holds its port and GPU memory).
        must_be_free(self.port, self.command)
        cmd = [sys.executable, "-m", "onjob.cli", self.command, "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*cmd, *self.args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(self.env or {})},
            start_new_session=self.new_session,
            # Always a process group of its own, which its children join: vLLM's API server
            # starts an engine core and a worker, which outlive an API server killed alone
            # (seen here: 2.5 GB each, orphaned under init), so `stop` and `kill` end the
            # group. A terminal's Ctrl-C reaches the parent alone, which stops the child.
            process_group=None if self.new_session else 0,
            preexec_fn=_die_with_parent(os.getpid()) if self.die_with_parent else None,
        )
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.command} exited with {self.proc.returncode}:\n{self.output()}"
                )
            try:
                if httpx.get(f"{self.base}/health", timeout=1).status_code in self.ready:
                    if self.proc.poll() is None:
                        return self
                    continue  # exited meanwhile: the next round raises with its output
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"{self.command} not ready after {self.timeout} s:\n{self.output()}")

    def output(self) -> str:
        """The last few KB of the log."""
        self._reader.seek(0)
        return self._reader.read().decode(errors="replace")[-4000:]

    def new_lines(self) -> list[str]:
        """The complete lines written since the last call."""
        self._reader.seek(self._read)
        text = self._reader.read()
        end = text.rfind(b"\n") + 1
        self._read += end
        return text[:end].decode(errors="replace").splitlines()

    def kill(self) -> None:
        """SIGKILL to the child and every process it started: no shutdown code runs
        (crash tests)."""
        if self.proc:
            self._kill_group()
            self.proc.wait()

    def stop(self) -> None:
        """SIGINT, 15 s to finish, then SIGKILL; and whatever the child started and left
        behind (an engine core, a worker) is killed too."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._kill_group()
                self.proc.wait()
        if self.proc:
            self._kill_group()

    def _kill_group(self) -> None:
        """SIGKILL to the child's process group (its pid: it leads one, `start`)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):  # none left
            os.killpg(self.proc.pid, signal.SIGKILL)

    def __enter__(self) -> OnjobProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class EngineProcess(OnjobProcess):
    command = "engine"


class ServerProcess(OnjobProcess):
    """`onjob serve`: pass `--engine-url` and `--db` in args."""

    command = "serve"
    ready = frozenset({200, 503})  # 503: serving, while its engine is down
