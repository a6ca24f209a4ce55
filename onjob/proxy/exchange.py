"""One chat exchange on its way through the proxy.

`parse_request` checks the client's request into an `Asked`: the request as its protocol
declares it, which the proxy reads, beside the body as sent, which the engine gets.
`Exchange.open()` takes it, computes what the loader will place it in its trajectory by
(`collector.trajectories.keys`) and picks its arm from the conversation's opening;
`upstream_body()` is the engine's request (logprobs and token ids always on: the trainer
needs them). `answer()` shapes a whole answer for the client, `chunk()` one streamed
event; both take out what the client did not ask for, put the exchange id and the
client's model name in, and keep what the collector stores. `record()` is the spool
line."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET

from .. import logprobs
from ..collector import ExchangeRecord
from ..collector.ids import new_id
from ..collector.linear import WHOLE, Lineage, stored
from ..collector.records import to_json
from ..collector.trajectories import Keys, continuations, keys, scoped
from ..protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    JsonObject,
    chat,
    completion,
    decode_body,
    engine_body,
)
from ..protocol.chat import (
    AnswerMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
)
from ..protocol.checks import known
from ..protocol.completion import TextCompletion
from ..protocol.fields import HINTS
from ..protocol.responses import StoredResponse
from .errors import BadRequest, MalformedAnswer
from .routing import Route, Router
from .settings import ProxySettings

_decode = msgspec.json.decode
_encode = msgspec.json.encode
_decode_chunk = msgspec.json.Decoder(ChatCompletionChunk).decode
# What an engine's event or answer that is not JSON (or not UTF-8) raises in decoding.
_UNREADABLE = (msgspec.DecodeError, UnicodeDecodeError)


COMPLETIONS = "completions"  # `exchanges.api` of a legacy text completion

# vLLM's names for a reasoning parser's text in a streamed delta (0.11, then later).
_REASONING = ("reasoning_content", "reasoning")


@dataclass(frozen=True)
class Asked:
    """A client's request after its check: as its protocol declares it (`typed`, what the
    proxy reads of it) and as sent (`body`, less its hints and nulls: what the engine gets,
    the fields the protocol does not declare as the client wrote them)."""

    typed: ChatCompletionRequest | CompletionRequest
    body: dict


def parse_request(raw: bytes, settings: ProxySettings) -> Asked:
    """The client's body, decoded by the one rule (`protocol.decode_body`) and checked as
    the chat request it is (`protocol.chat`: every declared field's type and bounds, the
    refused fields), with this server's bounds on `n`, `max_tokens` and the number of
    messages."""
    body = decode_body(raw)
    messages = body.get("messages")
    if type(messages) is list and len(messages) > settings.max_messages:
        # Checked before any message is looked at: each is checked and hashed on the event
        # loop, and 400,000 of them (12 MiB) held it 0.76 s; refused here, 0.12 s, mostly
        # the decoding (bench/proxy/many_messages.py).
        raise BadRequest(
            f"`messages` holds {len(messages)} messages; at most {settings.max_messages} are "
            "accepted (proxy.max_messages).",
            param="messages",
        )
    request = chat.checked(body)
    _check_bound("n", request.n, settings.max_n)
    _check_bound("max_tokens", request.max_tokens, settings.max_tokens_limit)
    _check_bound("max_completion_tokens", request.max_completion_tokens, settings.max_tokens_limit)
    if request.include_reasoning is False:
        # vLLM (0.33, with a reasoning parser) then leaves the answer's token ids and
        # logprobs out: nothing could be learnt from it nor re-sampled like it.
        raise BadRequest(
            "`include_reasoning: false` is not supported: the engine would then leave the "
            "answer's token ids and logprobs out, which onjob records to train on. Leave it "
            "out and drop the reasoning from the answer on your side.",
            param="include_reasoning",
        )
    # null is absent (OpenAI's rule): dropped here, so no engine ever sees a null field.
    # `include_reasoning: true` is vLLM's default, dropped for engines that do not know it.
    return Asked(
        request, {k: v for k, v in body.items() if v is not None and k not in _NOT_FORWARDED}
    )


# Hints (the answer is the same without them), `modalities` (["text"] alone is taken)
# and `include_reasoning` (true alone is taken) are accepted and not forwarded; so is a
# client's `priority` (vLLM's): every user is served alike, ahead of onjob's own work.
_SCHEDULING = frozenset({"priority"})
_NOT_FORWARDED = HINTS | _SCHEDULING | {"modalities", "include_reasoning"}


def parse_completion_request(raw: bytes, settings: ProxySettings) -> tuple[Asked, str]:
    """A legacy text completion's body, checked like chat's (`protocol.completion`), and
    its prompt as text (how the exchange is placed: one user message, a conversation of
    its own)."""
    dropped = HINTS | _SCHEDULING
    body = {k: v for k, v in decode_body(raw).items() if v is not None and k not in dropped}
    request = completion.checked(body)
    prompt = body["prompt"] = completion.prompt_of(request.prompt)
    _check_bound("n", request.n, settings.max_n)
    _check_bound("max_tokens", request.max_tokens, settings.max_tokens_limit)
    body.pop("echo", None)
    body.pop("best_of", None)
    return Asked(request, body), prompt if type(prompt) is str else _encode(prompt).decode()


def _check_bound(key: str, value: int | None, most: int) -> None:
    if value is not None and value > most:
        raise BadRequest(f"`{key}` must be between 1 and {most}; got {value}.", param=key)


@dataclass
class _Choice:
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict] = field(default_factory=dict)
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # A reasoning parser's text, streamed apart from `content` under vLLM's name for it
    # (`reasoning_content` on 0.11, `reasoning` later): its token ids are in `token_ids`,
    # so the stored answer keeps it too. Not part of `message()`, which a next turn's
    # messages are matched against (clients do not send reasoning back).
    reasoning: dict[str, list[str]] = field(default_factory=dict)

    def message(self) -> JsonObject:
        message: dict[str, Any] = {"role": self.role, "content": "".join(self.content) or None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message

    def answer_message(self) -> AnswerMessage:
        """`message()` with the reasoning beside it: the answer as the log keeps it."""
        reasoning = {k: "".join(v) for k, v in self.reasoning.items()}
        return msgspec.convert(self.message() | reasoning, AnswerMessage)

    def add_tool_call_delta(self, delta: dict) -> None:
        fn = delta.get("function") or {}
        self.add_tool_call(
            delta.get("index", 0), delta.get("id"), fn.get("name"), fn.get("arguments")
        )

    def add_tool_call(
        self, index: int, id: str | None, name: str | None, arguments: str | None
    ) -> None:
        """What one streamed delta adds to the tool call at `index`."""
        call = self.tool_calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        call["id"] = id or call["id"]
        call["function"]["name"] += name or ""
        call["function"]["arguments"] += arguments or ""


@dataclass(frozen=True)
class Placing:
    """Where a request goes and whose it is, as its route read it (`Traffic.placing`): the
    API key, the conversation it names (header or metadata), its scenario, the arm it
    pins, and whether that pin may name any checkpoint (the admin key's caller)."""

    router: Router
    api_key_id: str | None
    trajectory_id: str | None = None
    scenario: str | None = None
    pin: str | None = None
    any_checkpoint: bool = False


@dataclass(frozen=True)
class Where:
    """What the proxy knows of a request's place in its conversation; the loader places it."""

    keys: Keys
    conversation: str  # what the arm is drawn from: the same for every turn, on every proxy
    trajectory_id: str | None = None  # a named conversation (scoped) or a Responses chain's
    after_turn: int | None = None  # a Responses chain: the turn it continues


@dataclass
class Exchange:
    id: str
    asked: Asked
    raw_request: bytes
    route: Route
    where: Where
    api_key_id: str | None
    ts: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)
    created: int = 0
    prompt_token_ids: list[int] | None = None
    choices: dict[int, _Choice] = field(default_factory=dict)
    usage: dict | None = None
    status: int = 200
    error: str | None = None
    error_body: dict | None = None
    answered: bytes | None = None  # the whole answer as the client got it (not streamed)
    served_model: str | None = None  # the engine's `model`: who really answered
    logprobs_mode: str | None = None  # the answering engine's logprob definition
    source: str = "production"  # "unstored": logged, but never judged or trained on
    api: str | None = None  # the API the client called, when not chat completions
    api_object: StoredResponse | None = None  # what that API keeps of it (a stored Response)
    id_prefix: str = "chatcmpl-"
    retry_of: str | None = None  # the failed canary attempt this answers in place of
    # What the client asked for, read once (every streamed event consults them).
    _legacy: bool = field(init=False, repr=False)
    _wants_token_ids: bool = field(init=False, repr=False)
    _wants_logprobs: bool = field(init=False, repr=False)
    _wants_usage: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        asked = self.asked.typed
        self._legacy = legacy = self.api == COMPLETIONS
        self._wants_token_ids = bool(asked.return_token_ids)
        # A legacy completion's `logprobs` counts alternatives: 0 asks for the sampled one.
        self._wants_logprobs = asked.logprobs is not None if legacy else bool(asked.logprobs)
        self._wants_usage = bool(asked.stream_options and asked.stream_options.include_usage)

    @property
    def request(self) -> JsonObject:
        """The request as the client sent it (less its hints and nulls)."""
        return self.asked.body

    @classmethod
    async def open(
        cls,
        asked: Asked,
        raw: bytes,
        placing: Placing,
        *,
        api: str | None = None,
        id_prefix: str = "chatcmpl-",
        after_turn: int | None = None,
        messages: list[dict] | None = None,
    ) -> Exchange:
        """Compute the request's stitching keys, then pick its arm: a hash of the
        conversation, which is the name the client gave it, else its opening (the messages
        up to the first reply, with the API key), so every turn of it takes the same arm
        on any proxy process without shared memory. `api` and `id_prefix` name another
        API's exchanges (`resp_...` for the Responses API, whose response id is the
        exchange id); a placing's `trajectory_id` with `after_turn` places a chained
        Responses call after the turn it continues (already the stored id); `messages`
        stand for a request that has none (a legacy completion's prompt as one user
        message)."""
        metadata = asked.body.get("metadata") or {}  # as sent: any key is kept
        api_key_id = placing.api_key_id
        k = keys(
            messages if messages is not None else asked.body["messages"],
            placing.scenario or _str(metadata.get("scenario")),
        )
        named = placing.trajectory_id or _str(metadata.get("trajectory_id"))
        if named and after_turn is None:
            named = scoped(named, api_key_id)
        conversation = named or f"{api_key_id or ''}\0{k.opening}"
        where = Where(k, conversation, named, after_turn)
        route = await placing.router.resolve(
            asked.typed.model,
            conversation,
            placing.pin,
            placing.any_checkpoint,
            api_key_id=api_key_id,
        )
        return cls(
            new_id(id_prefix), asked, raw, route, where, api_key_id, api=api, id_prefix=id_prefix
        )

    def rerouted(self, route: Route) -> Exchange:
        """The same request in the same place, sent to another arm (a new exchange, whose id
        keeps this one's prefix)."""
        return Exchange(
            new_id(self.id_prefix),
            self.asked,
            self.raw_request,
            route,
            self.where,
            self.api_key_id,
            api=self.api,
            id_prefix=self.id_prefix,
            retry_of=self.id,
        )

    def upstream_body(self) -> bytes:
        """The engine's request: the client's, for the route's model, with logprobs and
        token ids always on (the trainer needs them)."""
        return _encode(engine_body(self.request, self.route.model, legacy=self._legacy))

    @property
    def stream(self) -> bool:
        return bool(self.asked.typed.stream)

    def _take(self, choice: dict) -> _Choice:
        """Keep the sampler's token ids and logprobs; leave them only if the client asked."""
        index = choice.get("index", 0)
        acc = self.choices.get(index)
        if acc is None:
            acc = self.choices[index] = _Choice()
        ids = choice.get("token_ids") if self._wants_token_ids else choice.pop("token_ids", None)
        if ids:
            acc.token_ids += ids
        if "prompt_token_ids" in choice:  # a legacy completion's, per choice
            prompt = (
                choice["prompt_token_ids"]
                if self._wants_token_ids
                else choice.pop("prompt_token_ids")
            )
            self.prompt_token_ids = prompt or self.prompt_token_ids
        logprobs = choice.get("logprobs")
        if logprobs:
            if self._legacy:
                acc.logprobs += logprobs.get("token_logprobs") or ()
            else:
                acc.logprobs += [t["logprob"] for t in logprobs.get("content") or ()]
            if not self._wants_logprobs:
                choice["logprobs"] = None
        reason = choice.get("finish_reason")
        if reason:
            acc.finish_reason = reason
        return acc

    def _served(self, served: str | None) -> None:
        """The engine's `model`: who answered, which must be the route's."""
        if served:
            self.served_model = served
        if served is not None and served != self.route.model:
            # A stale or missing adapter must not pass for the checkpoint the exchange
            # records.
            raise MalformedAnswer(
                f"the engine answered as `{served}`, not `{self.route.model}`: refusing to "
                "pass it off as that checkpoint"
            )

    def _head(self, data: dict) -> None:
        route = self.route
        self._served(data.get("model"))
        if "prompt_token_ids" in data:
            ids = (
                data["prompt_token_ids"] if self._wants_token_ids else data.pop("prompt_token_ids")
            )
            if ids is not None:
                self.prompt_token_ids = ids
        created = data.get("created")
        if created:
            self.created = created
        data["id"] = self.id
        data["model"] = route.alias

    def answer(self, raw: bytes) -> bytes:
        """A whole (non-streamed) answer, shaped for the client."""
        try:
            data = _decode(raw)
            known(data, TextCompletion if self._legacy else ChatCompletion)
            for choice in data["choices"]:
                acc = self._take(choice)
                message = (
                    {"content": choice["text"]} if self._legacy else choice.get("message") or {}
                )
                acc.role = message.get("role") or acc.role
                acc.content = [message["content"]] if message.get("content") else []
                acc.tool_calls = dict(enumerate(message.get("tool_calls") or ()))
        except (*_UNREADABLE, KeyError, TypeError, AttributeError) as exc:
            raise MalformedAnswer(f"the engine's answer is not a chat completion: {exc}") from exc
        self._head(data)
        self.usage = data.get("usage")
        self.answered = _encode(data)
        return self.answered

    def chunk(self, payload: bytes) -> bytes | None:
        """One streamed event shaped for the client; None when the client did not ask for it
        (the usage chunk the proxy requested for itself). A chat event of the shape the
        engines send is read typed (`_typed_chunk`); any other (an error event, a field
        `ChatCompletionChunk` does not declare, a legacy completion's) as a dict
        (`absorb`)."""
        if not self._legacy:
            try:
                return self._typed_chunk(_decode_chunk(payload))
            except msgspec.ValidationError:
                pass  # not the declared shape: the general way, which says what is wrong
            except _UNREADABLE as exc:
                raise MalformedAnswer(f"the engine sent a malformed stream event: {exc}") from exc
        data = self.absorb(payload)
        if "error" in data:
            return payload
        if not self._wants_usage:
            data.pop("usage", None)
            if not data["choices"]:
                return None
        return _encode(data)

    def _typed_chunk(self, event: ChatCompletionChunk) -> bytes | None:
        """`chunk` of an event decoded as `ChatCompletionChunk`: what `absorb` takes of a dict, read
        as attributes, and the same fields changed for the client (an absent field stays
        absent: UNSET is not encoded)."""
        self._served(None if event.model is UNSET else event.model)
        wants_ids = self._wants_token_ids
        ids = event.prompt_token_ids
        if ids is not UNSET:
            if ids is not None:
                self.prompt_token_ids = ids
            if not wants_ids:
                event.prompt_token_ids = UNSET
        if event.created:
            self.created = event.created
        event.id, event.model = self.id, self.route.alias
        for choice in event.choices:
            index = choice.index or 0
            acc = self.choices.get(index)
            if acc is None:
                acc = self.choices[index] = _Choice()
            if choice.token_ids:
                acc.token_ids += choice.token_ids
            if not wants_ids:
                choice.token_ids = UNSET
            logprobs = choice.logprobs
            if logprobs:
                acc.logprobs += [t.logprob for t in logprobs.content or ()]
                if not self._wants_logprobs:
                    choice.logprobs = None
            if choice.finish_reason:
                acc.finish_reason = choice.finish_reason
            delta = choice.delta
            if not delta:
                continue
            if delta.role:
                acc.role = delta.role
            if delta.content:
                acc.content.append(delta.content)
            if delta.reasoning_content:
                acc.reasoning.setdefault("reasoning_content", []).append(delta.reasoning_content)
            if delta.reasoning:
                acc.reasoning.setdefault("reasoning", []).append(delta.reasoning)
            for call in delta.tool_calls or ():
                fn = call.function or None
                acc.add_tool_call(
                    call.index or 0, call.id or None, fn and fn.name, fn and fn.arguments
                )
        if event.usage:
            self.usage = msgspec.to_builtins(event.usage)
        if not self._wants_usage:
            event.usage = UNSET
            if not event.choices:
                return None
        return _encode(event)

    def absorb(self, payload: bytes) -> JsonObject:
        """One streamed event taken in (what it adds to each choice, its usage) and returned
        decoded, the sampler's fields taken out unless asked for; an error event is the
        exchange's error."""
        try:
            data = _decode(payload)
            if "error" in data:
                error = data["error"] if isinstance(data["error"], dict) else {}
                code = error.get("code")
                self.fail(code if isinstance(code, int) and code >= 400 else 500, str(error))
                self.error_body = data
                return data
            known(data, TextCompletion if self._legacy else ChatCompletionChunk)
            self._head(data)
            for choice in data["choices"]:
                acc = self._take(choice)
                if self._legacy:
                    text = choice.get("text")
                    if text:
                        acc.content.append(text)
                    continue
                delta = choice.get("delta")
                if not delta:
                    continue
                role = delta.get("role")
                if role:
                    acc.role = role
                content = delta.get("content")
                if content:
                    acc.content.append(content)
                for key in _REASONING:
                    if isinstance(text := delta.get(key), str) and text:
                        acc.reasoning.setdefault(key, []).append(text)
                for call in delta.get("tool_calls") or ():
                    acc.add_tool_call_delta(call)
        except (*_UNREADABLE, KeyError, TypeError, AttributeError) as exc:
            raise MalformedAnswer(f"the engine sent a malformed stream event: {exc}") from exc
        usage = data.get("usage")
        if usage:
            self.usage = usage
        return data

    def fail(self, status: int, error: str) -> None:
        self.status, self.error = status, error

    def replies(self) -> list[dict]:
        return [self.choices[i].message() for i in sorted(self.choices)]

    def response(self) -> ChatCompletion | dict:
        """The answer as one chat completion, whether it was streamed or not (the engine's
        error event as it came, when it failed before any choice)."""
        if self.error_body is not None and not self.choices:
            return self.error_body
        return ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.route.alias,
            choices=[
                Choice(index=i, message=c.answer_message(), finish_reason=c.finish_reason)
                for i, c in sorted(self.choices.items())
            ],
            usage=self.usage,
        )

    def record(self, lineage: Lineage | None = None) -> ExchangeRecord:
        """The spool line. With `lineage` (linear storage, `collector/linear.py`) a turn that
        continues an answered exchange this process remembers stores only its new messages
        and prompt token ids; an answered one becomes what its next turn stores against."""
        w = self.where
        answered = self.status < 400
        ordered = [self.choices[i] for i in sorted(self.choices)]
        token_ids = [c.token_ids for c in ordered] or None
        sampled = [c.logprobs for c in ordered] or None
        hashes = continuations(w.keys.prefix_hash, self.replies()) if answered else None
        request, prompt_ids, delta = None, self.prompt_token_ids, WHOLE
        if lineage is not None:
            request, prompt_ids, delta = stored(
                lineage,
                keys=w.keys,
                api_key_id=self.api_key_id,
                continuations=hashes or [],
                exchange_id=self.id,
                request=self.request,
                prompt_token_ids=prompt_ids,
                completion_token_ids=ordered[0].token_ids if ordered else None,
                answered=answered,
            )
        return ExchangeRecord(
            id=self.id,
            ts=self.ts,
            trajectory_id=w.trajectory_id,
            after_turn=w.after_turn,
            retry_of=self.retry_of,
            scenario_key=w.keys.scenario_key,
            scenario_keyed=w.keys.scenario_keyed,
            stitch=w.keys.candidates or None,
            prefix_hash=w.keys.prefix_hash or None,
            model_alias=self.route.alias,
            api_key_id=self.api_key_id,
            checkpoint=self.route.checkpoint,
            arm=self.route.arm,
            stream=self.stream,
            request=msgspec.Raw(request or self.raw_request),
            response=msgspec.Raw(self.answered) if self.answered else to_json(self.response()),
            prompt_token_ids=prompt_ids,
            parent_id=delta.parent_id,
            messages_kept=delta.messages_kept,
            prompt_kept=delta.prompt_kept,
            request_kept=delta.request_kept,
            completion_token_ids=token_ids,
            completion_logprobs=sampled,
            usage=to_json(self.usage),
            latency_ms=(time.perf_counter() - self.started) * 1000,
            status=self.status,
            error=self.error,
            metadata=to_json(self.request.get("metadata")),
            continuation_hashes=hashes,
            served_model=self.served_model,
            logprobs_mode=self.logprobs_mode,
            untrainable=logprobs.untrainable(self.logprobs_mode, token_ids, sampled, self.usage)
            if answered
            else None,
            source=self.source,
            api=self.api,
            api_object=to_json(self.api_object),
        )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
