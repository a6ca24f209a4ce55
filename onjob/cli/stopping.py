"""How `onjob serve` stops on SIGTERM, SIGINT or SIGHUP.

The first signal stops accepting connections, lets the requests in flight finish for
up to `proxy.shutdown_grace_s`, runs the shutdown hooks (the loop stops, the collector
loads its last exchanges into DuckDB), stops the engine child and exits 0. A second
signal exits at once: the engine child is sent SIGTERM and nothing is waited for.
Either way no answered exchange is lost: each was spooled before its answer left, and
the next start loads what DuckDB does not have.

uvicorn catches SIGINT and SIGTERM itself and, after its graceful shutdown, raises the
signal again with the default action restored: on SIGTERM the process died right
there, before the code that stops the engine child could run, and left it running. So
onjob owns the signals, and uvicorn's capture is switched off. The engine child runs in
a session of its own (`cli/process.py`), so a Ctrl-C in the terminal reaches `onjob
serve` alone, and the engine serves the requests in flight until it is stopped last.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from types import FrameType

import uvicorn

from .process import OnjobProcess

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Interrupted(Exception):
    """A signal arrived before the server was serving (while the engine child loads)."""


class Server(uvicorn.Server):
    """uvicorn's server, leaving the signals to `Signals`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Signals:
    """The process's SIGTERM and SIGINT handlers while `onjob serve` runs."""

    def __init__(self) -> None:
        self.server: uvicorn.Server | None = None
        self.engine: OnjobProcess | None = None
        self.received = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[Signals]:
        # A signal ignored at start stays ignored (`nohup onjob serve` keeps running when
        # its terminal closes).
        handled = [sig for sig in HANDLED if signal.getsignal(sig) is not signal.SIG_IGN]
        previous = {sig: signal.signal(sig, self._handle) for sig in handled}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        self.received += 1
        name = signal.Signals(sig).name
        if self.received > 1:
            self._say(f"{name} again: exiting now")
            if self.engine is not None and self.engine.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    self.engine.proc.terminate()
            os._exit(128 + sig)
        self._say(f"{name}: finishing the requests in flight, then stopping (again: now)")
        if self.server is None:
            raise Interrupted(name)
        self.server.should_exit = True

    @staticmethod
    def _say(text: str) -> None:
        # os.write: a signal handler may interrupt a print to stderr already under way.
        os.write(2, f"onjob serve: {text}\n".encode())
