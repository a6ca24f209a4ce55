"""The dashboard's pages: HTML rendered on the server from the database `onjob serve`
already holds, with Chart.js (served by onjob, no CDN) drawing the curves.

Behind the admin key (a browser sends it as Basic auth's password), checked by the
router's guard before a page runs any query (`proxy/auth.py`)."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import jinja2
from litestar import Request, Response, Router, get
from litestar.params import FromPath, FromQuery
from litestar.static_files import create_static_files_router

from ..collector import Collector
from ..collector.scope import lineage_name
from ..deploy import deployments, progress, reviews
from ..deploy.loop import LoopState
from ..deploy.release import decide
from ..deploy.settings import DeploySettings
from ..judge import judge_agreement
from ..judge.rollouts import json_value
from ..proxy import Router as ArmRouter
from ..proxy.auth import AskPassword, Doors
from . import queries

HERE = Path(__file__).parent
REFRESH_S = 15

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=jinja2.select_autoescape(["html"]),
    undefined=jinja2.ChainableUndefined,  # messages and metrics have optional keys
)


def _missing(value) -> bool:
    return value is None or isinstance(value, jinja2.Undefined)


def _num(value, digits: int = 2) -> str:
    if _missing(value) or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _pct(value) -> str:
    return "–" if _missing(value) else f"{value:.1%}"


def _when(value) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")
    return "–" if _missing(value) else str(value)


def _pretty(value) -> str:
    parsed = json_value(value) if isinstance(value, str) else value
    return json.dumps(parsed, indent=2, ensure_ascii=False, default=str)


_env.filters.update(num=_num, pct=_pct, when=_when, pretty=_pretty, jsonvalue=json_value)


def _chart_data(value) -> str:
    """JSON for a <script type="application/json"> block (no `</` can close it early)."""
    return json.dumps(value, default=str).replace("</", "<\\/")


def routes(
    settings: DeploySettings,
    collector: Collector,
    router: ArmRouter,
    loop: LoopState | None = None,
) -> list:
    def render(template: str, *, refresh: bool = False, status: int = 200, **context) -> Response:
        html = _env.get_template(template).render(
            refresh=REFRESH_S if refresh else None,
            page_name=template.removesuffix(".html"),
            **context,
        )
        return Response(html, status_code=status, media_type="text/html")

    def not_found(what: str) -> Response:
        return render("missing.html", status=404, what=what)

    @get("/", include_in_schema=False)
    async def overview(minutes: FromQuery[int] = 60) -> Response:
        minutes = max(1, min(minutes, 7 * 24 * 60))

        def read(store):
            return {
                "traffic": queries.traffic(store, minutes),
                "per_minute": queries.per_minute(store, minutes),
                "totals": queries.totals(store),
                "decided": deployments.current(store),
            }

        data = await collector.query(read)
        state = (loop or LoopState()).as_dict()
        return render(
            "overview.html",
            refresh=True,
            minutes=minutes,
            arms=router.arms,
            base_model=router.base_model,
            tenants=_tenant_rows(router, data.pop("decided"), state["tenant_budgets"]),
            loop=state,
            chart=_chart_data(data["per_minute"]),
            collector=collector.stats(),
            **data,
        )

    @get("/scenarios", include_in_schema=False)
    async def scenarios(page: FromQuery[int] = 0) -> Response:
        page = max(page, 0)
        rows = await collector.query(lambda st: queries.scenarios(st, page))
        return render("scenarios.html", rows=rows, page=page, size=queries.PAGE)

    @get("/groups", include_in_schema=False)
    async def groups(page: FromQuery[int] = 0, kind: FromQuery[str | None] = None) -> Response:
        page = max(page, 0)

        def read(store):
            return queries.groups(store, page, kind or None), judge_agreement(store)

        rows, agreement = await collector.query(read)
        return render(
            "groups.html",
            rows=rows,
            agreement=agreement,
            page=page,
            kind=kind or "",
            size=queries.PAGE,
        )

    @get("/groups/{group_id:str}", include_in_schema=False)
    async def group(group_id: FromPath[str]) -> Response:
        found = await collector.query(lambda st: queries.group(st, group_id))
        if found is None:
            return not_found(f"group {group_id}")
        return render("group.html", group=found)

    @get("/trajectories/{trajectory_id:str}", include_in_schema=False)
    async def trajectory(trajectory_id: FromPath[str]) -> Response:
        found = await collector.query(lambda st: queries.trajectory(st, trajectory_id))
        if found is None:
            return not_found(f"trajectory {trajectory_id}")
        return render("trajectory.html", t=found)

    @get("/learning", include_in_schema=False)
    async def learning() -> Response:
        def read(store):
            return {
                "curve": queries.reward_curve(store),
                "by_checkpoint": progress.reward_by_checkpoint(store),
                "runs": queries.train_runs(store),
            }

        data = await collector.query(read)
        return render("learning.html", refresh=True, chart=_chart_data(data["curve"]), **data)

    @get("/ab", include_in_schema=False)
    async def ab() -> Response:
        def read(store):
            routing = deployments.current(store)
            running = {
                alias: decide(store, settings, r.canary, r.live, r)
                for alias, r in routing.items()
                if r.canary
            }
            return running, deployments.history(store, 100), reviews.status(store, settings)

        running, history, release = await collector.query(read)
        return render(
            "ab.html",
            refresh=True,
            running=running,
            history=history,
            rule=settings.loop,
            release=release,
        )

    static = create_static_files_router(
        path="/static", directories=[HERE / "static"], include_in_schema=False
    )
    # One guard for every page and asset, run before the page's queries.
    return [
        Router(
            "/dashboard",
            guards=[Doors(settings.proxy).dashboard_guard],
            exception_handlers={AskPassword: _ask_password},
            route_handlers=[overview, scenarios, groups, group, trajectory, learning, ab, static],
        )
    ]


def _tenant_rows(router: ArmRouter, decided: dict, shares: dict) -> list[dict]:
    """A row per tenant's lineage: whose keys, live, canary, the last decision, and what is
    left of the tenant's budgets today."""
    rows = []
    for tenant, keys in router.tenants.keys.items():
        for alias in router.aliases:
            name = lineage_name(alias, tenant)
            arms, last = router.arms.get(name), decided.get(name)
            share = shares.get(tenant) or {}
            rows.append(
                {
                    "tenant": tenant,
                    "key_ids": ", ".join(keys),
                    "lineage": name,
                    "live": arms.live if arms else None,
                    "canary": arms.canary if arms else None,
                    "last": last,
                    "budgets": [share[s] for s in ("train", "judge") if share.get(s)],
                }
            )
    return rows


def _ask_password(_: Request, exc: AskPassword) -> Response:
    """Plain text and `WWW-Authenticate`: the browser shows its password prompt."""
    return Response(
        exc.message,
        status_code=exc.status,
        media_type="text/plain",
        headers={"WWW-Authenticate": 'Basic realm="onjob dashboard"'},
    )
