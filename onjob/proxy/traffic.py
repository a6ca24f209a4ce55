"""Forwarding one opened exchange to its engine and answering the client, in named steps:
`_attempt` (a canary that fails is answered by live: `_on_live`), then a stream relayed
(`stream.relay`) or a whole answer shaped; every outcome is logged before the answer's
end leaves, so a crash after that loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Response
from litestar.response import Stream
from opentelemetry.trace import Tracer

from .. import logprobs
from ..collector import Collector
from ..collector.ids import created_ms
from ..openai_errors import error_body
from . import telemetry
from .auth import Caller
from .errors import ProxyError, UpstreamStatus
from .exchange import COMPLETIONS, Exchange, Placing
from .metrics import Metrics
from .pool import Pool
from .routing import CANARY, Router
from .stream import Shape, relay
from .upstream import UpstreamResponse

log = logging.getLogger("onjob.proxy")

EXCHANGE_HEADER = "X-Onjob-Exchange-Id"
TRAJECTORY_HEADER = "X-Onjob-Trajectory"
SCENARIO_HEADER = "X-Onjob-Scenario"
ARM_HEADER = "X-Onjob-Arm"

Whole = Callable[[Exchange, bytes], bytes]  # shapes a whole answer for the client


def as_sent(exchange: Exchange, answer: bytes) -> bytes:
    """Chat and legacy completions: the answer as the exchange shaped it."""
    return answer


@dataclass
class Traffic:
    """What every hot route shares: the routing, the engines, the collector, the spans and
    the counters of `/metrics`."""

    router: Router
    pool: Pool
    collector: Collector
    tracer: Tracer | None = None
    lookup_wait_s: float = 10.0  # `proxy.lookup_wait_s`
    metrics: Metrics | None = None  # None: not counted (a proxy-only process)

    def finish(self, exchange: Exchange) -> None:
        """Hand the exchange to the collector: its spool line is written before the answer
        (or the stream's last event) leaves. Counted with the latency the line records."""
        record = exchange.record(self.collector.lineage)
        if self.metrics is not None:
            self.metrics.observe(exchange.route, exchange.status, record.latency_ms / 1000)
        try:
            self.collector.log(record)
        except OSError:
            log.exception("could not spool exchange %s", exchange.id)

    def placing(self, headers: Any, who: Caller) -> Placing:
        """Where the request goes and whose it is, for `Exchange.open`."""
        return Placing(
            router=self.router,
            api_key_id=who.api_key_id,
            trajectory_id=headers.get(TRAJECTORY_HEADER),
            scenario=headers.get(SCENARIO_HEADER),
            pin=headers.get(ARM_HEADER),
            any_checkpoint=who.admin,  # an API key pins only what its alias serves
        )

    async def lookup(self, query: Callable, key: str) -> Any:
        """Ask the database; if it does not know `key` yet, load the spool (what other proxy
        processes hold too) and ask again. An id made less than `lookup_wait_s` ago (an
        answer another host gave just now, on its way through the bucket) is waited for
        until then, asked again each time the loader loads."""
        collector = self.collector

        async def ask() -> Any:
            return await collector.query(lambda store: query(store, key))

        if found := await ask():
            return found
        born = created_ms(key)
        left_s = (born - time.time() * 1000) / 1000 + self.lookup_wait_s if born else 0.0
        if left_s <= 0:  # not an id of ours, or made long ago: one look at the spool
            await collector.caught_up()
            return await ask()
        deadline = time.monotonic() + left_s
        await collector.flush()
        while not (found := await ask()) and time.monotonic() < deadline:
            await asyncio.sleep(collector.settings.flush_interval_s)
        return found

    async def answer(
        self,
        exchange: Exchange,
        shape: Callable[[Exchange], Shape],
        whole: Whole = as_sent,
    ) -> Response | Stream:
        """Forward an opened exchange and answer: a stream in `shape`, or a whole answer
        shaped by `whole`."""
        span = telemetry.start(self.tracer, exchange)
        while True:  # twice at most: a failed canary is answered by live, which is not one
            try:
                resp, answer = await self._attempt(exchange)
                break
            except ProxyError as exc:
                if exchange.route.arm != CANARY:
                    return self._refused(exchange, span, exc)
                exchange, span = self._on_live(exchange, span, exc)
        headers = {EXCHANGE_HEADER: exchange.id, ARM_HEADER: exchange.route.arm}
        if exchange.stream:
            return Stream(
                relay(exchange, resp, span, shape(exchange), self.finish),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache"},
            )
        body = whole(exchange, answer)
        self.finish(exchange)
        telemetry.end(span, exchange)
        return Response(body, media_type="application/json", headers=headers)

    def _on_live(self, exchange: Exchange, span: Any, exc: ProxyError) -> tuple[Exchange, Any]:
        """The canary failed: its attempt is logged against it (an exchange with its arm
        and error), and the same request goes to the live arm in its place (the client
        has heard nothing yet)."""
        exchange.fail(exc.status, exc.message)
        self.finish(exchange)
        telemetry.end(span, exchange)
        exchange = exchange.rerouted(self.router.live(exchange.route))
        return exchange, telemetry.start(self.tracer, exchange)

    async def _attempt(self, exchange: Exchange) -> tuple[UpstreamResponse, bytes | None]:
        """Send the request; a whole answer is also read (by the pool, which replaces an
        engine that dies before it is complete) and shaped here, so that a canary whose
        answer is cut short or malformed is still retried on live. A stream is relayed
        as it comes, so it is only sent."""
        resp, raw, definition, stated = await self.pool.send(
            "/completions" if exchange.api == COMPLETIONS else "/chat/completions",
            exchange.upstream_body(),
            exchange.route.model,
            whole=not exchange.stream,
        )
        exchange.logprobs_mode = logprobs.recorded(
            definition, stated=stated, request=exchange.request
        )
        if exchange.stream:
            return resp, None
        return resp, exchange.answer(raw)

    def _refused(self, exchange: Exchange, span: Any, exc: ProxyError) -> Response:
        """No answer: logged like any exchange, so the client gets its id to post feedback
        or look it up, as with an error the engine itself sent."""
        exchange.fail(exc.status, exc.message)
        self.finish(exchange)
        telemetry.end(span, exchange)
        headers = {EXCHANGE_HEADER: exchange.id, ARM_HEADER: exchange.route.arm}
        if isinstance(exc, UpstreamStatus):
            return _passthrough(exc, headers)
        return Response(exc.body(), status_code=exc.status, headers={**headers, **exc.headers()})


def _passthrough(exc: UpstreamStatus, headers: dict) -> Response:
    """The engine's error as sent when it is OpenAI-shaped JSON, else wrapped in that shape."""
    try:
        ok = isinstance(msgspec.json.decode(exc.raw).get("error"), dict)
    except (msgspec.DecodeError, AttributeError):
        ok = False
    content = (
        exc.raw
        if ok
        else msgspec.json.encode(error_body(exc.message, "upstream_error", exc.status))
    )
    return Response(content, status_code=exc.status, media_type="application/json", headers=headers)
