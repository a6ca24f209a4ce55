"""The operator inside `onjob serve`: applies routing changes to the database, the engine
and the proxy's router together, and restores them after a restart."""

from __future__ import annotations

import logging

import httpx

from ..collector import Collector
from ..proxy import Router
from . import adapters, deployments, registry

log = logging.getLogger("onjob.deploy")


class Operator:
    def __init__(
        self,
        collector: Collector,
        router: Router,
        engine: httpx.AsyncClient,
        default_live: dict[str, str | None],
    ) -> None:
        self.collector = collector
        self.router = router
        self.engine = engine
        self.default_live = default_live

    async def restore(self) -> None:
        """Route as the latest `deployments` rows say, with their adapters loaded."""
        routing = await self.collector.query(deployments.current)
        for alias, row in routing.items():
            for name in (row["live"], row["canary"]):
                if name:
                    await self._load(name)
            self.router.set(alias, row["live"], row["canary"], row["fraction"] or 0.0)
            log.info(
                "routing %s: live %s, canary %s (%.0f%%)",
                alias,
                row["live"] or "base",
                row["canary"] or "-",
                100 * (row["fraction"] or 0),
            )

    async def set_canary(self, alias, checkpoint, fraction, *, reason, actor, evidence=None):
        self._known(alias)
        await self._load(checkpoint)
        row = await self.collector.query(
            lambda st: deployments.set_canary(
                st,
                alias,
                checkpoint,
                fraction,
                default_live=self.default_live.get(alias),
                reason=reason,
                actor=actor,
                evidence=evidence,
            )
        )
        return self._route(row)

    async def promote(self, alias, *, reason, actor, evidence=None):
        self._known(alias)
        row = await self.collector.query(
            lambda st: deployments.promote(
                st,
                alias,
                default_live=self.default_live.get(alias),
                reason=reason,
                actor=actor,
                evidence=evidence,
            )
        )
        return self._route(row)

    async def rollback(self, alias, *, reason, actor, evidence=None):
        self._known(alias)
        before = self.router.arms.get(alias)
        row = await self.collector.query(
            lambda st: deployments.rollback(
                st,
                alias,
                default_live=self.default_live.get(alias),
                reason=reason,
                actor=actor,
                evidence=evidence,
            )
        )
        routed = self._route(row)
        if before and before.canary:
            await self._unload(before.canary)
        return routed

    def _known(self, alias: str) -> None:
        if alias not in self.router.arms:
            raise deployments.DeployError(
                f"unknown alias {alias!r} (this server routes {', '.join(self.router.arms)})"
            )

    def _route(self, row: dict) -> dict:
        self.router.set(row["model_alias"], row["live"], row["canary"], row["fraction"] or 0.0)
        return row

    async def _unload(self, name: str) -> None:
        """A retired adapter leaves the engine (it still exists on disk and in the registry)."""
        if any(name in (a.live, a.canary) for a in self.router.arms.values()):
            return  # another alias still routes to it
        try:
            await adapters.unload(self.engine, name)
        except adapters.EngineControlError as exc:
            log.warning("%s is retired, but unloading it failed: %s", name, exc)

    async def _load(self, name: str) -> None:
        row = await self.collector.query(lambda st: registry.get(st, name))
        if row is None:
            raise deployments.DeployError(f"{name!r} is not in the checkpoints table")
        await adapters.ensure_loaded(self.engine, name, row["path"])
