"""The public API's OpenAPI document (`GET /openapi.json`): `/v1/chat/completions`,
`/v1/completions`, the Responses API (`/v1/responses` and its stored objects),
`/v1/models`, `/v1/models/{model}`, `/v1/feedback` and `/health`.

Generated, not written out: the schemas by msgspec from the typed bodies of
`protocol.py`, the ones the proxy checks requests and builds answers with (the bounds on
`n` and `max_tokens` and the served model names from the server's settings and router);
the paths from `ROUTES`, one `Route` per operation naming those bodies, built with
Litestar's OpenAPI types. Litestar does not generate this document from the handlers
(its own is off): the hot routes are answered in front of its router.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec
from litestar.openapi.spec import (
    Components,
    Info,
    OpenAPI,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Parameter,
    PathItem,
    Reference,
    RequestBody,
    Schema,
)
from litestar.openapi.spec.security_scheme import SecurityScheme

from ..openai_errors import Error
from ..protocol import ChatCompletionRequest, CompletionRequest
from ..protocol.chat import ChatCompletion, ChatCompletionChunk
from ..protocol.completion import TextCompletion
from ..protocol.fields import Exact
from ..protocol.responses import InputItems, ResponseDeleted, ResponseObject, ResponseRequest
from .protocol import Feedback, FeedbackRecorded, Health, Model, ModelList
from .settings import ProxySettings

_REF = "#/components/schemas/{name}"


class Answer(msgspec.Struct, frozen=True):
    """One status of an operation: what it means, its JSON body's schema (a component's
    name), the event each `data:` line of its stream carries (`stream: true`), and
    whether it carries the exchange's id and arm as headers."""

    description: str
    body: str | None = "Error"
    events: str | None = None
    exchange: bool = False


class Param(msgspec.Struct, frozen=True, kw_only=True):
    """A path, query or header parameter: a string, unless `type` or `enum` says."""

    name: str
    where: Literal["path", "query", "header"]
    type: Literal["string", "integer"] | None = "string"
    enum: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None
    description: str | None = None


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """One operation of the public API, as the document shows it."""

    path: str
    method: str
    summary: str
    body: str | None = None  # the request body's component
    params: tuple[Param, ...] = ()
    answers: Mapping[str, Answer]
    open: bool = False  # answered without an API key


_UNAUTHORIZED = Answer("missing or wrong API key")
_TRACED = (
    Param(name="X-Onjob-Trajectory", where="header", description="names the conversation"),
    Param(name="X-Onjob-Scenario", where="header", description="names its starting situation"),
    Param(
        name="X-Onjob-Arm",
        where="header",
        description="pins `live`, `canary`, or by name the alias's live or canary checkpoint, "
        "for this request (any other checkpoint: the admin key as the bearer token)",
    ),
)
_RESPONSE_ID = Param(name="response_id", where="path")
_NO_RESPONSE = Answer("no stored response with this id for this API key")


def _forwarded(answered: Answer, max_body_bytes: int, not_found: str) -> Mapping[str, Answer]:
    """The statuses of a route that forwards to the engine."""
    return {
        "200": answered,
        "400": Answer("malformed JSON, a wrong type, `n` or `max_tokens` out of bounds"),
        "401": _UNAUTHORIZED,
        "403": Answer(
            "`X-Onjob-Arm` names a checkpoint the alias does not serve, or a web page of "
            "another site sent the request (`Origin`)"
        ),
        "404": Answer(not_found),
        "413": Answer(f"body over {max_body_bytes} bytes"),
        "502": Answer("engine unreachable, or its answer malformed"),
        "504": Answer("engine silent for too long"),
        "default": Answer("an error the engine answered, passed on with its status"),
    }


def routes(settings: ProxySettings) -> list[Route]:
    """Every operation of the public API."""
    size = settings.max_body_bytes
    return [*_hot(size), *_stored_and_other(size)]


