"""The proxy's Litestar app, composed from its rooms (`rooms/`): chat and legacy
completions, the Responses API, models and the OpenAPI document, feedback; `/health`;
`/metrics` when the server counts (`metrics.py`).

The upstream client and the collector are handed in (so tests can give an upstream over
an httpx `MockTransport`); the app starts the collector and closes both when it stops.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from litestar import Request, Response, get, route
from litestar import Router as Routes
from litestar.di import Provide
from litestar.exceptions import NotFoundException
from opentelemetry.trace import Tracer

from ..collector import CatalogUnreachable, Collector
from ..openai_errors import error_body
from ..openai_handlers import HANDLERS
from .auth import Doors
from .errors import Forbidden, Unauthorized, log_unavailable
from .front import ProxyApp
from .metrics import Metrics, Readings
from .metrics import routes as metrics_routes
from .pool import Pool, Replica
from .replicas import Forwarder
from .rooms import Serving, catalog, chat, feedback, responses
from .routing import Router
from .settings import ProxySettings
from .traffic import ARM_HEADER, EXCHANGE_HEADER, SCENARIO_HEADER, TRAJECTORY_HEADER, Traffic
from .upstream import Upstream

# The routes that carry the traffic, by path: answered without Litestar's machinery per
# request (`front.py`), by the same functions that stay Litestar's routes for the rest.
HOT = {
    "/v1/chat/completions": chat.chat_completions,
    "/v1/completions": chat.completions,
    "/v1/responses": responses.create_response,
}

__all__ = ["ARM_HEADER", "EXCHANGE_HEADER", "SCENARIO_HEADER", "TRAJECTORY_HEADER", "create_app"]


def create_app(
    settings: ProxySettings,
    *,
    upstream: Upstream,
    collector: Collector,
    tracer: Tracer | None = None,
    router: Router | None = None,
    routes: Sequence = (),
    on_startup: Sequence[Callable[[], Awaitable[None]]] = (),
    on_shutdown: Sequence[Callable[[], Awaitable[None]]] = (),
    forward: Forwarder | None = None,
    metrics: Metrics | None = None,
) -> ProxyApp:
    """The proxy's app. `upstream` is one engine, or a `Pool` of several (its `wanted` set
    by the caller); `router` (default: from `settings`) is the handle that changes an
    alias's arms while serving; `routes` are more handlers (the admin API). `on_startup`
    hooks run after the collector has started, and `on_shutdown` hooks before it closes
    (the server's background work). `forward` makes a proxy-only process (its collector
    only writes the spool): what needs the database goes to the primary server
    (`replicas.py`). `metrics` counts each exchange and answers `GET /metrics`, with the
    engines, the routing and the collector read at each scrape (a proxy-only process
    counts nothing: it forwards `/metrics` to the primary)."""
    if router is None:
        router = Router.from_settings(settings, upstream)
    pool = _pool(settings, upstream, router)
    traffic = Traffic(router, pool, collector, tracer, settings.lookup_wait_s, metrics)
    if metrics is not None:
        metrics.watch(Readings(pool, router, collector))
    # Who may call: checked before any handler runs (`auth.py`), by the front for the hot
    # routes and by a guard for the rest; handlers read the `Caller` it found.
    doors = Doors(settings)
    serving = Serving(settings, traffic, forward)

    async def shutdown() -> None:
        for hook in on_shutdown:
            await hook()
        if forward is not None:
            await forward.aclose()
        await pool.aclose()
        await collector.close()

    return ProxyApp(
        hot={path: partial(route.fn, serving=serving) for path, route in HOT.items()},
        doors=doors,
        route_handlers=[
            Routes(
                "/",
                guards=[doors.api_guard],
                dependencies={
                    "serving": Provide(lambda: serving, use_cache=True, sync_to_thread=False)
                },
                route_handlers=[
                    *HOT.values(),
                    responses.retrieve_response,
                    responses.response_input_items,
                    responses.delete_response,
                    catalog.models,
                    catalog.model,
                    catalog.openapi_document,
                    feedback.feedback,
                ],
            ),
            _health(collector, doors, pool),
            *([metrics_routes(metrics, doors)] if metrics is not None else []),
            *([_forwarded(doors, forward)] if forward is not None else []),
            *routes,
        ],
        on_startup=[collector.start, *on_startup, pool.start],
        on_shutdown=[shutdown],
        exception_handlers={
            **HANDLERS,
            NotFoundException: _no_route,
            CatalogUnreachable: log_unavailable,
        },
        request_max_body_size=settings.max_body_bytes,
        openapi_config=None,
        logging_config=None,  # the host application owns logging (and root stays quiet)
    )


def _no_route(request: Request, exc: NotFoundException) -> Response:
    """Litestar found no route: the commonest cause is a client's `base_url` without `/v1`,
    so a path that is an OpenAI route once `/v1` is put before it says so."""
    path = request.url.path
    message = f"no route {request.method} {path}"
    if not path.startswith("/v1/") and "/v1" + path in {r.path for r in request.app.routes}:
        base = str(request.base_url).rstrip("/")
        message += f": the OpenAI API is under /v1 (set the client's base_url to {base}/v1)"
    return Response(error_body(message, "not_found_error", 404), status_code=404)


def _pool(settings: ProxySettings, upstream: Upstream, router: Router) -> Pool:
    if isinstance(upstream, Pool):
        return upstream
    # One engine, unchecked: a lost adapter is answered 503 but not reloaded here.
    replica = Replica(upstream.base_url, upstream, logprobs=settings.engine_logprobs)
    return Pool([replica], wanted=router.adapters)


def _health(collector: Collector, doors: Doors, pool: Pool):
    @get("/health")
    async def health(request: Request) -> Response:
        # Up or not is anyone's to ask (load balancers, readiness probes): 503 while every
        # engine is down, as requests then are. This process's counters (the collector's,
        # the engines' states) tell how much traffic flows, every tenant's: the operator's
        # alone, so only the admin key reads them.
        doors.same_site(request.headers, host=False)
        down = pool.down
        answer: dict[str, Any] = {"status": "engine down" if down else "ok"}
        status = 503 if down else 200
        try:
            doors.admin(request.headers)
        except (Unauthorized, Forbidden):  # no admin key sent, or none configured
            return Response(answer, status_code=status)
        # The pid tells apart the processes answering on one port (`--workers`).
        engines = [r.state for r in pool.replicas]  # not their URLs: tenants hold API keys
        answer |= {"pid": os.getpid(), "engines": engines, "collector": collector.stats()}
        return Response(answer, status_code=status)

    return health


def _forwarded(doors: Doors, forward: Forwarder):
    @route(
        ["/admin/{rest:path}", "/dashboard", "/dashboard/{rest:path}", "/metrics"],
        http_method=["GET", "POST", "PUT", "PATCH", "DELETE"],
        include_in_schema=False,
        guards=[doors.forward_guard],
    )
    async def forwarded(request: Request) -> Any:
        """A proxy-only process: the admin API, the dashboard and the metrics are the
        primary's."""
        return await forward(request)

    return forwarded
