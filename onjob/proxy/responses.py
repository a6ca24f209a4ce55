"""The Responses API at the proxy's edge: translated into the chat completion the engine
serves, and the chat answer translated back.

The engine, the stitcher, the judge and the trainer see one format: a Responses call is
logged as the chat exchange it became (`request`, `response`, token ids, logprobs), with
`api = 'responses'`, and the Response object and its input items ride on the same row
(`api_object`), so a stored response is exactly as durable as the exchange: spooled
before the answer (or the stream's `response.completed`) leaves, replayed after a crash,
in DuckDB after a restart. `store: false` logs the exchange with no `api_object`: nothing
to retrieve, still there to learn from.

`previous_response_id` continues the previous response's conversation: its chat messages
(without its `instructions`, which OpenAI does not carry over) and its reply come first,
and its trajectory is this one's, named by the chain rather than found by matching text.

What onjob cannot honour (built-in tools, `background`, `conversation`, reasoning
controls, images from file ids, ...) is a 400 that names the `param`: an agent learns at
once, instead of getting an answer that quietly ignored what it asked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..collector.ids import new_id
from ..collector.queries import LoggedExchange
from ..protocol import ChatCompletionRequest, Message, decode_body
from ..protocol.chat import (
    FunctionCall,
    JsonSchema,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    ToolCall,
    ToolChoice,
)
from ..protocol.checks import validated
from ..protocol.fields import FunctionDefinition, Tool
from ..protocol.responses import (
    RESPONSES_REFUSED,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItems,
    Item,
    MessageItem,
    ResponseObject,
    ResponseRequest,
    ResponseUsage,
    StoredResponse,
    TextPart,
)
from . import sse
from .errors import BadRequest
from .settings import ProxySettings

RESPONSES = "responses"  # `exchanges.api` of a Responses call

_decode = msgspec.json.decode
_encode = msgspec.json.encode

# `include` values honoured: no reasoning items are produced, so there is none to include.
_INCLUDABLE = frozenset({"reasoning.encrypted_content"})


@dataclass
class Call:
    """One Responses request: the client's request, its input items (with ids, as
    `input_items` lists them) and what the Response object echoes."""

    request: ResponseRequest
    items: list[Item]
    instructions: str | None
    store: bool
    previous_response_id: str | None = None
    created_at: int = field(default_factory=lambda: int(time.time()))

    @property
    def stream(self) -> bool:
        return bool(self.request.stream)


@dataclass(frozen=True)
class Previous:
    """What a chained request takes from the response it continues (its exchange row)."""

    id: str
    trajectory_id: str
    turn: int
    messages: list[Message]  # its conversation, reply included, without its instructions


def parse(raw: bytes, settings: ProxySettings) -> ResponseRequest:
    """The client's body as the request it is (`protocol.responses.ResponseRequest`): every field is
    honoured or refused with its `param`; null is absent."""
    body = {k: v for k, v in decode_body(raw).items() if v is not None}
    request = validated(body, ResponseRequest)
    for key, (noop, why) in RESPONSES_REFUSED.items():
        if key in body and body[key] != noop:
            raise BadRequest(f"`{key}` is not supported: {why}.", param=key)
    most = settings.max_tokens_limit
    if request.max_output_tokens is not None and request.max_output_tokens > most:
        raise BadRequest(
            f"`max_output_tokens` must be between 1 and {most}.", param="max_output_tokens"
        )
    for value in request.include or ():
        if value not in _INCLUDABLE:
            raise BadRequest(f"`include` value {value!r} is not supported.", param="include")
    for key, value in (request.reasoning or {}).items():
        if value is not None:
            raise BadRequest("The engine has no reasoning controls.", param=f"reasoning.{key}")
    if type(request.input) is list and len(request.input) > settings.max_messages:
        raise BadRequest(
            f"`input` holds {len(request.input)} items; at most {settings.max_messages} are "
            "accepted (proxy.max_messages).",
            param="input",
        )
    return request


def translate(
    request: ResponseRequest, previous: Previous | None
) -> tuple[ChatCompletionRequest, Call]:
    """The chat request the engine answers, and the call as the Response will echo it.

    The chat request is encoded with the fields set here and no others (its `omit_defaults`):
    its bytes are what the exchange logs and the proxy checks as any client's."""
    items = _items(request.input)
    instructions = request.instructions
    messages: list[Message] = []
    if instructions:
        messages.append(Message(role="system", content=instructions))
    if previous is not None:
        messages.extend(previous.messages)
    messages.extend(_messages(items))
    if not messages:
        raise BadRequest("`input` must not be empty.", param="input")
    # The Agents SDK sends `tools: []` for an agent without tools; chat engines refuse an
    # empty list (vLLM 0.33, OpenAI) and a `tool_choice` without tools, so "no tools" is
    # sent as none, with a choice that asks for no call ("auto", "none") left out.
    tools = _chat_tools(request.tools or [])
    choice = None
    if request.tool_choice is not None:
        choice = _tool_choice(request.tool_choice)
        if not tools and choice in ("auto", "none"):
            choice = None
    chat = ChatCompletionRequest(
        model=request.model,
        messages=messages,
        tools=tools or None,
        tool_choice=choice,
        parallel_tool_calls=request.parallel_tool_calls,
        temperature=request.temperature,
        top_p=request.top_p,
        user=request.user,
        metadata=request.metadata,
        max_tokens=request.max_output_tokens,
        response_format=_response_format(request.text or {}),
        stream=True if request.stream else None,
    )
    call = Call(
        request=request,
        items=items,
        instructions=instructions,
        store=request.store is not False,
        previous_response_id=previous.id if previous else None,
    )
    return chat, call


