"""The operator inside `onjob serve`: applies routing changes to the database, the engines
and the proxy's router together, restores them after a restart, and loads an engine's
adapters again when it comes back from one (the pool's `reload` hook).

What it keeps loaded beyond the routing is in the database too, so a restart keeps it:
the previous live adapter of each alias (`deployments.previous`, read from the log:
loaded again at `restore`, so a revert is instant after a restart), and the stranded
adapters (retired, but an engine refused to unload them: checkpoint status `stranded`,
tried again at `restore` and at every later unload)."""

from __future__ import annotations

import asyncio
import logging

import httpx
import msgspec

from ...collector import Collector
from ...proxy import Router
from ...proxy.pool import Pool, Replica
from ..records import Change, Routing
from . import adapters, deployments, registry

log = logging.getLogger("onjob.deploy")


class Operator:
    def __init__(
        self,
        collector: Collector,
        router: Router,
        engine: httpx.AsyncClient,
        default_live: dict[str, str | None],
        *,
        pool: Pool | None = None,
    ) -> None:
        self.collector = collector
        self.router = router
        self.engine = engine  # the judge's and the trainer's engine (the pool's first)
        # lineage name -> its live before any decision: its alias's configured checkpoint
        self.default_live = router.tenants.defaults(default_live)
        # Every engine adapters go to: the pool's replicas, or `engine` alone.
        self.pool = pool
        if pool is not None:
            pool.reload = self.reload
        # alias -> the live adapter a promotion replaced, kept loaded until the next one
        # (a copy of `deployments.previous`, read again at `restore`)
        self._previous: dict[str, str] = {}
        # retired adapters the engine refused to unload: still loaded, tried again at
        # every later unload (a copy of the checkpoints whose status is `stranded`)
        self.stranded: set[str] = set()

    async def restore(self) -> None:
        """Route as the latest `deployments` rows say, with their adapters loaded, the
        previous live adapters too (a revert stays instant); unload the stranded ones."""
        routing = await self.collector.query(deployments.current)
        self._previous = await self.collector.query(deployments.previous)
        self.stranded = {
            c.name
            for c in await self.collector.query(registry.checkpoints)
            if c.status == "stranded"
        }
        for alias, row in routing.items():
            for name in (row.live, row.canary):
                if name:
                    await self.load(name)
            if (older := self._previous.get(alias)) and older not in self.stranded:
                try:
                    await self.load(older)
                except (adapters.EngineControlError, deployments.DeployError) as exc:
                    log.warning("previous live %s of %s not loaded: %s", older, alias, exc)
            self._route(alias, row)
            log.info(
                "routing %s: live %s, canary %s (%.0f%%)",
                alias,
                row.live or "base",
                row.canary or "-",
                100 * (row.fraction or 0),
            )
        if self.stranded:  # retried with the routing set, so none still routed goes
            for warning in await self._unload(sorted(self.stranded)[0]):
                log.warning("%s", warning)

    def _route(self, alias: str, row: Routing) -> None:
        arms = row.arms
        self.router.set(alias, arms.live, arms.canary, arms.fraction)

    async def follow(self) -> bool:
        """A DuckLake's server: route as the latest `deployments` rows say (any worker's
        decisions, or a change by hand on any server), once they differ from this router's
        arms (`restore`). Whether they did."""
        routing = await self.collector.query(deployments.current)
        if all(self.router.arms.get(alias) == row.arms for alias, row in routing.items()):
            return False
        await self.restore()
        return True

    async def resync(self) -> None:
        """Route as the database says, loading nothing: after a change was interrupted."""
        routing = await self.collector.query(deployments.current)
        for alias, row in routing.items():
            if alias in self.router.arms:
                self._route(alias, row)

    async def set_canary(
        self, alias, checkpoint, fraction, *, reason, actor, evidence=None
    ) -> Change:
        await self.load(checkpoint)
        return await self._change(
            alias,
            deployments.set_canary,
            checkpoint,
            fraction,
            reason=reason,
            actor=actor,
            evidence=evidence,
        )

    async def promote(
        self, alias, *, reason, actor, evidence=None, expected: Routing | None = None
    ) -> Change:
        """The canary becomes live. The old live adapter stays loaded: requests in flight on
        it finish, and a revert to it is instant; the one it had replaced leaves the engine.
        `expected`: the routing the decision was made on (see `deployments.promote`)."""
        before = self.router.arms.get(alias)
        row = await self._change(
            alias,
            deployments.promote,
            reason=reason,
            actor=actor,
            evidence=evidence,
            expected=expected,
        )
        older = self._previous.pop(alias, None)
        if before and before.live:
            self._previous[alias] = before.live
        if older:
            row.warnings.extend(await self._unload(older))
        return row

    async def rollback(
        self, alias, *, reason, actor, evidence=None, expected: Routing | None = None
    ) -> Change:
        before = self.router.arms.get(alias)
        row = await self._change(
            alias,
            deployments.rollback,
            reason=reason,
            actor=actor,
            evidence=evidence,
            expected=expected,
        )
        if before and before.canary:
            row.warnings.extend(await self._unload(before.canary))
        return row

    async def _change(self, alias: str, change, *args, **kwargs) -> Change:
        """Record `change` in the database, then route the proxy as it says. Shielded: a
        caller cancelled half way (the loop paused) cannot leave a change recorded in the
        database and missing from the router."""
        self._known(alias)
        default = self.default_live.get(alias)

        async def apply() -> Change:
            row = await self.collector.query(
                lambda st: change(st, alias, *args, default_live=default, **kwargs)
            )
            self._route(row.model_alias, row)
            return Change(**msgspec.structs.asdict(row), warnings=[])

        return await asyncio.shield(apply())

    def _known(self, alias: str) -> None:
        if alias not in self.router.arms:
            raise deployments.DeployError(
                f"unknown alias {alias!r} (this server routes {', '.join(self.router.arms)})"
            )

    async def unload(self, name: str) -> list[str]:
        """Unload `name` unless something routes to it; warnings, as for `_unload`."""
        return await self._unload(name)

    async def _unload(self, name: str) -> list[str]:
        """A retired adapter leaves the engine (it still exists on disk and in the registry).
        One the engine did not unload is not taken as gone: it stays in `stranded` and is
        tried again with the next one. What went wrong, as warnings the caller returns."""
        warnings = []
        for retired in [*sorted(self.stranded - {name}), name]:
            if self._kept(retired):
                self.stranded.discard(retired)
                continue
            try:
                for engine in self._engines():
                    await adapters.unload(engine, retired)
            except adapters.EngineControlError as exc:
                self.stranded.add(retired)
                await self._mark(retired, "stranded")
                log.error("%s is retired, but is still loaded in the engine: %s", retired, exc)
                warnings.append(
                    f"{retired} is retired, but is still loaded in the engine (the next "
                    f"unload tries again): {exc}"
                )
            else:
                if retired in self.stranded:
                    await self._mark(retired, "retired")
                self.stranded.discard(retired)
        return warnings

    async def _mark(self, name: str, status: str) -> None:
        """A retired adapter's status: `stranded` while an engine still holds it."""
        await self.collector.query(
            lambda st: registry.set_status(st, name, status, only_from=("retired", "stranded"))
        )

    def _kept(self, name: str) -> bool:
        """Another alias still routes to `name`, or keeps it loaded for a revert."""
        routed = [(a.live, a.canary) for a in self.router.arms.values()]
        return any(name in pair for pair in routed) or name in self._previous.values()

    def _engines(self) -> list[httpx.AsyncClient]:
        if self.pool is None:
            return [self.engine]
        return [r.control for r in self.pool.replicas if r.control is not None]

    async def _path(self, name: str) -> str:
        row = await self.collector.query(lambda st: registry.get(st, name))
        if row is None:
            raise deployments.DeployError(f"{name!r} is not in the checkpoints table")
        return row.path

    async def load(self, name: str) -> None:
        """Load a registered checkpoint's adapter into every engine (a no-op where it is).
        An engine that cannot be reached is skipped while another has it: the pool keeps
        that one out until it is back and `reload` has loaded it."""
        path = await self._path(name)
        engines = self._engines()
        unreachable = []
        for engine in engines:
            try:
                await adapters.ensure_loaded(engine, name, path)
            except adapters.EngineUnreachable as exc:
                log.warning("%s not loaded into %s (down): %s", name, engine.base_url, exc)
                unreachable.append(exc)
            except adapters.AdapterPathUnreadable as exc:
                if self.pool is None or not self.pool.resolves:
                    raise
                # Another host's engine: it loads the published checkpoint by name.
                log.info("%s not loaded into %s by path: %s", name, engine.base_url, exc)
        if len(unreachable) == len(engines):
            raise unreachable[0]

    async def reload(self, replica: Replica, names: set[str]) -> None:
        """A replica is back (or answered 404 for an adapter it should serve): load `names`,
        the adapters routed to that it lacks. One that fails is logged; the others load."""
        for name in sorted(names):
            try:
                await adapters.ensure_loaded(replica.control, name, await self._path(name))
            except (adapters.EngineControlError, deployments.DeployError) as exc:
                log.error("could not reload %s into %s: %s", name, replica.url, exc)
