"""Starting the processes a bench measures: each on a free port, pinned to a core when
asked, its stderr in a file (not a pipe nobody reads), ready when an HTTP path answers 200."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from onjob.cli.process import free_port

__all__ = ["fake_engine_cmd", "free_port", "start"]


def start(
    cmd: list[str],
    port: int,
    core: int | None = None,
    env: dict | None = None,
    ready: str = "/health",
    cwd: Path | None = None,
    timeout: float = 120,
) -> subprocess.Popen:
    """`cmd` started (on `core` alone when given) and waited for until
    `http://127.0.0.1:<port><ready>` answers 200; its stderr shown if it exits first."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed when this process exits)
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=log,
        cwd=cwd,
        preexec_fn=None if core is None else lambda: os.sched_setaffinity(0, {core}),
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{cmd} exited: {log.read().decode(errors='replace')}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError(cmd)


def fake_engine_cmd(port: int, *flags: str) -> list[str]:
    """The command line of the fast fake engine (`onjob.testing.fake_upstream`) on `port`."""
    return [sys.executable, "-m", "onjob.testing.fake_upstream", "--port", str(port), *flags]
