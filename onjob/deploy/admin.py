"""The admin API of `onjob serve`: status (routing, deployments, the loop's stage, the
reward per checkpoint, each judge's agreement with users' feedback), checkpoints, canary,
promote, roll back; and the data: forget a conversation or a key's traffic, answer a
read-only SQL query, export a table as Parquet (DuckDB allows one process to hold the file:
this one).

Behind the admin key (`Authorization: Bearer <admin key>`; `proxy.admin_key`, else the
key `onjob serve` keeps beside the database), checked by the router's guard before any
handler runs, with the page-borne requests refused there too (`proxy/auth.py`). A server
with no admin key at all (an app built without `onjob serve`) answers none.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import msgspec
from litestar import Request, Response, get, post
from litestar import Router as Routes
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency, Provide
from litestar.exceptions import ValidationException
from litestar.response import File

from ..collector import CatalogUnreachable, Collector, Forget, ForgetError, NotLeading, readonly
from ..collector.forget import Removed, parse_date
from ..judge import judge_agreement
from ..openai_handlers import openai_error
from ..proxy import Router
from ..proxy.auth import Doors
from ..proxy.errors import BadRequest, Conflict, log_unavailable
from ..proxy.tenants import Tenants, UnknownTenant
from . import progress
from .act import adapters, deployments, registry, reviews, training
from .act.operator import Operator
from .decide import fit
from .loop import OFF, LoopState, PeriodicLoop
from .records import Change, Checkpoint
from .settings import DeploySettings
from .status import LoopView, ServerStatus


# The admin API's request bodies, which `onjob.client` sends too. A field left at its
# default is not sent: a server of an older version that lacks the field still takes it.
class CanaryBody(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    alias: str
    checkpoint: str
    fraction: float = 0.1
    reason: str = "set by hand"
    tenant: str | None = None  # the tenant's lineage of the alias (none: the shared one)


class ForgetBody(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Exactly one: a trajectory id, an API key id, or a date (ISO) before which every
    conversation ended."""

    trajectory: str | None = None
    api_key: str | None = None
    before: str | None = None