def _items(value: Any) -> list[Item]:
    """The input as items, each with an id (a string is one user message).

    What a client re-sending its history may drop or add is read as OpenAI reads it, so
    the chat messages (all the stitcher compares: `collector.trajectories.canonical`) are
    the same whichever way it re-serialised the output items it got: ids and `status` are
    not part of a message, and a null field is an absent one (`model_dump()` of the SDK's
    `EasyInputMessage` sends `"type": null`)."""
    if type(value) is str:
        value = [{"type": "message", "role": "user", "content": value}]
    if type(value) is not list:
        raise BadRequest("`input` must be a string or an array of items.", param="input")
    out = []
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if type(item) is not dict:
            raise BadRequest(f"`{param}` must be an object.", param=param)
        item = {k: v for k, v in item.items() if v is not None}
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message_item(item, param))
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if type(item.get(key)) is not str:
                    raise BadRequest(f"`{param}.{key}` must be a string.", param=f"{param}.{key}")
            out.append(
                FunctionCallItem(
                    id=item.get("id") or new_id("fc_"),
                    call_id=item["call_id"],
                    name=item["name"],
                    arguments=item["arguments"],
                    status="completed",
                )
            )
        elif kind == "function_call_output":
            output = item.get("output")
            if type(output) is list:
                output = _text(output, f"{param}.output")
            if type(item.get("call_id")) is not str or type(output) is not str:
                raise BadRequest(f"`{param}` needs a string `call_id` and `output`.", param=param)
            out.append(
                FunctionCallOutputItem(
                    id=item.get("id") or new_id("fco_"),
                    call_id=item["call_id"],
                    output=output,
                    status="completed",
                )
            )
        else:
            raise BadRequest(
                f"Input items of type {kind!r} are not supported (messages, `function_call` "
                "and `function_call_output` are).",
                param=f"{param}.type",
            )
    return out


def _message_item(item: dict, param: str) -> MessageItem:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise BadRequest(
            f"`{param}.role` must be user, system, developer or assistant.", param=f"{param}.role"
        )
    content = item.get("content")
    text = content if type(content) is str else _text(content, f"{param}.content")
    if role == "assistant":
        part = TextPart(type="output_text", text=text, annotations=[])
    else:
        part = TextPart(type="input_text", text=text)
    return MessageItem(
        id=item.get("id") or new_id("msg_"), role=role, status="completed", content=[part]
    )


def _text(parts: Any, param: str) -> str:
    """Text parts joined; any other part (an image, a file, audio) is refused."""
    if type(parts) is not list:
        raise BadRequest(f"`{param}` must be a string or an array of parts.", param=param)
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if type(part) is dict else None
        if kind not in ("input_text", "output_text", "text") or type(part.get("text")) is not str:
            raise BadRequest(
                f"`{param}[{j}]`: only text parts are supported (got {kind!r}).",
                param=f"{param}[{j}]",
            )
        texts.append(part["text"])
    return "".join(texts)


def _messages(items: list[Item]) -> list[Message]:
    """Items as chat messages: an assistant message and the function calls after it are
    one assistant message (as the chat API answered them), so a client sending the whole
    history back continues its trajectory, as does one handing back only the calls it ran
    (`collector.trajectories.alone`; docs/proxy.md, "How turns are stitched")."""
    out: list[Message] = []
    for item in items:
        if isinstance(item, MessageItem):
            out.append(Message(role=item.role, content=item.content[0].text))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(
                id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments)
            )
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or ()), call]
            else:
                out.append(Message(role="assistant", content=None, tool_calls=[call]))
        else:
            out.append(Message(role="tool", tool_call_id=item.call_id, content=item.output))
    return out


