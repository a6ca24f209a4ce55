"""The admin API of `onjob serve`: status (routing, deployments, the loop's stage and the
reward per checkpoint), checkpoints, canary, promote, roll back.

Behind `proxy.admin_key` (`Authorization: Bearer <admin key>`). A server with no
admin key answers admin calls only when it has no API keys either (a loopback
server for one developer); otherwise the admin API is closed.
"""

from __future__ import annotations

import hmac

import msgspec
from litestar import Request, get, post

from ..collector import Collector
from ..proxy import Router
from ..proxy.errors import BadRequest, Conflict, Forbidden, Unauthorized
from . import adapters, deployments, progress, registry
from .loop import LoopState
from .operator import Operator
from .settings import ServeSettings


class CanaryBody(msgspec.Struct, forbid_unknown_fields=True):
    alias: str
    checkpoint: str
    fraction: float = 0.1
    reason: str = "set by hand"


class AliasBody(msgspec.Struct, forbid_unknown_fields=True):
    alias: str
    reason: str = "by hand"


def routes(
    settings: ServeSettings,
    collector: Collector,
    router: Router,
    operator: Operator,
    loop: LoopState | None = None,
):
    admin_key = settings.proxy.admin_key

    def require_admin(request: Request) -> None:
        if admin_key is None:
            if settings.proxy.api_keys:
                raise Forbidden("The admin API is off: set proxy.admin_key to use it.")
            return
        scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), admin_key):
            raise Unauthorized("The admin API needs `Authorization: Bearer <admin key>`.")

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
            "collector": collector.stats(),
            "deployments": history,
            "loop": (loop or LoopState()).as_dict(),
            "rewards": await collector.query(progress.reward_by_checkpoint),
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

    return [status, checkpoints, canary, promote, rollback]
