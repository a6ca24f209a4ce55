"""The deploy machinery's client to the engine: the judge's samples, the operator's loads
and the health checks (off the hot path: httpx is fine here)."""

from __future__ import annotations

import httpx

from ..settings import DeploySettings


def engine_client(settings: DeploySettings, url: str | None = None) -> httpx.AsyncClient:
    """The judge's own client to the engine (off the hot path: httpx is fine here); with
    `url`, the same for another engine (the operator's loads and the health checks)."""
    token = settings.proxy.engine_token
    return httpx.AsyncClient(
        base_url=url or settings.proxy.engine_url,
        headers={"Authorization": f"Bearer {token}"} if token else None,
        timeout=httpx.Timeout(
            settings.judge.request_timeout_s, connect=settings.proxy.connect_timeout_s
        ),
    )