def _chat_tools(tools: list[FunctionTool]) -> list[Tool]:
    """Responses' flat function tools as chat's nested ones (built-in tools were refused by
    the request's type)."""
    return [
        Tool(
            function=FunctionDefinition(
                name=t.name, description=t.description, parameters=t.parameters, strict=t.strict
            )
        )
        for t in tools
    ]


def _tool_choice(choice: Any) -> ToolChoice:
    if choice in ("auto", "none", "required"):
        return choice
    if type(choice) is dict and choice.get("type") == "function":
        if type(choice.get("name")) is not str:
            raise BadRequest("`tool_choice.name` must be a string.", param="tool_choice.name")
        return NamedToolChoice(function=NamedFunction(name=choice["name"]))
    raise BadRequest(
        "`tool_choice` must be 'auto', 'none', 'required' or a function.", param="tool_choice"
    )


def _response_format(text: dict) -> ResponseFormat | None:
    """Responses' `text.format` as chat's `response_format` (None: plain text)."""
    for key, value in text.items():
        if key != "format" and value is not None:
            raise BadRequest(f"`text.{key}` is not supported.", param=f"text.{key}")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if type(fmt) is dict else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat(type="json_object")
    if kind == "json_schema":
        if type(fmt.get("name")) is not str or type(fmt.get("schema")) is not dict:
            raise BadRequest(
                "`text.format` json_schema needs a string `name` and an object `schema`.",
                param="text.format",
            )
        try:
            schema = msgspec.convert(fmt, JsonSchema, strict=True)
        except msgspec.ValidationError as exc:
            raise BadRequest(f"`text.format`: {exc}.", param="text.format") from None
        return ResponseFormat(type="json_schema", json_schema=schema)
    raise BadRequest(
        "`text.format.type` must be text, json_object or json_schema.", param="text.format.type"
    )


def previous_of(row: LoggedExchange, stored: StoredResponse) -> Previous | None:
    """The conversation a stored response (`stored`, of `row`) continues; None when the row
    holds no answered call (it failed)."""
    if row.status >= 400 or row.response is None:
        return None
    request = _decode(row.request)
    answer = _decode(row.response)
    skip = 1 if stored.response.instructions else 0
    reply = answer["choices"][0]["message"]
    shaped = {"role": "assistant", "content": reply.get("content")}
    if reply.get("tool_calls"):
        shaped["tool_calls"] = reply["tool_calls"]
    try:
        messages = msgspec.convert([*request["messages"][skip:], shaped], list[Message])
    except msgspec.ValidationError as exc:
        raise BadRequest(
            f"The conversation of response '{row.id}' cannot be continued: {exc}.",
            param="previous_response_id",
        ) from None
    return Previous(id=row.id, trajectory_id=row.trajectory_id, turn=row.turn, messages=messages)


def stored_response(row: LoggedExchange | None, api_key_id: str | None) -> StoredResponse | None:
    """A row's stored Response and input items, if this key may see them."""
    if row is None or row.api != RESPONSES or row.api_object is None:
        return None
    if row.api_key_id != api_key_id:
        return None  # another key's response is answered as missing: its id stays secret
    return _decode(row.api_object, type=StoredResponse)


# -- The answer back ------------------------------------------------------------------


def output_items(message: dict, id_suffix: str) -> list[Item]:
    """A chat reply as Responses output items: its text as one message, then each call."""
    items: list[Item] = []
    if message.get("content"):
        items.append(_message_out(f"msg_{id_suffix}", message["content"], "completed"))
    for k, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        items.append(
            FunctionCallItem(
                id=f"fc_{id_suffix}_{k}",
                status="completed",
                call_id=call.get("id") or f"call_{id_suffix}_{k}",
                name=fn.get("name", ""),
                arguments=fn.get("arguments", ""),
            )
        )
    return items


def _message_out(item_id: str, text: str, status: str) -> MessageItem:
    return MessageItem(id=item_id, role="assistant", status=status, content=[_output_text(text)])


def _output_text(text: str) -> TextPart:
    return TextPart(type="output_text", text=text, annotations=[], logprobs=[])


def usage_of(usage: dict | None) -> ResponseUsage | None:
    if not usage:
        return None
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return ResponseUsage(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=usage.get("total_tokens", prompt + completion),
    )


