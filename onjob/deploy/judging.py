"""`onjob judge`, and the judge's client to the engine (the server runs the judge in its loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from ..collector import Collector
from ..judge import run_pass
from . import fair, fit
from .settings import DeploySettings


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


async def judge(settings: DeploySettings, *, once: bool, echo: Callable[[str], None]) -> None:
    """`onjob judge`: passes on a database no server holds, every `loop.interval_s` or once;
    like the loop's, they leave the held-out slice alone."""
    collector = Collector(settings.collector)
    await collector.start()
    try:
        async with engine_client(settings) as engine:
            while True:
                fitted = await collector.query(lambda st: fit.current(st, settings))
                held = await collector.query(lambda st: fit.held_out(st, settings))
                report = await run_pass(
                    collector,
                    engine,
                    fit.judge_settings(settings, fitted),
                    echo=echo,
                    skip_scenarios=held,
                    untrained_keys=settings.proxy.untrained_keys,
                    key_budgets=fair.judge_shares(settings),
                    engine_logprobs=settings.proxy.engine_logprobs,
                )
                echo(f"judge pass: {report.summary()}")
                if once or settings.loop.interval_s <= 0:
                    return
                await asyncio.sleep(settings.loop.interval_s)
    finally:
        await collector.close()
