"""The dashboard's pages: HTML rendered on the server from the database `onjob serve`
already holds, with Chart.js (served by onjob, no CDN) drawing the curves.

Behind the admin key (a browser sends it as Basic auth's password), checked by the
router's guard before a page runs any query (`proxy/auth.py`). Its buttons (promote, roll
back, pause and resume the loop, each confirmed first) post JSON to `/dashboard/act`,
behind the same door: JSON only, so no other site's page can post it."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import jinja2
import markupsafe
import msgspec
from litestar import Request, Response, Router, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery
from litestar.static_files import create_static_files_router

from ..collector import Collector
from ..collector.scope import lineage_name
from ..deploy import progress
from ..deploy.act import deployments, reviews
from ..deploy.act.operator import Operator
from ..deploy.admin import ERRORS
from ..deploy.decide import ledger, pairs
from ..deploy.decide.evidence import Evidence
from ..deploy.loop import OFF, LoopState, PeriodicLoop
from ..deploy.records import Routing
from ..deploy.settings import DeploySettings
from ..judge import NO_SCORER, judge_agreement
from ..judge.rollouts import json_value
from ..proxy import Router as ArmRouter
from ..proxy.auth import AskPassword, Doors
from ..proxy.errors import BadRequest, Conflict
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


def _code(value) -> markupsafe.Markup:
    """Prose the loop wrote for a terminal (`onjob promote`), with its backticks shown as
    code; everything else escaped."""
    parts = str(markupsafe.escape("" if _missing(value) else value)).split("`")
    return markupsafe.Markup(
        "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    )


_env.filters.update(
    num=_num, pct=_pct, when=_when, pretty=_pretty, jsonvalue=json_value, code=_code
)


def _chart_data(value) -> str:
    """JSON for a <script type="application/json"> block (no `</` can close it early): a
    record by its fields, any other value JSON lacks (a time) as its text."""
    return json.dumps(value, default=_plain).replace("</", "<\\/")


def _plain(value) -> object:
    return msgspec.structs.asdict(value) if isinstance(value, msgspec.Struct) else str(value)


class Act(msgspec.Struct, forbid_unknown_fields=True):
    """A button's request (`POST /dashboard/act`): promote or roll back a lineage's canary
    (its name as the pages show it: `alias` or `alias@tenant`), pause or resume the loop."""

    action: Literal["promote", "rollback", "pause", "resume"]
    lineage: str | None = None
    reason: str = "from the dashboard"


@dataclass(frozen=True)
class Site:
    """What the pages read and act on, handed to each handler (Litestar's dependency
    `site`): the settings, the database, the routing, the loop and the operator."""

    settings: DeploySettings
    collector: Collector
    router: ArmRouter
    loop: PeriodicLoop | None = None
    operator: Operator | None = None


def routes(
    settings: DeploySettings,
    collector: Collector,
    router: ArmRouter,
    loop: PeriodicLoop | None = None,
    operator: Operator | None = None,
) -> list:
    """The dashboard's pages, its one action route and its assets, under `/dashboard`."""
    site = Site(settings, collector, router, loop, operator)
    static = create_static_files_router(
        path="/static", directories=[HERE / "static"], include_in_schema=False
    )
    # One guard for every page and asset, run before the page's queries.
    return [
        Router(
            "/dashboard",
            guards=[Doors(settings.proxy).dashboard_guard],
            exception_handlers={**ERRORS, AskPassword: _ask_password},
            dependencies={"site": Provide(lambda: site, use_cache=True, sync_to_thread=False)},
            route_handlers=[
                overview,
                requests,
                scenarios,
                groups,
                group,
                trajectory,
                feedback,
                checkpoints,
                learning,
                ab,
                act,
                static,
            ],
        )
    ]


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
async def overview(site: NamedDependency[Site], minutes: FromQuery[int] = 60) -> Response:
    minutes = max(1, min(minutes, 7 * 24 * 60))

    def read(store):
        return {
            "traffic": queries.traffic(store, minutes),
            "per_minute": queries.per_minute(store, minutes),
            "totals": queries.totals(store),
            "decided": deployments.current(store),
        }

    data = await site.collector.query(read)
    state = (site.loop.state if site.loop else LoopState()).view()
    return render(
        "overview.html",
        refresh=True,
        minutes=minutes,
        arms=site.router.arms,
        base_model=site.router.base_model,
        tenants=_tenant_rows(site.router, data.pop("decided"), state.tenant_budgets),
        loop=state,
        loop_line=state.line(time.time()),
        no_scorer=NO_SCORER,
        chart=_chart_data(data["per_minute"]),
        collector=site.collector.stats(),
        **data,
    )


