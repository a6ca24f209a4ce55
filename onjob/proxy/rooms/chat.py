"""`POST /v1/chat/completions` and `POST /v1/completions` (legacy text completions)."""

from __future__ import annotations

from dataclasses import replace

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.response import Stream

from ...collector.ids import new_id
from ..auth import caller
from ..exchange import COMPLETIONS, Exchange, parse_completion_request, parse_request
from ..stream import Chunks
from . import Serving


@post("/v1/chat/completions", status_code=200)
async def chat_completions(
    request: Request, serving: NamedDependency[Serving]
) -> Response | Stream:
    raw = await request.body()
    asked = parse_request(raw, serving.settings)
    traffic = serving.traffic
    where = traffic.placing(request.headers, caller(request))
    return await traffic.answer(await Exchange.open(asked, raw, where), Chunks)


@post("/v1/completions", status_code=200)
async def completions(request: Request, serving: NamedDependency[Serving]) -> Response | Stream:
    """Legacy text completions: forwarded as they are, logged like chat, each its own
    single-turn conversation (a prompt has no turns to continue)."""
    raw = await request.body()
    asked, prompt = parse_completion_request(raw, serving.settings)
    traffic = serving.traffic
    where = traffic.placing(request.headers, caller(request))
    where = replace(where, trajectory_id=new_id("traj_"))  # a conversation of its own
    exchange = await Exchange.open(
        asked,
        raw,
        where,
        api=COMPLETIONS,
        id_prefix="cmpl-",
        messages=[{"role": "user", "content": prompt}],
    )
    return await traffic.answer(exchange, Chunks)
