"""The judge as the server runs it (every `judge.interval_s`) and as `onjob judge` runs it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import httpx

from ..collector import Collector
from ..judge import JudgeError, run_pass
from .settings import ServeSettings

log = logging.getLogger("onjob.judge")


def engine_client(settings: ServeSettings) -> httpx.AsyncClient:
    """The judge's own client to the engine (off the hot path: httpx is fine here)."""
    return httpx.AsyncClient(
        base_url=settings.proxy.engine_url,
        timeout=httpx.Timeout(
            settings.judge.request_timeout_s, connect=settings.proxy.connect_timeout_s
        ),
    )


class PeriodicJudge:
    """`onjob serve`'s background judge: a pass every `interval_s`, one at a time; a pass
    that fails is logged and the next one tries again."""

    def __init__(self, collector: Collector, settings: ServeSettings) -> None:
        self.collector = collector
        self.settings = settings
        self._task: asyncio.Task | None = None
        self._engine: httpx.AsyncClient | None = None

    async def start(self) -> None:
        if self.settings.judge.interval_s > 0:
            self._engine = engine_client(self.settings)
            self._task = asyncio.create_task(self._run(), name="onjob-judge")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._engine:
            await self._engine.aclose()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.judge.interval_s)
            try:
                report = await run_pass(self.collector, self._engine, self.settings.judge)
                log.info("judge pass: %s", report.summary())
            except JudgeError as exc:
                log.error("judge pass stopped: %s", exc)
            except Exception:
                log.exception("judge pass failed; the next one tries again")


async def judge(settings: ServeSettings, *, once: bool, echo: Callable[[str], None]) -> None:
    """`onjob judge`: passes on a database no server holds, every `interval_s` or once."""
    collector = Collector(settings.collector)
    await collector.start()
    try:
        async with engine_client(settings) as engine:
            while True:
                report = await run_pass(collector, engine, settings.judge, echo=echo)
                echo(f"judge pass: {report.summary()}")
                if once or settings.judge.interval_s <= 0:
                    return
                await asyncio.sleep(settings.judge.interval_s)
    finally:
        await collector.close()