@get("/scenarios", include_in_schema=False)
async def scenarios(site: NamedDependency[Site], page: FromQuery[int] = 0) -> Response:
    page = max(page, 0)
    rows = await site.collector.query(lambda st: queries.scenarios(st, page))
    return render("scenarios.html", rows=rows, page=page, size=queries.PAGE)


@get("/requests", include_in_schema=False)
async def requests(
    site: NamedDependency[Site],
    page: FromQuery[int] = 0,
    api_key: FromQuery[str | None] = None,
    status: FromQuery[str | None] = None,
    arm: FromQuery[str | None] = None,
    scenario: FromQuery[str | None] = None,
    trajectory: FromQuery[str | None] = None,
    q: FromQuery[str | None] = None,
    minutes: FromQuery[str | None] = None,  # the form sends "" for "any"
) -> Response:
    page = max(page, 0)
    explore = queries.Explore(
        api_key=api_key or None,
        status=status if status in ("ok", "error") else None,
        arm=arm or None,
        scenario=scenario or None,
        trajectory=trajectory or None,
        q=q or None,
        minutes=max(1, int(minutes)) if minutes and minutes.isdigit() else None,
    )
    rows = await site.collector.query(lambda st: queries.exchanges(st, explore, page))
    return render(
        "requests.html",
        rows=rows,
        f=explore,
        query=explore.params(),
        page=page,
        size=queries.PAGE,
    )


@get("/feedback", include_in_schema=False)
async def feedback(site: NamedDependency[Site], page: FromQuery[int] = 0) -> Response:
    page = max(page, 0)
    metrics, rows = await site.collector.query(lambda st: queries.feedback(st, page))
    return render("feedback.html", metrics=metrics, rows=rows, page=page, size=queries.PAGE)


@get("/checkpoints", include_in_schema=False)
async def checkpoints(site: NamedDependency[Site]) -> Response:
    rows = await site.collector.query(queries.checkpoints)
    return render("checkpoints.html", rows=rows)


@get("/groups", include_in_schema=False)
async def groups(
    site: NamedDependency[Site], page: FromQuery[int] = 0, kind: FromQuery[str | None] = None
) -> Response:
    page = max(page, 0)

    def read(store):
        return queries.groups(store, page, kind or None), judge_agreement(store)

    rows, agreement = await site.collector.query(read)
    return render(
        "groups.html",
        rows=rows,
        agreement=agreement,
        page=page,
        kind=kind or "",
        size=queries.PAGE,
    )


@get("/groups/{group_id:str}", include_in_schema=False)
async def group(site: NamedDependency[Site], group_id: FromPath[str]) -> Response:
    found = await site.collector.query(lambda st: queries.group(st, group_id))
    if found is None:
        return not_found(f"group {group_id}")
    return render("group.html", group=found)


@get("/trajectories/{trajectory_id:str}", include_in_schema=False)
async def trajectory(site: NamedDependency[Site], trajectory_id: FromPath[str]) -> Response:
    found = await site.collector.query(lambda st: queries.trajectory(st, trajectory_id))
    if found is None:
        return not_found(f"trajectory {trajectory_id}")
    return render("trajectory.html", t=found)


