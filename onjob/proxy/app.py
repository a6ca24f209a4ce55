"""The proxy's Litestar app: `/v1/chat/completions`, `/v1/completions`, the Responses API
(`/v1/responses`, translated into chat at this edge), `/v1/models`, `/v1/feedback`,
`/health`, `/openapi.json`.

The upstream client and the collector are handed in (so tests can give an
`HttpxUpstream` over a `MockTransport`); the app starts the collector and closes
both when it stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal

import msgspec
from litestar import Request, Response, delete, get, post, route
from litestar import Router as Routes
from litestar.params import FromPath, FromQuery
from litestar.response import Stream
from opentelemetry.trace import Tracer

from .. import logprobs
from ..collector import Collector, FeedbackRecord, queries
from ..collector.ids import new_id
from ..collector.trajectories import scoped
from ..openai_errors import HANDLERS, error_body
from . import openapi, responses, sse, telemetry
from .auth import Caller, Doors, caller
from .errors import (
    AdapterUnavailable,
    BadRequest,
    NotFound,
    ProxyError,
    StreamCut,
    UpstreamError,
    UpstreamStatus,
)
from .exchange import COMPLETIONS, Exchange, parse_completion_request, parse_request
from .front import ProxyApp
from .pool import Pool, Replica
from .replicas import Forwarder
from .routing import CANARY, Router
from .settings import ProxySettings
from .upstream import Upstream, UpstreamResponse

log = logging.getLogger("onjob.proxy")

EXCHANGE_HEADER = "X-Onjob-Exchange-Id"
TRAJECTORY_HEADER = "X-Onjob-Trajectory"
SCENARIO_HEADER = "X-Onjob-Scenario"
ARM_HEADER = "X-Onjob-Arm"
_CLIENT_CLOSED = 499  # nginx's code: the client went away before the answer was complete


def create_app(
    settings: ProxySettings,
    *,
    upstream: Upstream,
    collector: Collector,
    tracer: Tracer | None = None,
    router: Router | None = None,
    routes: Sequence = (),
    on_startup: Sequence[Callable[[], Awaitable[None]]] = (),
    on_shutdown: Sequence[Callable[[], Awaitable[None]]] = (),
    forward: Forwarder | None = None,
) -> ProxyApp:
    """The proxy's app. `upstream` is one engine, or a `Pool` of several (its `wanted` set
    by the caller); `router` (default: from `settings`) is the handle that changes an
    alias's arms while serving; `routes` are more handlers (the admin API). `on_startup`
    hooks run after the collector has started, and `on_shutdown` hooks before it closes
    (the server's background work). `forward` makes a proxy-only process (its collector
    only writes the spool): what needs the database goes to the primary server
    (`replicas.py`)."""
    if router is None:
        router = Router.from_settings(settings, upstream)
    if isinstance(upstream, Pool):
        pool = upstream
    else:  # one engine, unchecked: a lost adapter is answered 503 but not reloaded here
        replica = Replica(upstream.base_url, upstream, logprobs=settings.engine_logprobs)
        pool = Pool([replica], wanted=router.adapters)
    # Who may call: checked before any handler runs (`auth.py`), by the front for the hot
    # routes and by a guard for the rest; handlers read the `Caller` it found.
    doors = Doors(settings)

    def finish(exchange: Exchange) -> None:
        """Hand the exchange to the collector: its spool line is written before the answer
        (or the stream's last event) leaves, so a crash after that loses nothing."""
        try:
            collector.log(exchange.record(collector.lineage))
        except OSError:
            log.exception("could not spool exchange %s", exchange.id)

    @post("/v1/chat/completions", status_code=200)
    async def chat_completions(request: Request) -> Response | Stream:
        raw = await request.body()
        body = parse_request(raw, settings)
        exchange = await Exchange.open(body, raw, **placing(request, caller(request)))
        return await proxied(exchange, relay, lambda exchange, answer: answer)

    @post("/v1/completions", status_code=200)
    async def completions(request: Request) -> Response | Stream:
        """Legacy text completions: forwarded as they are, logged like chat, each its own
        single-turn conversation (a prompt has no turns to continue)."""
        raw = await request.body()
        body, prompt = parse_completion_request(raw, settings)
        where = placing(request, caller(request))
        where["trajectory_id"] = new_id("traj_")
        exchange = await Exchange.open(
            body,
            raw,
            **where,
            api=COMPLETIONS,
            id_prefix="cmpl-",
            messages=[{"role": "user", "content": prompt}],
        )
        return await proxied(exchange, relay, lambda exchange, answer: answer)

    @post("/v1/responses", status_code=200)
    async def create_response(request: Request) -> Response | Stream:
        """The Responses API, translated into a chat completion at this edge
        (`proxy/responses.py`)."""
        who = caller(request)
        api_key_id = who.api_key_id
        body = responses.parse(await request.body(), settings)
        if forward is not None and "previous_response_id" in body:
            return await forward(request)  # the previous response is in the primary's database
        where = placing(request, who)
        previous = None
        if "previous_response_id" in body:
            previous_id = body["previous_response_id"]
            row = await _lookup(collector, queries.exchange, previous_id)
            if responses.stored_response(row, api_key_id) is not None:
                previous = responses.previous_of(row)
            if previous is None:
                raise NotFound(
                    f"Previous response with id '{previous_id}' not found.",
                    param="previous_response_id",
                )
            where["trajectory_id"] = previous.trajectory_id
            # A chain keeps the arm its previous turn had, while that checkpoint still is one.
            if where["pin"] is None:
                where["pin"] = router.sticky(body["model"], row["checkpoint"])
        chat, call = responses.translate(body, previous)
        raw = msgspec.json.encode(chat)
        exchange = await Exchange.open(
            parse_request(raw, settings),
            raw,
            **where,
            api=responses.RESPONSES,
            id_prefix="resp_",
            after_turn=previous.turn if previous else None,
        )
        if not call.store and api_key_id in settings.untrained_unstored_keys:
            exchange.source = "unstored"  # every reader of traffic takes 'production' only

        def whole(exchange: Exchange, answer: bytes) -> bytes:
            reply = exchange.replies()[0] if exchange.choices else {}
            choice = exchange.choices.get(0)
            response = responses.response_object(
                call,
                exchange.id,
                exchange.route.alias,
                status="completed",
                output=responses.output_items(reply, exchange.id.removeprefix("resp_")),
                usage=exchange.usage,
                finish_reason=choice.finish_reason if choice else None,
            )
            exchange.api_object = responses.stored(response, call)
            return msgspec.json.encode(response)

        return await proxied(
            exchange,
            lambda exchange, resp, span: relay_events(exchange, resp, span, call),
            whole,
        )

    def placing(request: Request, who: Caller) -> dict:
        return {
            "router": router,
            "api_key_id": who.api_key_id,
            "trajectory_id": request.headers.get(TRAJECTORY_HEADER),
            "scenario": request.headers.get(SCENARIO_HEADER),
            "pin": request.headers.get(ARM_HEADER),
            "any_checkpoint": who.admin,  # an API key pins only what its alias serves
        }

    async def proxied(
        exchange: Exchange,
        relay_with: Callable[[Exchange, UpstreamResponse, Any], AsyncIterator[bytes]],
        shape: Callable[[Exchange, bytes], bytes],
    ) -> Response | Stream:
        """Forward an opened exchange (a canary that fails is answered by live), and answer:
        a stream relayed by `relay_with`, or a whole answer shaped by `shape` (both log the
        exchange before the answer's end leaves)."""
        span = telemetry.start(tracer, exchange)
        try:
            try:
                resp, answer = await attempt(exchange)
            except ProxyError as exc:
                if exchange.route.arm != CANARY:
                    raise
                # The canary failed: its attempt is logged against it (an exchange with its
                # arm and error), and the live arm answers the same request in its place.
                exchange.fail(exc.status, exc.message)
                log_attempt(exchange)
                telemetry.end(span, exchange)
                exchange = exchange.rerouted(router.live(exchange.route))
                span = telemetry.start(tracer, exchange)
                resp, answer = await attempt(exchange)
            headers = {EXCHANGE_HEADER: exchange.id, ARM_HEADER: exchange.route.arm}
            if exchange.stream:
                return Stream(
                    relay_with(exchange, resp, span),
                    media_type="text/event-stream",
                    headers={**headers, "Cache-Control": "no-cache"},
                )
        except ProxyError as exc:
            exchange.fail(exc.status, exc.message)
            finish(exchange)
            telemetry.end(span, exchange)
            headers = {EXCHANGE_HEADER: exchange.id, ARM_HEADER: exchange.route.arm}
            if isinstance(exc, UpstreamStatus):
                return _passthrough(exc, headers)
            if isinstance(exc, AdapterUnavailable):
                headers["Retry-After"] = "1"  # the openai client waits this long and retries
            # Logged like any exchange, so the client gets its id to post feedback or look
            # it up, as with an error the engine itself sent.
            return Response(exc.body(), status_code=exc.status, headers=headers)
        body = shape(exchange, answer)
        finish(exchange)
        telemetry.end(span, exchange)
        return Response(body, media_type="application/json", headers=headers)

    async def attempt(exchange: Exchange) -> tuple[UpstreamResponse, bytes | None]:
        """Send the request; a whole answer is also read (by the pool, which replaces an
        engine that dies before it is complete) and shaped here, so that a canary whose
        answer is cut short or malformed is still retried on live (the client has heard
        nothing yet). A stream is relayed as it comes, so it is only sent."""
        resp, raw, definition, stated = await pool.send(
            "/completions" if exchange.api == COMPLETIONS else "/chat/completions",
            exchange.upstream_body(),
            exchange.route.model,
            whole=not exchange.stream,
        )
        exchange.logprobs_mode = logprobs.recorded(
            definition, stated=stated, request=exchange.request
        )
        if exchange.stream:
            return resp, None
        return resp, exchange.answer(raw)

    def log_attempt(exchange: Exchange) -> None:
        """A failed attempt whose turn is retried elsewhere: logged (the loader gives the
        retry its place)."""
        finish(exchange)

    async def relay(exchange: Exchange, resp: UpstreamResponse, span) -> AsyncIterator[bytes]:
        finished = False
        try:
            async for payloads in sse.data_events(resp.chunks()):
                out = []
                for payload in payloads:
                    if payload == sse.DONE:
                        # Logged before the last events leave, which go with [DONE] in one
                        # write (the usual case: the engine's last read holds them all).
                        finish(exchange)
                        finished = True
                        out.append(sse.frame(sse.DONE))
                        break
                    shaped = exchange.chunk(payload)
                    if shaped is not None:
                        out.append(sse.frame(shaped))
                if out:
                    yield b"".join(out)
                if finished:
                    break
            else:
                raise StreamCut("the engine's stream ended without [DONE]")
        except ProxyError as exc:
            exchange.fail(exc.status, exc.message)
            finish(exchange)
            finished = True
            yield sse.frame(msgspec.json.encode(exc.body()))
        finally:
            await resp.aclose()
            if not finished:
                exchange.fail(_CLIENT_CLOSED, "the client closed the stream before the end")
                finish(exchange)
            telemetry.end(span, exchange)

    async def relay_events(
        exchange: Exchange, resp: UpstreamResponse, span, call: responses.Call
    ) -> AsyncIterator[bytes]:
        """The engine's chat stream as the Responses API's events. The exchange, with the
        Response to store, is logged before `response.completed` leaves."""
        events = responses.Events(exchange.id)

        def response(status: str, **fields) -> dict:
            return responses.response_object(
                call, exchange.id, exchange.route.alias, status=status, **fields
            )

        def failed(message: str) -> list[bytes]:
            error = {"code": "server_error", "message": message}
            return [
                events.event("error", code="server_error", message=message, param=None),
                events.event(
                    "response.failed",
                    response=response("failed", output=events.output, error=error),
                ),
            ]

        finished = False
        try:
            start = response("in_progress", output=[])
            yield events.event("response.created", response=start) + events.event(
                "response.in_progress", response=start
            )
            async for payloads in sse.data_events(resp.chunks()):
                out: list[bytes] = []
                for payload in payloads:
                    if payload == sse.DONE:
                        finished = True
                        if exchange.status >= 400:  # the engine's error event came before
                            finish(exchange)
                            break
                        out += events.close()
                        final = response(
                            "completed",
                            output=events.output,
                            usage=exchange.usage,
                            finish_reason=events.finish_reason,
                        )
                        exchange.api_object = responses.stored(final, call)
                        finish(exchange)  # durable before the client hears it is complete
                        out.append(events.event(f"response.{final['status']}", response=final))
                        break
                    data = exchange.absorb(payload)
                    if "error" in data:
                        out += failed(exchange.error or "the engine failed")
                    else:
                        out += events.chunk(data)
                if out:
                    yield b"".join(out)
                if finished:
                    break
            else:
                raise StreamCut("the engine's stream ended without [DONE]")
        except ProxyError as exc:
            exchange.fail(exc.status, exc.message)
            finish(exchange)
            finished = True
            yield b"".join(failed(exc.message))
        finally:
            await resp.aclose()
            if not finished:
                exchange.fail(_CLIENT_CLOSED, "the client closed the stream before the end")
                finish(exchange)
            telemetry.end(span, exchange)

    @get("/v1/responses/{response_id:str}")
    async def retrieve_response(request: Request, response_id: FromPath[str]) -> Any:
        if forward is not None:
            return await forward(request)
        return (await stored_response(request, response_id))["response"]

    @get("/v1/responses/{response_id:str}/input_items")
    async def response_input_items(
        request: Request,
        response_id: FromPath[str],
        limit: FromQuery[int] = 20,
        order: FromQuery[Literal["asc", "desc"]] = "desc",
        after: FromQuery[str | None] = None,
    ) -> Any:
        if forward is not None:
            return await forward(request)
        if not 1 <= limit <= 100:
            raise BadRequest("`limit` must be between 1 and 100.", param="limit")
        items = (await stored_response(request, response_id))["input_items"]
        return responses.input_items_page(items, order=order, limit=limit, after=after)

    @delete("/v1/responses/{response_id:str}", status_code=200)
    async def delete_response(request: Request, response_id: FromPath[str]) -> Any:
        """The stored Response goes; the exchange stays in the log, to learn from."""
        if forward is not None:
            return await forward(request)
        await stored_response(request, response_id)
        if not await collector.query(lambda store: store.forget_response(response_id)):
            raise NotFound(f"No response with id '{response_id}'.", param="response_id")
        return {"id": response_id, "object": "response", "deleted": True}

    async def stored_response(request: Request, response_id: str) -> dict:
        api_key_id = caller(request).api_key_id
        row = await _lookup(collector, queries.exchange, response_id)
        found = responses.stored_response(row, api_key_id)
        if found is None:
            raise NotFound(f"No response with id '{response_id}'.", param="response_id")
        return found

    @get("/v1/models")
    async def models() -> dict:
        with contextlib.suppress(UpstreamError):  # the configured aliases are listed anyway
            await router.discover()
        created = int(time.time())
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "onjob"}
            for name in router.names()
        ]
        return {"object": "list", "data": data}

    @get("/v1/models/{model:path}")
    async def model(model: FromPath[str]) -> dict:
        name = model.lstrip("/")
        with contextlib.suppress(UpstreamError):
            await router.discover()
        if name not in router.names():
            raise NotFound(f"The model `{name}` does not exist.", param="model")
        return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "onjob"}

    @post("/v1/feedback", status_code=200)
    async def feedback(request: Request) -> Any:
        if forward is not None:
            return await forward(request)  # checked against the primary's database
        api_key_id = caller(request).api_key_id
        try:
            fb = msgspec.json.decode(await request.body(), type=openapi.Feedback)
        except msgspec.ValidationError as exc:
            raise BadRequest(f"Invalid feedback: {exc}") from exc
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"Malformed JSON body: {exc}") from exc
        if not (fb.exchange_id or fb.trajectory_id):
            raise BadRequest("Feedback needs an `exchange_id` or a `trajectory_id`.")
        # Another key's exchange or conversation is answered as missing: its id stays secret.
        # A named conversation is the key's own name for it (as when chatting).
        trajectory_id = scoped(fb.trajectory_id, api_key_id) if fb.trajectory_id else None
        if fb.exchange_id:
            row = await _lookup(collector, queries.exchange, fb.exchange_id)
            if row is None or row["api_key_id"] != api_key_id:
                raise NotFound(f"No exchange `{fb.exchange_id}`.", param="exchange_id")
            trajectory_id = trajectory_id or row["trajectory_id"]
        if fb.trajectory_id:
            owner = await _lookup(collector, queries.trajectory_owner, trajectory_id)
            if not owner or owner[0]["api_key_id"] != api_key_id:
                raise NotFound(f"No trajectory `{fb.trajectory_id}`.", param="trajectory_id")
        record = FeedbackRecord(
            id=new_id("fb_"),
            ts=time.time(),
            exchange_id=fb.exchange_id,
            trajectory_id=trajectory_id,
            api_key_id=api_key_id,
            value=fb.value,
            comment=fb.comment,
        )
        collector.log(record)
        return {"object": "feedback", **msgspec.structs.asdict(record)}

    @get("/openapi.json")
    async def openapi_document() -> dict:
        # Behind an API key like the rest (it names the models, as /v1/models does).
        with contextlib.suppress(UpstreamError):
            await router.discover()
        return openapi.document(settings, router.names())

    @get("/health")
    async def health() -> dict:
        # The pid tells apart the processes answering on one port (`--workers`).
        return {"status": "ok", "pid": os.getpid(), "collector": collector.stats()}

    @route(
        ["/admin/{rest:path}", "/dashboard", "/dashboard/{rest:path}"],
        http_method=["GET", "POST", "PUT", "PATCH", "DELETE"],
        include_in_schema=False,
        guards=[doors.forward_guard],
    )
    async def forwarded(request: Request) -> Any:
        """A proxy-only process: the admin API and the dashboard are the primary's."""
        return await forward(request)

    async def shutdown() -> None:
        for hook in on_shutdown:
            await hook()
        if forward is not None:
            await forward.aclose()
        await pool.aclose()
        await collector.close()

    return ProxyApp(
        # The routes that carry the traffic, answered without Litestar's machinery per
        # request (`front.py`); the same functions stay Litestar's routes for the rest.
        hot={
            "/v1/chat/completions": chat_completions.fn,
            "/v1/completions": completions.fn,
            "/v1/responses": create_response.fn,
        },
        doors=doors,
        route_handlers=[
            Routes(
                "/",
                guards=[doors.api_guard],
                route_handlers=[
                    chat_completions,
                    completions,
                    create_response,
                    retrieve_response,
                    response_input_items,
                    delete_response,
                    models,
                    model,
                    feedback,
                    openapi_document,
                ],
            ),
            health,
            *([forwarded] if forward is not None else []),
            *routes,
        ],
        on_startup=[collector.start, *on_startup, pool.start],
        on_shutdown=[shutdown],
        exception_handlers=HANDLERS,
        request_max_body_size=settings.max_body_bytes,
        openapi_config=None,
        logging_config=None,  # the host application owns logging (and root stays quiet)
    )


async def _lookup(collector: Collector, query, key: str):
    """Ask the database; if it does not know `key` yet, load the spool (what other proxy
    processes hold too) and ask again."""
    found = await collector.query(lambda store: query(store, key))
    if not found:
        await collector.caught_up()
        found = await collector.query(lambda store: query(store, key))
    return found


def _passthrough(exc: UpstreamStatus, headers: dict) -> Response:
    """The engine's error as sent when it is OpenAI-shaped JSON, else wrapped in that shape."""
    try:
        ok = isinstance(msgspec.json.decode(exc.raw).get("error"), dict)
    except (msgspec.DecodeError, AttributeError):
        ok = False
    content = (
        exc.raw
        if ok
        else msgspec.json.encode(error_body(exc.message, "upstream_error", exc.status))
    )
    return Response(content, status_code=exc.status, media_type="application/json", headers=headers)
