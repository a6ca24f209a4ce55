"""`onjob serve --start-engine` keeps its engine child running.

A child that exits without being asked (a crash, an OOM kill, `kill -9`) is started again
after a back-off (1 s, 2 s, 4 s, ... at most 60 s), at most `engine.restarts` times within
`engine.restart_window_s`; one more death in that window and the server stops and exits 1,
so that whatever runs it (systemd, Kubernetes) sees the failure rather than a proxy that
answers 503 for ever. Meanwhile the proxy's pool finds the engine down (requests get 503
with `Retry-After`: when the child should serve again, `Eta`; `/health` is 503), and once
the child is back it loads the adapters the router sends to before serving them again
(`proxy/pool.py`).

The watcher is a thread of its own, and it starts the new child: Linux sends the child's
parent-death signal when the thread that forked it exits (`process._die_with_parent`), and
this thread lives as long as the child is meant to.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .process import OnjobProcess, PortTaken

log = logging.getLogger("onjob.serve")

_POLL_S = 0.5
_MAX_BACKOFF_S = 60.0


# Past the child's start: the proxy's health check finds it (every
# `proxy.health_interval_s`) and loads its adapters before serving through it.
_SERVING_S = 2.0


class Eta:
    """When the engine child being restarted should answer again, for the 503s the proxy
    answers meanwhile (`Retry-After`, `Pool.restart_eta`): written by the supervisor's
    thread, read on the event loop (plain assignments: a read between two of them tells
    a client a second or two off, nothing worse)."""

    def __init__(self, start_s: float = 10.0) -> None:
        self.start_s = start_s  # how long the child's last start took
        self.at: float | None = None  # monotonic: when it should serve again
        self.restarting = False  # from its death until it is started again

    def died(self, delay_s: float) -> None:
        """The child died and starts again after `delay_s`."""
        self.at, self.restarting = time.monotonic() + delay_s + self.start_s + _SERVING_S, True

    def back(self, start_s: float) -> None:
        """Started again, in `start_s`: the proxy serves through it once it sees it."""
        self.start_s, self.restarting = start_s, False
        self.at = time.monotonic() + _SERVING_S

    def back_in(self) -> float | None:
        """Seconds until the child should serve again (at least 1 while a restart running
        late is still under way), None when none is."""
        left = None if self.at is None else self.at - time.monotonic()
        if left is not None and left > 0:
            return max(1.0, left)
        return 1.0 if self.restarting else None


class Supervisor:
    """Watches `engine` (started) until `stop()`; calls `give_up(why)` once, when the
    child died more than `restarts` times within `window_s`."""

    def __init__(
        self,
        engine: OnjobProcess,
        *,
        restarts: int,
        window_s: float,
        give_up: Callable[[str], None],
        eta: Eta | None = None,
    ) -> None:
        self.engine = engine
        self.restarts = restarts
        self.window_s = window_s
        self.give_up = give_up
        self.eta = eta or Eta()
        self.started: list[float] = []  # when each restart began (monotonic)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="engine-supervisor", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching. A restart under way is cut short by stopping the engine after
        this (its `start` sees the child exit)."""
        self._stopping.set()
        self._thread.join(timeout=1)

    def _watch(self) -> None:
        while not self._stopping.wait(_POLL_S):
            proc = self.engine.proc
            if proc is None or (code := proc.poll()) is None:
                continue
            now = time.monotonic()
            recent = [t for t in self.started if now - t < self.window_s]
            last_lines = _tail(self.engine.output())
            if len(recent) >= self.restarts:
                self.give_up(
                    f"the engine child exited with code {code}, after {len(recent)} "
                    f"restarts within {self.window_s:.0f} s (engine.restarts = "
                    f"{self.restarts}); its last lines:\n{last_lines}"
                )
                return
            delay = min(_MAX_BACKOFF_S, 2.0 ** len(recent))
            self.eta.died(delay)
            log.warning(
                "the engine child (pid %d) exited with code %s; starting it again in %.0f s "
                "(restart %d of %d within %.0f s). Its last lines:\n%s",
                proc.pid,
                code,
                delay,
                len(recent) + 1,
                self.restarts,
                self.window_s,
                last_lines,
            )
            if self._stopping.wait(delay):
                return
            self.started.append(began := time.monotonic())
            self.engine.stop()  # what the dead child started and left behind (vLLM's core)
            try:
                self.engine.start()
            except (RuntimeError, TimeoutError, PortTaken) as exc:
                if not self._stopping.is_set():
                    log.error("starting the engine child again failed: %s", _tail(str(exc)))
                continue  # the child is not running: the next round counts it
            self.eta.back(time.monotonic() - began)
            log.warning("the engine child is back (pid %d)", self.engine.proc.pid)


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
