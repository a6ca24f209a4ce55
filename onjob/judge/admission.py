"""Background work gives way to users' requests.

The engine serves users first (each of onjob's own requests carries a background
`priority`: `sampling.BACKGROUND`). Besides, before each of its requests the judge's
re-sampling and the offline test's pairs read the engine's queue (`GET /metrics`,
vLLM's `vllm:num_requests_waiting`, which the local engine states too) and wait while
requests other than their own are queued there: users waiting for a batch slot are not
made to wait longer by work that could come later. The wait backs off (0.5 s doubling
to 8 s) and ends after `MOST_WAIT_S` whatever the queue: under traffic that never
lets up, background work still moves, behind users in the engine's own order. An engine
whose `/metrics` cannot be read (not served, a proxy in between) is not waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("onjob.judge")

WAITING = "vllm:num_requests_waiting"
MOST_WAIT_S = 60.0  # per request: background work is slowed by users, never stopped


class Admission:
    """One pass's (or one paired round's) background requests: each is admitted when
    the engine's queue holds none but its own."""

    def __init__(
        self,
        engine: httpx.AsyncClient,
        echo: Callable[[str], None] = log.info,
        most_wait_s: float = MOST_WAIT_S,
    ) -> None:
        self.engine = engine
        self.echo = echo
        self.most_wait_s = most_wait_s
        self.in_flight = 0  # admitted and not answered: these may be in the queue
        self.waited_s = 0.0  # over every request so far
        self._said = False

    @contextlib.asynccontextmanager
    async def admitted(self, requests: int = 1) -> AsyncIterator[None]:
        """`requests` of ours sent once the queue holds none but ours (or the wait ends)."""
        await self._wait()
        self.in_flight += requests
        try:
            yield
        finally:
            self.in_flight -= requests

    async def _wait(self) -> None:
        delay = waited = 0.0
        while waited < self.most_wait_s:
            queued = await waiting(self.engine)
            others = (queued or 0) - self.in_flight
            if others <= 0:
                return
            if not self._said:
                self._said = True
                self.echo(
                    f"background work waits: {others} other request(s) queued in the engine "
                    f"(users first; at most {self.most_wait_s:g} s per request)"
                )
            delay = min(delay * 2 or 0.5, 8.0)
            await asyncio.sleep(delay)
            waited += delay
            self.waited_s += delay


async def waiting(engine: httpx.AsyncClient) -> int | None:
    """Requests queued in the engine (vLLM's gauge, summed over its labels); None when
    its `/metrics` cannot be read."""
    url = engine.base_url.copy_with(path="/metrics", query=None)
    try:
        resp = await engine.get(url, timeout=5.0)
        if resp.status_code != 200:
            return None
        families = list(text_string_to_metric_families(resp.text))
    except (httpx.HTTPError, ValueError):
        return None
    samples = [s.value for f in families if f.name == WAITING for s in f.samples]
    return round(sum(samples)) if samples else None
