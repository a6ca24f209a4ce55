"""Background work gives way to users' requests.

The engine serves users first (each of onjob's own requests carries a background
`priority`: `sampling.BACKGROUND`). Besides, before each of its requests the judge's
re-sampling and the offline test's pairs read the engine's queue (`GET /metrics`) and
wait while requests other than their own are there that background work would slow:

- on the local engine (it states `onjob:users_first` 1: a background sequence gives its
  batch slot to a user's), requests queued (`vllm:num_requests_waiting`): users waiting
  for a slot are not made to wait longer by work that could come later;
- on an engine without it (vLLM), requests running too (`vllm:num_requests_running`):
  its scheduler orders the queue by priority but decodes every running sequence in one
  batch, so on a CPU each background row admitted beside a user's slows the user's
  every token (measured: offline-test pairs beside users took their p50 from 1.6 s to
  14.8 s, `docs/benchmarks.md`). vLLM counts each of a request's `n` answers as a
  request of its own, so our own are counted so there.

The wait backs off (0.5 s doubling to 8 s) and ends after `MOST_WAIT_S` whatever the
queue: under traffic that never lets up, background work still moves, behind users in
the engine's own order. An engine whose `/metrics` cannot be read (not served, a proxy
in between) is not waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("onjob.judge")

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
USERS_FIRST = "onjob:users_first"  # the local engine's (engine/answers.py)
MOST_WAIT_S = 60.0  # per request: background work is slowed by users, never stopped


@dataclass(frozen=True)
class Queue:
    """The engine's queue as its `/metrics` states it."""

    waiting: int
    running: int
    users_first: bool  # the engine itself gives users' requests its background slots

    def others(self, requests: int, answers: int) -> int:
        """Requests not ours (`requests` of ours in flight, `answers` sequences) that
        background work would slow (see the module's docstring)."""
        if self.users_first:
            return self.waiting - requests
        return self.waiting + self.running - answers


class Admission:
    """One pass's (or one paired round's) background requests, each of `n` answers: each
    is admitted when the engine holds none but its own that it would slow."""

    def __init__(
        self,
        engine: httpx.AsyncClient,
        echo: Callable[[str], None] = log.info,
        most_wait_s: float = MOST_WAIT_S,
        n: int = 1,
    ) -> None:
        self.engine = engine
        self.echo = echo
        self.most_wait_s = most_wait_s
        self.n = n
        self.in_flight = 0  # admitted and not answered: these may be in the queue
        self.waited_s = 0.0  # over every request so far
        self._said = False

    @contextlib.asynccontextmanager
    async def admitted(self, requests: int = 1) -> AsyncIterator[None]:
        """`requests` of ours sent once the engine holds none but ours that they would
        slow (or the wait ends)."""
        await self._wait()
        self.in_flight += requests
        try:
            yield
        finally:
            self.in_flight -= requests

    async def _wait(self) -> None:
        delay = waited = 0.0
        while waited < self.most_wait_s:
            queue = await read_queue(self.engine)
            others = queue.others(self.in_flight, self.in_flight * self.n) if queue else 0
            if others <= 0:
                return
            if not self._said:
                self._said = True
                where = "queued" if queue.users_first else "queued or decoding"
                self.echo(
                    f"background work waits: {others} other request(s) {where} in the engine "
                    f"(users first; at most {self.most_wait_s:g} s per request)"
                )
            delay = min(delay * 2 or 0.5, 8.0)
            await asyncio.sleep(delay)
            waited += delay
            self.waited_s += delay


async def read_queue(engine: httpx.AsyncClient) -> Queue | None:
    """The engine's queue (vLLM's gauges, summed over their labels); None when its
    `/metrics` cannot be read or states no queue."""
    url = engine.base_url.copy_with(path="/metrics", query=None)
    try:
        resp = await engine.get(url, timeout=5.0)
        if resp.status_code != 200:
            return None
        families = list(text_string_to_metric_families(resp.text))
    except (httpx.HTTPError, ValueError):
        return None
    figures: dict[str, float] = {}
    for f in families:
        if f.name in (WAITING, RUNNING, USERS_FIRST):
            figures[f.name] = figures.get(f.name, 0.0) + sum(s.value for s in f.samples)
    if WAITING not in figures:
        return None
    return Queue(
        waiting=round(figures[WAITING]),
        running=round(figures.get(RUNNING, 0.0)),
        users_first=figures.get(USERS_FIRST, 0.0) > 0,
    )
