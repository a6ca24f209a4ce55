"""`onjob judge`: judge passes on a database no server holds (the server runs them in its
loop), or as one more worker on a DuckLake: each lineage's pass holding its work, a
lineage another worker holds passed by."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..collector import Collector
from ..judge import run_pass
from ..proxy.tenants import Tenants
from .act import holds
from .act.engine import engine_client
from .decide import fair, fit
from .errors import LineageBusy
from .settings import DeploySettings


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
                for lineage in Tenants.of(settings.proxy).lineages(settings.loop.alias):
                    try:
                        async with holds.held(collector, lineage.name):
                            report = await run_pass(
                                collector,
                                engine,
                                fit.judge_settings(settings, fitted),
                                echo=echo,
                                skip_scenarios=held,
                                untrained_keys=settings.proxy.untrained_keys,
                                key_budgets=fair.judge_shares(settings),
                                engine_logprobs=settings.proxy.engine_logprobs,
                                scope=lineage.scope,
                            )
                    except LineageBusy as busy:
                        echo(f"{lineage.name}: passed by, {busy}")
                        continue
                    echo(f"judge pass{lineage.of}: {report.summary()}")
                if once or settings.loop.interval_s <= 0:
                    return
                await asyncio.sleep(settings.loop.interval_s)
    finally:
        await collector.close()
