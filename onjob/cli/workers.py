"""`onjob serve --workers N`: N processes answer on one port, one of which owns the database.

The kernel spreads connections over N listening sockets bound to the same port
(`SO_REUSEPORT`). This process (the primary) loads the spool, stitches, judges, trains
and serves the admin API and the dashboard; the N - 1 others are proxy-only (`onjob
serve --primary URL`): they answer the OpenAI routes, write the shared spool, and
forward what needs the database to the primary over a loopback socket of its own
(`proxy/replicas.py`). With `--loader-apart` the primary listens on that socket alone and
N workers answer on the port: DuckDB's loading (a batch of the spool read into memory,
hundreds of MB at full load) then never shares a process, or a heap, with an answer.
A worker that dies is started again; what it spooled before it died is loaded (its open
segment is claimed, `collector/spool.py`).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time

from .settings import WARNED

log = logging.getLogger("onjob.serve")

# Flags of `onjob serve` that only the primary acts on (with the number of values each takes).
_PRIMARY_ONLY = {
    "--workers": 1,
    "--loader-apart": 0,
    "--start-engine": 0,
    "--backend": 1,
    "--model": 1,
}


def listening_socket(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    """A listening TCP socket; with `reuse_port`, others may bind the same port too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def worker_argv(argv: list[str], primary_url: str) -> list[str]:
    """A proxy-only worker's command line: this one's, without the primary's own flags."""
    out, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in _PRIMARY_ONLY:
            skip = _PRIMARY_ONLY[name] if "=" not in arg else 0
            continue
        out.append(arg)
    return [sys.executable, "-m", "onjob.cli", *out, "--primary", primary_url]


class Workers:
    """The proxy-only worker processes, started again when one dies, stopped with the server."""

    def __init__(self, argv: list[str], count: int) -> None:
        self.argv = argv
        self.procs: list[subprocess.Popen] = []
        self.count = count
        self._stopping = threading.Event()
        self._watch = threading.Thread(target=self._watching, name="onjob-workers", daemon=True)

    def start(self) -> None:
        self.procs = [self._spawn() for _ in range(self.count)]
        self._watch.start()

    def _spawn(self) -> subprocess.Popen:
        # Each in a process group of its own, so a terminal's Ctrl-C reaches only the primary,
        # which decides when they stop (SIGTERM). In the primary's session, not a new one:
        # Linux shares the CPU between sessions (autogroups) before it weighs priorities, so
        # a worker in a session of its own would get half a busy core against the loader's
        # niced thread (`collector.loader_nice`) instead of nearly all of it.
        # The environment as the primary's, which has warned of what no setting reads.
        env = {**os.environ, WARNED: "1"}
        return subprocess.Popen(self.argv, process_group=0, env=env)

    def _watching(self) -> None:
        while not self._stopping.wait(1.0):
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None and not self._stopping.is_set():
                    log.warning(
                        "worker %d (pid %d) exited with %s; starting it again",
                        i + 1,
                        proc.pid,
                        proc.returncode,
                    )
                    self.procs[i] = self._spawn()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM each (it finishes the requests in flight and closes its segment), then wait."""
        self._stopping.set()
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]