@get("/learning", include_in_schema=False)
async def learning(site: NamedDependency[Site]) -> Response:
    def read(store):
        return {
            "curve": queries.reward_curve(store),
            "by_checkpoint": progress.reward_by_checkpoint(store),
            "runs": queries.train_runs(store),
        }

    data = await site.collector.query(read)
    return render("learning.html", refresh=True, chart=_chart_data(data["curve"]), **data)


@get("/ab", include_in_schema=False)
async def ab(site: NamedDependency[Site]) -> Response:
    settings = site.settings

    def read(store):
        # Each canary's verdict as the loop last recorded it (`ledger.record`), not decided
        # again here: the page shows what the loop acts on, and costs a read.
        running, paths = {}, {}
        for alias, r in deployments.current(store).items():
            if r.canary:
                running[alias] = ledger.recorded(store, alias, r)
                if running[alias] is not None:
                    tests = running[alias].verdict.evidence.tests
                    paths[alias] = pairs.path(store, tests, settings.loop)
        return running, paths, deployments.history(store, 100), reviews.status(store, settings)

    running, paths, history, release = await site.collector.query(read)
    charts = {
        alias: _chart_data(_ab_chart(seen.verdict.evidence, paths[alias]))
        for alias, seen in running.items()
        if seen is not None
    }
    return render(
        "ab.html",
        refresh=True,
        running=running,
        charts=charts,
        interval_s=settings.loop.interval_s,
        history=history,
        rule=settings.loop,
        release=release,
    )


@post("/act", status_code=200, include_in_schema=False)
async def act(site: NamedDependency[Site], data: Act) -> Any:
    """What a page's buttons do, each after the person confirmed it; the same changes
    as `onjob promote`, `rollback` and the admin API's loop switch, recorded with
    actor `dashboard`."""
    if data.action in ("pause", "resume"):
        if site.loop is None:
            raise Conflict(OFF)
        return await site.loop.switch(data.action == "resume")
    if site.operator is None or data.lineage not in site.router.arms:
        raise BadRequest(f"No lineage {data.lineage!r} to {data.action}.", param="lineage")
    change = site.operator.promote if data.action == "promote" else site.operator.rollback
    return await change(data.lineage, reason=data.reason, actor="dashboard")


class Outcomes(msgspec.Struct, frozen=True):
    wins: int
    ties: int
    losses: int


class Latency(msgspec.Struct, frozen=True):
    """Each arm's median conversation on real traffic since the canary started (ms)."""

    live: float | None
    canary: float | None


class AbChart(msgspec.Struct, frozen=True):
    """What the A/B page draws for one canary (`dashboard.js`): the e-values after each pair
    (`pairs.path`) against the two thresholds, the wins, ties and losses, and each arm's
    latency on real traffic."""

    path: list[dict]
    promote_at: float
    rollback_at: float
    outcomes: Outcomes
    latency: Latency


def _ab_chart(evidence: Evidence, path: list[dict]) -> AbChart:
    test, paired, guards = evidence.e_process, evidence.paired, evidence.guards
    return AbChart(
        path=path,
        promote_at=test.promote_at,
        rollback_at=test.rollback_at,
        outcomes=Outcomes(paired.wins, paired.ties, paired.losses),
        latency=Latency(
            live=guards.live.p50_ms if guards else None,
            canary=guards.canary.p50_ms if guards else None,
        ),
    )


def _tenant_rows(router: ArmRouter, decided: Mapping[str, Routing], shares: dict) -> list[dict]:
    """A row per tenant's lineage: whose keys, live, canary, the last decision, and what is
    left of the tenant's budgets today."""
    rows = []
    for tenant, keys in router.tenants.keys.items():
        for alias in router.aliases:
            name = lineage_name(alias, tenant)
            arms, last = router.arms.get(name), decided.get(name)
            share = shares.get(tenant)
            rows.append(
                {
                    "tenant": tenant,
                    "key_ids": ", ".join(keys),
                    "lineage": name,
                    "live": arms.live if arms else None,
                    "canary": arms.canary if arms else None,
                    "last": last,
                    "budgets": [b for b in (share.train, share.judge) if b] if share else [],
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
