"""The Responses API: `POST /v1/responses` (translated into a chat completion at this edge,
`proxy/responses.py`), and the stored responses (`GET`, `GET .../input_items`, `DELETE`).

In a proxy-only process (`Serving.forward` set) what needs the database (a previous response, a
stored one) is the primary's: those requests are forwarded to it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery
from litestar.response import Stream

from ...collector import queries
from ...protocol.responses import (
    InputItems,
    ResponseDeleted,
    ResponseObject,
    ResponseRequest,
    StoredResponse,
)
from .. import responses
from ..auth import caller
from ..errors import BadRequest, NotFound
from ..exchange import Exchange, Placing, parse_request
from ..stream import ResponseEvents
from ..traffic import Traffic
from . import Serving


@post("/v1/responses", status_code=200)
async def create_response(request: Request, serving: NamedDependency[Serving]) -> Response | Stream:
    settings, traffic = serving.settings, serving.traffic
    who = caller(request)
    asked = responses.parse(await request.body(), settings)
    chained = asked.previous_response_id is not None
    if serving.forward is not None and chained:
        return await serving.forward(request)  # the previous response is in the primary's
    where = traffic.placing(request.headers, who)
    previous = None
    if chained:
        where, previous = await _previous(traffic, asked, where)
    chat, call = responses.translate(asked, previous)
    raw = msgspec.json.encode(chat)  # the fields translate set, no others
    exchange = await Exchange.open(
        parse_request(raw, settings),
        raw,
        where,
        api=responses.RESPONSES,
        id_prefix="resp_",
        after_turn=previous.turn if previous else None,
    )
    if not call.store and who.api_key_id in settings.untrained_unstored_keys:
        exchange.source = "unstored"  # every reader of traffic takes 'production' only

    def whole(exchange: Exchange, answer: bytes) -> bytes:
        response = _whole(exchange, call)
        exchange.api_object = responses.stored(response, call)
        return msgspec.json.encode(response)

    return await traffic.answer(exchange, lambda e: ResponseEvents(e, call), whole)


@get("/v1/responses/{response_id:str}")
async def retrieve_response(
    request: Request, response_id: FromPath[str], serving: NamedDependency[Serving]
) -> Response | ResponseObject:
    if serving.forward is not None:
        return await serving.forward(request)
    return (await _stored(serving.traffic, request, response_id)).response


@get("/v1/responses/{response_id:str}/input_items")
async def response_input_items(
    request: Request,
    response_id: FromPath[str],
    serving: NamedDependency[Serving],
    limit: FromQuery[int] = 20,
    order: FromQuery[Literal["asc", "desc"]] = "desc",
    after: FromQuery[str | None] = None,
) -> Response | InputItems:
    if serving.forward is not None:
        return await serving.forward(request)
    if not 1 <= limit <= 100:
        raise BadRequest("`limit` must be between 1 and 100.", param="limit")
    items = (await _stored(serving.traffic, request, response_id)).input_items
    return responses.input_items_page(items, order=order, limit=limit, after=after)


@delete("/v1/responses/{response_id:str}", status_code=200)
async def delete_response(
    request: Request, response_id: FromPath[str], serving: NamedDependency[Serving]
) -> Response | ResponseDeleted:
    """The stored Response goes; the exchange stays in the log, to learn from."""
    if serving.forward is not None:
        return await serving.forward(request)
    traffic = serving.traffic
    await _stored(traffic, request, response_id)
    forgotten = await traffic.collector.query(lambda store: store.forget_response(response_id))
    if not forgotten:
        raise NotFound(f"No response with id '{response_id}'.", param="response_id")
    return ResponseDeleted(id=response_id)


async def _previous(
    traffic: Traffic, asked: ResponseRequest, where: Placing
) -> tuple[Placing, responses.Previous]:
    """The response a chained request continues (the caller's own, still stored), and the
    request placed in its chain: the chain's trajectory and, while that checkpoint still is
    one, its arm become this one's."""
    api_key_id = where.api_key_id
    previous_id = asked.previous_response_id
    row = await traffic.lookup(queries.exchange, previous_id)
    stored = responses.stored_response(row, api_key_id)
    previous = responses.previous_of(row, stored) if stored is not None else None
    if previous is None:
        raise NotFound(
            f"Previous response with id '{previous_id}' not found.",
            param="previous_response_id",
        )
    pin = where.pin
    if pin is None:
        pin = traffic.router.sticky(asked.model, row.checkpoint, api_key_id)
    return replace(where, trajectory_id=previous.trajectory_id, pin=pin), previous


def _whole(exchange: Exchange, call: responses.Call) -> ResponseObject:
    """A whole chat answer as the Response object."""
    reply = exchange.replies()[0] if exchange.choices else {}
    choice = exchange.choices.get(0)
    return responses.response_object(
        call,
        exchange.id,
        exchange.route.alias,
        status="completed",
        output=responses.output_items(reply, exchange.id.removeprefix("resp_")),
        usage=exchange.usage,
        finish_reason=choice.finish_reason if choice else None,
    )


async def _stored(traffic: Traffic, request: Request, response_id: str) -> StoredResponse:
    """The caller's stored response; another key's is answered as missing."""
    row = await traffic.lookup(queries.exchange, response_id)
    found = responses.stored_response(row, caller(request).api_key_id)
    if found is None:
        raise NotFound(f"No response with id '{response_id}'.", param="response_id")
    return found