def response_object(
    call: Call,
    response_id: str,
    model: str,
    *,
    status: str,
    output: list[Item],
    usage: dict | None = None,
    finish_reason: str | None = None,
    error: dict | None = None,
) -> ResponseObject:
    """The Response object (`protocol.responses.ResponseObject`), echoing the call."""
    asked = call.request
    incomplete = None
    if status == "completed" and finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    fmt = (asked.text or {}).get("format") or {"type": "text"}
    return ResponseObject(
        id=response_id,
        created_at=call.created_at,
        status=status,
        error=error,
        incomplete_details=incomplete,
        instructions=call.instructions,
        max_output_tokens=asked.max_output_tokens,
        metadata=asked.metadata or {},
        model=model,
        output=output,
        parallel_tool_calls=asked.parallel_tool_calls is not False,
        previous_response_id=call.previous_response_id,
        store=call.store,
        temperature=1.0 if asked.temperature is None else asked.temperature,
        text={"format": fmt},
        tool_choice="auto" if asked.tool_choice is None else asked.tool_choice,
        tools=asked.tools or [],
        top_p=1.0 if asked.top_p is None else asked.top_p,
        usage=usage_of(usage),
        user=asked.user,
    )


def stored(response: ResponseObject, call: Call) -> StoredResponse | None:
    """What the exchange row keeps for `GET` (None when the client said `store: false`)."""
    return StoredResponse(response=response, input_items=call.items) if call.store else None


class Events:
    """Chat stream chunks as the Responses API's typed events, numbered in order.

    Text opens a message item (`output_item.added`, `content_part.added`) and streams as
    `output_text.delta`; each tool call opens a `function_call` item and streams its
    arguments; the end closes what is open (`*.done`, `output_item.done`) and the caller
    sends `response.completed` with the whole Response.
    """

    def __init__(self, response_id: str) -> None:
        self.suffix = response_id.removeprefix("resp_")
        self.seq = 0
        self.output: list[Item] = []
        self._text: MessageItem | None = None  # the open message item
        self._calls: dict[int, FunctionCallItem] = {}  # chat tool-call index -> open call
        self.finish_reason: str | None = None

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse.frame(_encode(payload), kind)

    def chunk(self, data: dict) -> list[bytes]:
        out: list[bytes] = []
        for choice in data.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text_delta(delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self._call_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def _text_delta(self, text: str) -> list[bytes]:
        out = []
        if self._text is None:
            item = MessageItem(
                id=f"msg_{self.suffix}", role="assistant", status="in_progress", content=[]
            )
            self._text = item
            self.output.append(item)
            index = len(self.output) - 1
            out.append(self.event("response.output_item.added", output_index=index, item=item))
            part = _output_text("")
            out.append(
                self.event(
                    "response.content_part.added",
                    item_id=item.id,
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
            item.content.append(part)
        item = self._text
        item.content[0].text += text
        out.append(
            self.event(
                "response.output_text.delta",
                item_id=item.id,
                output_index=self.output.index(item),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def _call_delta(self, delta: dict) -> list[bytes]:
        out = []
        index = delta.get("index", 0)
        fn = delta.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            out += self._close_text()
            item = FunctionCallItem(
                id=f"fc_{self.suffix}_{index}",
                status="in_progress",
                call_id=delta.get("id") or f"call_{self.suffix}_{index}",
                name=fn.get("name") or "",
                arguments="",
            )
            self._calls[index] = item
            self.output.append(item)
            out.append(
                self.event(
                    "response.output_item.added", output_index=len(self.output) - 1, item=item
                )
            )
        elif fn.get("name"):
            item.name += fn["name"]
        if fn.get("arguments"):
            item.arguments += fn["arguments"]
            out.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=item.id,
                    output_index=self.output.index(item),
                    delta=fn["arguments"],
                )
            )
        return out

    def _close_text(self) -> list[bytes]:
        item, self._text = self._text, None
        if item is None:
            return []
        index = self.output.index(item)
        part = item.content[0]
        item.status = "completed"
        return [
            self.event(
                "response.output_text.done",
                item_id=item.id,
                output_index=index,
                content_index=0,
                text=part.text,
                logprobs=[],
            ),
            self.event(
                "response.content_part.done",
                item_id=item.id,
                output_index=index,
                content_index=0,
                part=part,
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def close(self) -> list[bytes]:
        """The events that close every open item."""
        out = self._close_text()
        for item in self._calls.values():
            index = self.output.index(item)
            item.status = "completed"
            out.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item.id,
                    output_index=index,
                    name=item.name,
                    arguments=item.arguments,
                )
            )
            out.append(self.event("response.output_item.done", output_index=index, item=item))
        self._calls = {}
        return out


def input_items_page(items: list[dict], *, order: str, limit: int, after: str | None) -> InputItems:
    """One page of `GET /v1/responses/{id}/input_items` (newest first unless `asc`)."""
    ordered = list(reversed(items)) if order == "desc" else list(items)
    if after is not None:
        ids = [item.id for item in ordered]
        if after not in ids:
            raise BadRequest(f"No input item `{after}` in this response.", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    page = ordered[:limit]
    return InputItems(
        data=page,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=len(ordered) > limit,
    )
