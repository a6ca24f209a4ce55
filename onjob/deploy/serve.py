"""`onjob serve`: the proxy and the collector's writer in one asyncio process."""

from __future__ import annotations

import sys

import httpx

from ..collector import Collector, Store
from ..proxy import AiohttpUpstream, HttpxUpstream, ProxySettings, Upstream, create_app
from .settings import ServeSettings
from .telemetry import tracer


def build_upstream(p: ProxySettings) -> Upstream:
    if p.upstream_client == "httpx":
        client = httpx.AsyncClient(
            base_url=p.engine_url,
            timeout=httpx.Timeout(p.read_timeout_s, connect=p.connect_timeout_s),
            limits=httpx.Limits(max_connections=p.max_connections),
        )
        return HttpxUpstream(client)
    return AiohttpUpstream(
        p.engine_url,
        connect_timeout=p.connect_timeout_s,
        read_timeout=p.read_timeout_s,
        max_connections=p.max_connections,
    )


def build_app(settings: ServeSettings):
    upstream = build_upstream(settings.proxy)
    return create_app(
        settings.proxy,
        upstream=upstream,
        collector=Collector(settings.collector),
        tracer=tracer(settings.telemetry),
    )


def serve(settings: ServeSettings) -> None:
    import uvicorn

    # Open (and migrate) the database once up front: a locked or unreadable file is a
    # clear error here rather than a failed start-up hook inside uvicorn.
    Store(settings.collector.db).close()
    app = build_app(settings)
    p = settings.proxy
    print(
        f"onjob serve: http://{p.host}:{p.port}/v1 -> engine {p.engine_url}; "
        f"logging to {settings.collector.db}; models: {', '.join(p.aliases)}"
        + ("" if p.api_keys else " (no API keys: loopback only)"),
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=p.host, port=p.port, log_level="warning", access_log=False)
