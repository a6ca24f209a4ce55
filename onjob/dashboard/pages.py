"""The dashboard's pages: HTML rendered on the server from the database `onjob serve`
already holds, with Chart.js (served by onjob, no CDN) drawing the curves."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import jinja2
from litestar import Request, Response, get
from litestar.static_files import create_static_files_router

from ..collector import Collector
from ..deploy import canary, deployments, progress, reviews
from ..deploy.admin import admin_refusal
from ..deploy.loop import LoopState
from ..deploy.settings import DeploySettings
from ..judge import judge_agreement
from ..judge.rollouts import json_value
from ..proxy import Router
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
    router: Router,
    loop: LoopState | None = None,
) -> list:
    def render(
        request: Request, template: str, *, refresh: bool = False, status: int = 200, **context
    ) -> Response:
        if admin_refusal(request, settings) is not None:
            return Response(
                "The dashboard needs the admin key (as the password).",
                status_code=401,
                media_type="text/plain",
                headers={"WWW-Authenticate": 'Basic realm="onjob dashboard"'},
            )
        html = _env.get_template(template).render(
            refresh=REFRESH_S if refresh else None,
            page_name=template.removesuffix(".html"),
            **context,
        )
        return Response(html, status_code=status, media_type="text/html")

    def not_found(request: Request, what: str) -> Response:
        return render(request, "missing.html", status=404, what=what)

    @get("/dashboard", include_in_schema=False)
    async def overview(request: Request, minutes: int = 60) -> Response:
        minutes = max(1, min(minutes, 7 * 24 * 60))

        def read(store):
            return {
                "traffic": queries.traffic(store, minutes),
                "per_minute": queries.per_minute(store, minutes),
                "totals": queries.totals(store),
            }

        data = await collector.query(read)
        return render(
            request,
            "overview.html",
            refresh=True,
            minutes=minutes,
            arms=router.arms,
            base_model=router.base_model,
            loop=(loop or LoopState()).as_dict(),
            chart=_chart_data(data["per_minute"]),
            collector=collector.stats(),
            **data,
        )

    @get("/dashboard/scenarios", include_in_schema=False)
    async def scenarios(request: Request, page: int = 0) -> Response:
        page = max(page, 0)
        rows = await collector.query(lambda st: queries.scenarios(st, page))
        return render(request, "scenarios.html", rows=rows, page=page, size=queries.PAGE)

    @get("/dashboard/groups", include_in_schema=False)
    async def groups(request: Request, page: int = 0, kind: str | None = None) -> Response:
        page = max(page, 0)

        def read(store):
            return queries.groups(store, page, kind or None), judge_agreement(store)

        rows, agreement = await collector.query(read)
        return render(
            request,
            "groups.html",
            rows=rows,
            agreement=agreement,
            page=page,
            kind=kind or "",
            size=queries.PAGE,
        )

    @get("/dashboard/groups/{group_id:str}", include_in_schema=False)
    async def group(request: Request, group_id: str) -> Response:
        found = await collector.query(lambda st: queries.group(st, group_id))
        if found is None:
            return not_found(request, f"group {group_id}")
        return render(request, "group.html", group=found)

    @get("/dashboard/trajectories/{trajectory_id:str}", include_in_schema=False)
    async def trajectory(request: Request, trajectory_id: str) -> Response:
        found = await collector.query(lambda st: queries.trajectory(st, trajectory_id))
        if found is None:
            return not_found(request, f"trajectory {trajectory_id}")
        return render(request, "trajectory.html", t=found)

    @get("/dashboard/learning", include_in_schema=False)
    async def learning(request: Request) -> Response:
        def read(store):
            return {
                "curve": queries.reward_curve(store),
                "by_checkpoint": progress.reward_by_checkpoint(store),
                "runs": queries.train_runs(store),
            }

        data = await collector.query(read)
        return render(
            request, "learning.html", refresh=True, chart=_chart_data(data["curve"]), **data
        )

    @get("/dashboard/ab", include_in_schema=False)
    async def ab(request: Request) -> Response:
        def read(store):
            routing = deployments.current(store)
            running = {
                alias: canary.verdict(store, alias, r, settings.loop, canary.judges(settings))
                for alias, r in routing.items()
                if r["canary"]
            }
            return running, deployments.history(store, 100), reviews.status(store, settings)

        running, history, release = await collector.query(read)
        return render(
            request,
            "ab.html",
            refresh=True,
            running=running,
            history=history,
            rule=settings.loop,
            release=release,
        )

    static = create_static_files_router(
        path="/dashboard/static", directories=[HERE / "static"], include_in_schema=False
    )
    return [overview, scenarios, groups, group, trajectory, learning, ab, static]