def _hot(size: int) -> list[Route]:
    """Chat, legacy completions and the Responses API: the routes that carry the traffic."""
    whole_or_stream = "the answer, whole or as server-sent events (`stream`)"
    return [
        Route(
            path="/v1/chat/completions",
            method="post",
            summary="Chat completion, forwarded to the engine and logged",
            body="ChatCompletionRequest",
            params=_TRACED,
            answers=_forwarded(
                Answer(whole_or_stream, "ChatCompletion", "ChatCompletionChunk", True),
                size,
                "unknown model",
            ),
        ),
        Route(
            path="/v1/completions",
            method="post",
            summary="Legacy text completion, forwarded to the engine and logged",
            body="CompletionRequest",
            answers=_forwarded(
                Answer(whole_or_stream, "TextCompletion", "TextCompletion", True),
                size,
                "unknown model",
            ),
        ),
        Route(
            path="/v1/responses",
            method="post",
            summary="The Responses API: translated into a chat completion and logged as one",
            body="ResponseRequest",
            params=_TRACED,
            answers=_forwarded(
                Answer(
                    "the Response, or its typed events (`stream`): `response.created` ... "
                    "`response.completed`",
                    "ResponseObject",
                    "",  # typed events of their own, each an object
                    True,
                ),
                size,
                "unknown model, or no `previous_response_id` stored for this key",
            ),
        ),
    ]


def _stored_and_other(size: int) -> list[Route]:
    """The stored Responses, the models, feedback and health."""
    return [
        Route(
            path="/v1/responses/{response_id}",
            method="get",
            summary="A stored Response",
            params=(_RESPONSE_ID,),
            answers={
                "200": Answer("as it was answered", "ResponseObject"),
                "401": _UNAUTHORIZED,
                "404": _NO_RESPONSE,
            },
        ),
        Route(
            path="/v1/responses/{response_id}",
            method="delete",
            summary="Forget a stored Response (its exchange stays logged)",
            params=(_RESPONSE_ID,),
            answers={
                "200": Answer("deleted", "ResponseDeleted"),
                "401": _UNAUTHORIZED,
                "404": _NO_RESPONSE,
            },
        ),
        Route(
            path="/v1/responses/{response_id}/input_items",
            method="get",
            summary="The input items of a stored Response",
            params=(
                _RESPONSE_ID,
                Param(name="limit", where="query", type="integer", minimum=1, maximum=100),
                Param(name="order", where="query", type=None, enum=("asc", "desc")),
                Param(name="after", where="query"),
            ),
            answers={
                "200": Answer("a page of items", "InputItems"),
                "400": Answer("`limit` out of bounds, or `after` not an item"),
                "401": _UNAUTHORIZED,
                "404": _NO_RESPONSE,
            },
        ),
        Route(
            path="/v1/models",
            method="get",
            summary="The model names this server answers to",
            answers={"200": Answer("aliases and base model", "ModelList"), "401": _UNAUTHORIZED},
        ),
        Route(
            path="/v1/models/{model}",
            method="get",
            summary="One model name this server answers to",
            params=(Param(name="model", where="path"),),
            answers={
                "200": Answer("the model", "Model"),
                "401": _UNAUTHORIZED,
                "404": Answer("no such model"),
            },
        ),
        Route(
            path="/v1/feedback",
            method="post",
            summary="A signal about an exchange or a conversation of this API key",
            body="Feedback",
            answers={
                "200": Answer("recorded", "FeedbackRecorded"),
                "400": Answer("malformed body, or neither id given"),
                "401": _UNAUTHORIZED,
                "404": Answer("no such exchange or conversation for this API key"),
                "413": Answer(f"body over {size} bytes"),
            },
        ),
        Route(
            path="/health",
            method="get",
            summary="Liveness; this process's counters to the admin key alone",
            answers={"200": Answer("serving", "Health")},
            open=True,
        ),
    ]


