"""The admin API of `onjob serve`: status (routing, deployments, the loop's stage, the
reward per checkpoint, each judge's agreement with users' feedback), checkpoints, canary,
promote, roll back; and the data: forget a conversation or a key's traffic, answer a
read-only SQL query, export a table as Parquet (DuckDB allows one process to hold the file:
this one).

Behind `proxy.admin_key` (`Authorization: Bearer <admin key>`). A server with no
admin key answers admin calls only when it has no API keys either (a loopback
server for one developer); otherwise the admin API is closed.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import os
import tempfile
from pathlib import Path

import msgspec
from litestar import Request, get, post
from litestar.background_tasks import BackgroundTask
from litestar.response import File

from ..collector import Collector, Forget, ForgetError, readonly
from ..collector.forget import parse_date
from ..judge import judge_agreement
from ..proxy import Router
from ..proxy.errors import BadRequest, Conflict, Forbidden, Unauthorized
from . import adapters, deployments, progress, registry, reviews, training
from .loop import LoopState, PeriodicLoop
from .operator import Operator
from .settings import DeploySettings


class CanaryBody(msgspec.Struct, forbid_unknown_fields=True):
    alias: str
    checkpoint: str
    fraction: float = 0.1
    reason: str = "set by hand"


class ForgetBody(msgspec.Struct, forbid_unknown_fields=True):
    """Exactly one: a trajectory id, an API key id, or a date (ISO) before which every
    conversation ended."""

    trajectory: str | None = None
    api_key: str | None = None
    before: str | None = None


class SqlBody(msgspec.Struct, forbid_unknown_fields=True):
    query: str
    limit: int = 1000


class ExportBody(msgspec.Struct, forbid_unknown_fields=True):
    table: str


class LoopBody(msgspec.Struct, forbid_unknown_fields=True):
    running: bool


class AliasBody(msgspec.Struct, forbid_unknown_fields=True):
    alias: str
    reason: str = "by hand"


def admin_refusal(request: Request, settings: DeploySettings) -> Exception | None:
    """Why `request` may not use admin routes (None: it may). The key comes as `Bearer
    <admin key>`, or as the password of HTTP Basic auth, which is what a browser asks for
    on the dashboard."""
    admin_key = settings.proxy.admin_key
    if admin_key is None:
        if settings.proxy.api_keys:
            return Forbidden("The admin API is off: set proxy.admin_key to use it.")
        return None
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "basic":
        try:
            token = base64.b64decode(token.strip(), validate=True).decode().partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            token = ""
    elif scheme.lower() != "bearer":
        token = ""
    if not token or not hmac.compare_digest(token.strip().encode(), admin_key.encode()):
        return Unauthorized("Admin routes need `Authorization: Bearer <admin key>`.")
    return None


def routes(
    settings: DeploySettings,
    collector: Collector,
    router: Router,
    operator: Operator,
    loop: PeriodicLoop | None = None,
):
    def require_admin(request: Request) -> None:
        if (refusal := admin_refusal(request, settings)) is not None:
            raise refusal

    async def body(request: Request, kind):
        try:
            return msgspec.json.decode(await request.body(), type=kind)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise BadRequest(f"Invalid body: {exc}") from exc

    async def change(fn):
        try:
            return await fn()
        except (deployments.DeployError, adapters.EngineControlError) as exc:
            raise Conflict(str(exc)) from exc

    @get("/admin/status")
    async def status(request: Request) -> dict:
        require_admin(request)
        history = await collector.query(lambda st: deployments.history(st, 20))
        return {
            "aliases": {
                alias: {"live": a.live, "canary": a.canary, "fraction": a.fraction}
                for alias, a in router.arms.items()
            },
            "base_model": router.base_model,
            "engines": operator.pool.status() if operator.pool else [],
            "collector": collector.stats(),
            "deployments": history,
            "loop": (loop.state if loop else LoopState()).as_dict(),
            "rewards": await collector.query(progress.reward_by_checkpoint),
            "judge_agreement": [a.as_dict() for a in await collector.query(judge_agreement)],
            "release": await collector.query(lambda st: reviews.status(st, settings)),
        }

    @get("/admin/checkpoints")
    async def checkpoints(request: Request) -> dict:
        require_admin(request)
        return {"checkpoints": await collector.query(registry.checkpoints)}

    @post("/admin/canary", status_code=200)
    async def canary(request: Request) -> dict:
        require_admin(request)
        b = await body(request, CanaryBody)
        return await change(
            lambda: operator.set_canary(
                b.alias, b.checkpoint, b.fraction, reason=b.reason, actor="admin-api"
            )
        )

    @post("/admin/promote", status_code=200)
    async def promote(request: Request) -> dict:
        require_admin(request)
        b = await body(request, AliasBody)
        return await change(lambda: operator.promote(b.alias, reason=b.reason, actor="admin-api"))

    @post("/admin/rollback", status_code=200)
    async def rollback(request: Request) -> dict:
        require_admin(request)
        b = await body(request, AliasBody)
        return await change(lambda: operator.rollback(b.alias, reason=b.reason, actor="admin-api"))

    @post("/admin/loop", status_code=200)
    async def loop_switch(request: Request) -> dict:
        """Pause (`{"running": false}`) or resume the loop; pausing cancels an iteration
        in flight."""
        require_admin(request)
        b = await body(request, LoopBody)
        if loop is None or settings.loop.interval_s <= 0:
            raise Conflict("The loop is off in this server (loop.interval_s = 0).")
        await (loop.resume() if b.running else loop.pause())
        return loop.state.as_dict()

    @post("/admin/forget", status_code=200)
    async def forget(request: Request) -> dict:
        """Delete a conversation, a key's traffic, or conversations ended before a date,
        with all derived from them; the answer lists checkpoints already trained on it."""
        require_admin(request)
        b = await body(request, ForgetBody)
        try:
            before = parse_date(b.before) if b.before is not None else None
            what = Forget(trajectory=b.trajectory, api_key=b.api_key, before=before)
        except ForgetError as exc:
            raise BadRequest(str(exc)) from exc
        out = await collector.forget(what, actor="admin-api")
        snapshots = await asyncio.to_thread(
            training.drop_snapshots, settings.trainer.checkpoints_dir, out.group_ids
        )
        return {**out.as_dict(), "snapshots_removed": snapshots}

    async def read(fn):
        # What the proxies have answered so far is in the answer: the spool is loaded first.
        await collector.caught_up()
        try:
            return await collector.read(fn, settings.collector.query_timeout_s)
        except readonly.QueryRefused as exc:
            raise BadRequest(str(exc)) from exc
        except TimeoutError as exc:
            limit = settings.collector.query_timeout_s
            raise BadRequest(f"The query ran past {limit:g} s and was interrupted.") from exc

    @post("/admin/sql", status_code=200)
    async def sql(request: Request) -> dict:
        """One read-only SELECT, answered from a cursor of its own (`collector.readonly`)."""
        require_admin(request)
        b = await body(request, SqlBody)
        return (await read(lambda con: readonly.query(con, b.query, b.limit))).as_dict()

    @get("/admin/tables")
    async def tables(request: Request) -> dict:
        require_admin(request)
        return {"tables": await read(readonly.tables)}

    @post("/admin/export", status_code=200)
    async def export(request: Request) -> File:
        """One table as a Parquet file (written to a temporary file, removed once sent)."""
        require_admin(request)
        b = await body(request, ExportBody)
        fd, name = tempfile.mkstemp(prefix="onjob-export-", suffix=".parquet")
        os.close(fd)
        path = Path(name)
        try:
            await read(lambda con: readonly.export(con, b.table, path))
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return File(
            path=path,
            filename=f"{b.table}.parquet",
            media_type="application/vnd.apache.parquet",
            background=BackgroundTask(path.unlink, missing_ok=True),
        )

    return [
        status,
        checkpoints,
        canary,
        promote,
        rollback,
        loop_switch,
        forget,
        sql,
        tables,
        export,
    ]