class SqlBody(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    query: str
    limit: int = 1000


class ExportBody(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    table: str
    tenant: str | None = None  # only this tenant's rows (`readonly.tenant_tables`)


class LoopBody(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    running: bool


class AliasBody(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    alias: str
    reason: str = "by hand"
    tenant: str | None = None


def _conflict(request: Request, exc: Exception) -> Response:
    """A refused change (the checkpoint is not one, the engine would not load it): 409."""
    return openai_error(request, Conflict(str(exc)))


def _invalid_body(request: Request, exc: ValidationException) -> Response:
    """A body that is not the route's: 400 naming what is wrong, in OpenAI's shape."""
    extra = exc.extra if isinstance(exc.extra, list) else []
    why = "; ".join(str(e.get("message", e)) if isinstance(e, dict) else str(e) for e in extra)
    return openai_error(request, BadRequest(f"Invalid body: {why or exc.detail}"))


# Each domain error is mapped to its HTTP answer here, once for every admin route.
ERRORS = {
    NotLeading: _conflict,
    deployments.DeployError: _conflict,
    adapters.EngineControlError: _conflict,
    ValidationException: _invalid_body,
    CatalogUnreachable: log_unavailable,
}


class CheckpointList(msgspec.Struct):
    """`GET /admin/checkpoints`: every checkpoint, newest first."""

    checkpoints: list[Checkpoint]


class TableList(msgspec.Struct):
    """`GET /admin/tables`: the database's tables."""

    tables: list[str]


@dataclass(frozen=True)
class Admin:
    """What the admin routes read and change: each handler takes it as a dependency."""

    settings: DeploySettings
    collector: Collector
    router: Router
    operator: Operator
    loop: PeriodicLoop | None = None

    def lineage(self, data: CanaryBody | AliasBody) -> str:
        """The lineage a body names: its alias, of its tenant (none: the shared one)."""
        try:
            return self.router.tenants.routed(data.alias, data.tenant)
        except UnknownTenant as exc:
            raise BadRequest(str(exc), param="tenant") from exc

    async def read(self, fn):
        """A read-only query's answer. What the proxies have answered so far is in it: the
        spool is loaded first."""
        await self.collector.caught_up()
        limit = self.settings.collector.query_timeout_s
        try:
            return await self.collector.read(fn, limit)
        except readonly.QueryRefused as exc:
            raise BadRequest(str(exc)) from exc
        except TimeoutError as exc:
            raise BadRequest(f"The query ran past {limit:g} s and was interrupted.") from exc


def routes(
    settings: DeploySettings,
    collector: Collector,
    router: Router,
    operator: Operator,
    loop: PeriodicLoop | None = None,
):
    """The admin router: the release's routes and the data's, behind one guard."""
    admin = Admin(settings, collector, router, operator, loop)
    # One guard for every route: the admin key, JSON bodies, no page of another site.
    return [
        Routes(
            "/admin",
            guards=[Doors(settings.proxy).admin_guard],
            exception_handlers=ERRORS,
            dependencies={"admin": Provide(lambda: admin, use_cache=True, sync_to_thread=False)},
            route_handlers=[*RELEASE, *DATA],
        )
    ]


@get("/status")
async def status(admin: NamedDependency[Admin]) -> ServerStatus:
    collector, router, settings, loop = admin.collector, admin.router, admin.settings, admin.loop
    history = await collector.query(lambda st: deployments.history(st, 20))
    return ServerStatus(
        aliases=dict(router.arms),
        base_model=router.base_model,
        tenants={t: list(keys) for t, keys in router.tenants.keys.items()},
        engines=admin.operator.pool.status() if admin.operator.pool else [],
        collector=collector.stats(),
        deployments=history,
        loop=(loop.state if loop else LoopState()).view(),
        rewards=await collector.query(progress.reward_by_checkpoint),
        judge_agreement=await collector.query(judge_agreement),
        release=await collector.query(lambda st: reviews.status(st, settings)),
        fitted=await collector.query(lambda st: fit.current(st, settings)),
    )


@get("/checkpoints")
async def checkpoints(admin: NamedDependency[Admin]) -> CheckpointList:
    return CheckpointList(await admin.collector.query(registry.checkpoints))


@post("/canary", status_code=200)
async def canary(admin: NamedDependency[Admin], data: CanaryBody) -> Change:
    return await admin.operator.set_canary(
        admin.lineage(data), data.checkpoint, data.fraction, reason=data.reason, actor="admin-api"
    )


@post("/promote", status_code=200)
async def promote(admin: NamedDependency[Admin], data: AliasBody) -> Change:
    return await admin.operator.promote(admin.lineage(data), reason=data.reason, actor="admin-api")


@post("/rollback", status_code=200)
async def rollback(admin: NamedDependency[Admin], data: AliasBody) -> Change:
    return await admin.operator.rollback(admin.lineage(data), reason=data.reason, actor="admin-api")


@post("/loop", status_code=200)
async def loop_switch(admin: NamedDependency[Admin], data: LoopBody) -> LoopView:
    """Pause (`{"running": false}`) or resume the loop; pausing cancels an iteration in
    flight."""
    if admin.loop is None:
        raise Conflict(OFF)
    return await admin.loop.switch(data.running)


@post("/forget", status_code=200)
async def forget(admin: NamedDependency[Admin], data: ForgetBody) -> Removed:
    """Delete a conversation, a key's traffic, or conversations ended before a date, with
    all derived from them; the answer lists checkpoints already trained on it."""
    try:
        before = parse_date(data.before) if data.before is not None else None
        what = Forget(trajectory=data.trajectory, api_key=data.api_key, before=before)
    except ForgetError as exc:
        raise BadRequest(str(exc)) from exc
    out = await admin.collector.forget(what, actor="admin-api")
    snapshots = await asyncio.to_thread(
        training.drop_snapshots, admin.settings.trainer.checkpoints_dir, out.group_ids
    )
    return out.removed(snapshots)


@post("/sql", status_code=200)
async def sql(admin: NamedDependency[Admin], data: SqlBody) -> readonly.Answer:
    """One read-only SELECT, answered from a cursor of its own (`collector.readonly`)."""
    return await admin.read(lambda con: readonly.query(con, data.query, data.limit))


@get("/tables")
async def tables(admin: NamedDependency[Admin], tenant: bool = False) -> TableList:
    """The database's tables (`?tenant=true`: those that hold a tenant's rows)."""
    return TableList(await admin.read(readonly.tenant_tables if tenant else readonly.tables))


@post("/export", status_code=200)
async def export(admin: NamedDependency[Admin], data: ExportBody) -> File:
    """One table as a Parquet file (written to a temporary file, removed once sent)."""
    settings = admin.settings
    whose = None
    if data.tenant is not None:
        try:
            whose = Tenants.of(settings.proxy).rows(data.tenant, settings.proxy.aliases)
        except UnknownTenant as exc:
            raise BadRequest(str(exc), param="tenant") from exc
    fd, name = tempfile.mkstemp(prefix="onjob-export-", suffix=".parquet")
    os.close(fd)
    path = Path(name)
    try:
        await admin.read(lambda con: readonly.export(con, data.table, path, whose))
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return File(
        path=path,
        filename=f"{data.table}.parquet",
        media_type="application/vnd.apache.parquet",
        background=BackgroundTask(path.unlink, missing_ok=True),
    )


RELEASE = [status, checkpoints, canary, promote, rollback, loop_switch]
DATA = [forget, sql, tables, export]