def document(settings: ProxySettings, models: list[str]) -> bytes:
    """The OpenAPI 3.1 document of this server's public API, as JSON."""
    types = [
        ChatCompletionRequest,
        ChatCompletion,
        ChatCompletionChunk,
        ModelList,
        Feedback,
        FeedbackRecorded,
        Health,
        Error,
        Model,
        CompletionRequest,
        TextCompletion,
        ResponseRequest,
        ResponseObject,
        ResponseDeleted,
        InputItems,
    ]
    _, schemas = msgspec.json.schema_components(types, ref_template=_REF)
    # An engine's answer may carry fields its declaration does not know, which the proxy
    # passes on as sent (`protocol.checks.known`): no answer's object is closed.
    for name in _exact(Exact):
        schemas.get(name, {}).pop("additionalProperties", None)
    _served(schemas, settings, models)
    paths: dict[str, PathItem] = {}
    for route in routes(settings):
        item = paths.setdefault(route.path, PathItem())
        setattr(item, route.method, _operation(route))
    keyed = bool(settings.api_keys)
    doc = OpenAPI(
        openapi="3.1.0",
        servers=[],  # the server a client already reached
        info=Info(
            title="onjob",
            version="1",
            description="An OpenAI-compatible proxy that logs every exchange to learn from.",
        ),
        paths=paths,
        components=Components(
            security_schemes={"apiKey": SecurityScheme(type="http", scheme="bearer")}
            if keyed
            else None,
        ),
        security=[{"apiKey": []}] if keyed else None,
    )
    out = doc.to_schema()
    # msgspec's schemas as they are: Litestar's conversion would drop their `null`s.
    out.setdefault("components", {})["schemas"] = schemas
    return msgspec.json.encode(out)


def _exact(kind: type) -> set[str]:
    """The names of `kind`'s subclasses, at every depth."""
    return {n for sub in kind.__subclasses__() for n in (sub.__name__, *_exact(sub))}


def _served(schemas: dict[str, Any], settings: ProxySettings, models: list[str]) -> None:
    """The requests' schemas with this server's bounds (`proxy.max_n`,
    `proxy.max_tokens_limit`, which the proxy checks past the protocol's) and the model
    names it serves."""
    most = {
        "n": settings.max_n,
        "max_tokens": settings.max_tokens_limit,
        "max_completion_tokens": settings.max_tokens_limit,
    }
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        fields = schemas[name]["properties"]
        for field, limit in most.items():
            if field in fields:
                fields[field]["anyOf"][0]["maximum"] = limit
    if models:
        schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] = models


def _operation(route: Route) -> Operation:
    return Operation(
        summary=route.summary,
        parameters=[_parameter(p) for p in route.params] or None,
        request_body=RequestBody(required=True, content=_json(route.body)) if route.body else None,
        responses={status: _response(a) for status, a in route.answers.items()},
        security=[] if route.open else None,
    )


def _parameter(p: Param) -> Parameter:
    return Parameter(
        name=p.name,
        param_in=p.where,
        schema=Schema(
            type=OpenAPIType(p.type) if p.type else None,
            enum=list(p.enum) if p.enum else None,
            minimum=p.minimum,
            maximum=p.maximum,
        ),
        description=p.description,
        required=p.where == "path",
    )


def _response(a: Answer) -> OpenAPIResponse:
    content = _json(a.body) if a.body else {}
    if a.events is not None:
        content["text/event-stream"] = OpenAPIMediaType(schema=_events(a.events))
    return OpenAPIResponse(
        description=a.description,
        headers={
            name: OpenAPIHeader(schema=Schema(type=OpenAPIType.STRING))
            for name in ("X-Onjob-Exchange-Id", "X-Onjob-Arm")
        }
        if a.exchange
        else None,
        content=content or None,
    )


def _json(name: str) -> dict[str, OpenAPIMediaType]:
    return {"application/json": OpenAPIMediaType(schema=Reference(_REF.format(name=name)))}


def _events(name: str) -> Schema:
    """Open API 3.1 reads an event stream's schema as that of each event: a `data:` line
    holding `name`'s JSON or an error, or `[DONE]` ("": an object of its own type)."""
    if not name:
        return Schema(type=OpenAPIType.OBJECT)
    each = Schema(
        type=OpenAPIType.STRING,
        content_media_type="application/json",
        content_schema=Schema(
            any_of=[Reference(_REF.format(name=name)), Reference(_REF.format(name="Error"))]
        ),
    )
    return Schema(
        type=OpenAPIType.OBJECT,
        required=["data"],
        properties={"data": Schema(any_of=[Schema(const="[DONE]"), each])},
    )
