"""The local engine's HTTP server: vLLM's OpenAI-compatible contract on top of `Batcher`.

Routes: `POST /v1/chat/completions`, `POST /v1/completions` (`completions.py`),
`GET /v1/models`, `GET /v1/models/{id}`, `POST /v1/load_lora_adapter`,
`POST /v1/unload_lora_adapter` and onjob's `POST /onjob/threads` (the forwards' CPU
threads, which `onjob serve` lowers while a training run shares the host) (loopback
peers only, with the adapter token when one is set: `control.py`), `GET /health`, and
`GET /metrics` (vLLM's two queue gauges, requests running and waiting).
Responses carry the same fields as vLLM's (`logprobs`, `prompt_token_ids` and per-choice
`token_ids` with `return_token_ids`), and errors use OpenAI's shape. A request's grammar
(`response_format`, a forced `tool_choice`: `grammar.py`) is compiled before it is
queued, off the event loop, so a schema that cannot be compiled is a 400 and never
reaches the batch.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import lru_cache

import msgspec
from litestar import Litestar, Request, Response, Router, get, post
from litestar.di import Provide
from litestar.params import FromPath
from litestar.response import Stream
from msgspec import UNSET

from ..logprobs import TRAINED
from ..openai_errors import Error
from ..openai_handlers import HANDLERS
from ..protocol import ChatCompletionRequest
from ..protocol.chat import (
    AnswerMessage,
    AnswerToolCall,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    TokenLogprob,
    TopLogprob,
)
from ..protocol.chat import refused as chat_refused
from ..protocol.checks import decoded
from . import answers, chat, completions, control, grammar
from .answers import sse, usage
from .batching import Batcher, TokenEvent
from .errors import BadRequest, EngineError, NotFound
from .protocol import (
    LoadAdapter,
    ModelCard,
    ModelCards,
    Threads,
    ThreadsSet,
    UnloadAdapter,
    refused,
)
from .resolver import Resolver
from .sampling import Sampling


@dataclass
class _Prepared:
    request: ChatCompletionRequest
    adapter: str | None
    prompt_ids: list[int]
    sampling: Sampling
    n: int
    tools: grammar.Tools
    constraint: grammar.Constraint | None
    priority: int

    @property
    def parse_tools(self) -> bool:
        return self.tools.mode != "none"

    @property
    def call_limit(self) -> int | None:
        return None if self.tools.parallel else 1


class Engine:
    """What every route of the engine shares: the batcher and its model, the grammars
    compiled for it, and how a request becomes a batch's work and an answer."""

    def __init__(
        self, batcher: Batcher, default_max_tokens: int, resolver: Resolver | None
    ) -> None:
        self.batcher = batcher
        self.loaded = batcher.loaded
        self.default_max_tokens = default_max_tokens
        self.resolver = resolver
        self.created = int(time.time())
        self.grammars = grammar.Grammars(
            self.loaded.tokenizer, self.loaded.vocab_size, self.loaded.eos_ids
        )
        self.token_text = lru_cache(maxsize=65536)(self._token_text)

    def _token_text(self, token_id: int) -> str:
        return self.loaded.tokenizer.decode([token_id], clean_up_tokenization_spaces=False)

    def logprob_entry(
        self, token_id: int, logprob: float, top: list[tuple[int, float]]
    ) -> TokenLogprob:
        text = self.token_text(token_id)
        return TokenLogprob(
            token=text,
            logprob=logprob,
            bytes=list(text.encode()),
            top_logprobs=[
                TopLogprob(token=(t := self.token_text(i)), logprob=lp, bytes=list(t.encode()))
                for i, lp in top
            ],
        )

    def prepare(self, body: bytes) -> _Prepared:
        loaded = self.loaded
        req = decoded(body, ChatCompletionRequest)
        if error := chat_refused(req) or refused(req):
            raise error
        adapter = loaded.resolve(req.model)
        tools = grammar.Tools.of(req)
        # Every tool is in the prompt whatever the choice (but "none"), as vLLM does; a
        # named or allowed choice narrows the grammar, not what the model is shown.
        shown = req.tools if tools.mode != "none" else None
        prompt = chat.render(loaded.tokenizer, req.messages, shown, req.reasoning_effort)
        prompt_ids = loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        room = loaded.max_model_len - len(prompt_ids)
        asked = req.max_completion_tokens or req.max_tokens
        if room <= 0 or (asked is not None and asked > room):
            raise BadRequest(
                f"This model's maximum context length is {loaded.max_model_len} tokens. "
                f"However, you requested {len(prompt_ids) + (asked or 0)} tokens "
                f"({len(prompt_ids)} in the messages, {asked or 0} in the completion). "
                "Please reduce the length of the messages or completion.",
                param="messages",
            )
        if req.top_logprobs and not req.logprobs:
            raise BadRequest("top_logprobs requires logprobs=true.", param="top_logprobs")
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(s for s in req.stop or () if s)
        sampling = Sampling(
            max_tokens=asked or min(self.default_max_tokens, room),
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=stop,
            top_logprobs=req.top_logprobs or 0,
            min_tokens=req.min_tokens or 0,
            ignore_eos=bool(req.ignore_eos),
            logit_bias=_logit_bias(req.logit_bias, loaded.vocab_size),
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            # vLLM keeps an answer's first call only (`maybe_filter_parallel_tool_calls`,
            # `vllm/entrypoints/serve/utils/tool_calls_utils.py`) but decodes on; ending
            # the answer there keeps its token ids (what a trainer reads) the call's own.
            stop_after_call=tools.mode != "none" and not tools.parallel,
        )
        constraint = grammar.constraint(req, tools)
        return _Prepared(
            req, adapter, prompt_ids, sampling, req.n or 1, tools, constraint, req.priority or 0
        )

    async def prepared(self, body: bytes) -> _Prepared:
        try:
            return self.prepare(body)
        except NotFound as exc:  # an adapter the resolver may find (the rare path)
            if self.resolver is None or exc.param != "model":
                raise
            model = decoded(body, ChatCompletionRequest).model
            if not await self.resolver.load(self.batcher, model):
                raise
            return self.prepare(body)

    async def complete(self, p: _Prepared, gen) -> bytes:
        n = p.n
        tokens: list[list[TokenEvent]] = [[] for _ in range(n)]
        texts = [""] * n
        finish = [None] * n
        async for ev in gen.events():
            tokens[ev.index].append(ev)
            texts[ev.index] += ev.text
            finish[ev.index] = ev.finish_reason or finish[ev.index]
        choices = []
        for i in range(n):
            message = AnswerMessage(role="assistant", content=texts[i])
            reason = finish[i]
            if p.parse_tools:
                cut = reason == "length" and p.tools.mode in ("required", "named")
                content, calls = chat.parse_tool_calls(texts[i], p.call_limit, cut=cut)
                if calls:
                    message = AnswerMessage(
                        role="assistant", content=content, tool_calls=_calls(calls)
                    )
                    reason = "length" if cut else "tool_calls"
            choices.append(
                Choice(
                    index=i,
                    message=message,
                    logprobs=self._logprobs(p, tokens[i]),
                    finish_reason=reason,
                    token_ids=[e.token_id for e in tokens[i]]
                    if p.request.return_token_ids
                    else UNSET,
                )
            )
        completion_tokens = sum(len(t) for t in tokens)
        return msgspec.json.encode(
            ChatCompletion(
                id=f"chatcmpl-{uuid.uuid4().hex}",
                created=int(time.time()),
                model=p.request.model,
                choices=choices,
                usage=usage(len(p.prompt_ids), completion_tokens, gen.cached_tokens),
                prompt_token_ids=p.prompt_ids if p.request.return_token_ids else UNSET,
            )
        )

    def _logprobs(self, p: _Prepared, events: list[TokenEvent]) -> ChoiceLogprobs | None:
        if not p.request.logprobs:
            return None
        entries = [self.logprob_entry(e.token_id, e.logprob, e.top) for e in events]
        return ChoiceLogprobs(content=entries)

    async def stream_chunks(self, p: _Prepared, gen) -> AsyncIterator[ChatCompletionChunk | Error]:
        req = p.request
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": req.model,
        }

        def chunk(choice: ChunkChoice) -> ChatCompletionChunk:
            return ChatCompletionChunk(**head, choices=[choice])

        # With tools, the text goes through a tool-call reader: content as it comes, each
        # call as a first delta with its name, then its arguments' fragments.
        readers = [chat.ToolCallStream(p.call_limit) for _ in range(p.n)]
        completion_tokens = 0
        each_token = bool(req.logprobs or req.return_token_ids)  # every token then has an event
        try:
            for i in range(p.n):
                first = chunk(
                    ChunkChoice(
                        index=i,
                        delta=AnswerMessage(role="assistant", content=""),
                        logprobs=None,
                        finish_reason=None,
                    )
                )
                if i == 0 and req.return_token_ids:
                    first.prompt_token_ids = p.prompt_ids
                yield first
            async for ev in gen.events():
                completion_tokens += 1
                delta = AnswerMessage(content=ev.text)
                reason = ev.finish_reason
                if p.parse_tools:
                    reader = readers[ev.index]
                    content, calls = reader.feed(ev.text, final=reason is not None)
                    delta = AnswerMessage(
                        content=content or UNSET, tool_calls=_calls(calls) if calls else UNSET
                    )
                    if reason and reader.calls:
                        reason = "tool_calls"
                if delta.content or delta.tool_calls or each_token or reason:
                    yield chunk(
                        ChunkChoice(
                            index=ev.index,
                            delta=delta,
                            logprobs=self._logprobs(p, [ev]),
                            finish_reason=reason,
                            token_ids=[ev.token_id] if req.return_token_ids else UNSET,
                        )
                    )
            if req.stream_options and req.stream_options.include_usage:
                done = usage(len(p.prompt_ids), completion_tokens, gen.cached_tokens)
                yield ChatCompletionChunk(**head, choices=[], usage=done)
        except EngineError as exc:
            yield exc.body()
        finally:
            gen.cancel()

    def listing(self) -> list[ModelCard]:
        loaded = self.loaded
        base = ModelCard(
            id=loaded.name,
            created=self.created,
            root=loaded.path,
            parent=None,
            max_model_len=loaded.max_model_len,
            dtype=str(loaded.model.dtype).removeprefix("torch."),
            logprobs=TRAINED,
            threads=self.batcher.threads_now,
        )
        adapters = [
            msgspec.structs.replace(base, id=a.name, root=a.path, parent=loaded.name)
            for a in list(loaded.adapters.values())
        ]
        return [base, *adapters]


def create_app(
    batcher: Batcher,
    *,
    default_max_tokens: int = 512,
    adapter_token: str | None = None,
    resolver: Resolver | None = None,
) -> Litestar:
    engine = Engine(batcher, default_max_tokens, resolver)
    # The adapter routes answer loopback peers, with the adapter token when one is set.
    control_routes = Router(
        "/",
        guards=[control.adapter_guard(adapter_token)],
        route_handlers=[load_lora_adapter, unload_lora_adapter, threads],
    )
    return Litestar(
        route_handlers=[
            chat_completions,
            completions.completions,
            models,
            model,
            control_routes,
            health,
            metrics,
        ],
        dependencies={"engine": Provide(lambda: engine, use_cache=True, sync_to_thread=False)},
        exception_handlers=HANDLERS,
        request_max_body_size=16 * 1024 * 1024,
        openapi_config=None,
    )


@post("/v1/chat/completions", status_code=200)
async def chat_completions(engine: Engine, request: Request) -> Response | Stream:
    p = await engine.prepared(await request.body())
    compiled = None
    if p.constraint is not None:
        compiled = await asyncio.to_thread(engine.grammars.compile, p.constraint)
    gen = engine.batcher.submit(p.prompt_ids, p.adapter, p.n, p.sampling, compiled, p.priority)
    if p.request.stream:
        return Stream(
            sse(engine.stream_chunks(p, gen)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    try:
        return Response(await engine.complete(p, gen), media_type="application/json")
    finally:
        gen.cancel()


@get("/v1/models")
async def models(engine: Engine) -> ModelCards:
    return ModelCards(data=engine.listing())


@get("/v1/models/{model:path}")
async def model(engine: Engine, model: FromPath[str]) -> ModelCard:
    name = model.lstrip("/")
    for entry in engine.listing():
        if entry.id == name:
            return entry
    raise NotFound(f"The model `{name}` does not exist.", param="model")


@post("/v1/load_lora_adapter", status_code=200)
async def load_lora_adapter(engine: Engine, request: Request) -> Response:
    body = decoded(await request.body(), LoadAdapter)
    batcher, loaded = engine.batcher, engine.loaded
    await batcher.call(lambda: loaded.load_adapter(body.lora_name, body.lora_path, batcher.busy()))
    return Response(
        f"Success: LoRA adapter '{body.lora_name}' added successfully.", media_type="text/plain"
    )


@post("/v1/unload_lora_adapter", status_code=200)
async def unload_lora_adapter(engine: Engine, request: Request) -> Response:
    body = decoded(await request.body(), UnloadAdapter)
    batcher, loaded = engine.batcher, engine.loaded

    def unload() -> None:
        if body.lora_name in loaded.adapters:
            batcher.fail_adapter(body.lora_name)
        loaded.unload_adapter(body.lora_name)

    await batcher.call(unload)
    return Response(
        f"Success: LoRA adapter '{body.lora_name}' removed successfully.",
        media_type="text/plain",
    )


@post("/onjob/threads", status_code=200)
async def threads(engine: Engine, request: Request) -> ThreadsSet:
    body = decoded(await request.body(), Threads)
    before, after = await engine.batcher.threads(body.threads)
    return ThreadsSet(threads=after, was=before, started_with=engine.batcher.started_threads)


@get("/health")
async def health() -> Response:
    return Response(b"", status_code=200)


@get("/metrics")
async def metrics(engine: Engine) -> Response:
    """vLLM's queue gauges under vLLM's names, so one reader serves both engines (the
    judge's admission, `judge/admission.py`; a Prometheus scrape)."""
    running, waiting = engine.batcher.load()
    return Response(
        answers.queue_metrics(engine.loaded.name, running, waiting),
        media_type="text/plain; version=0.0.4; charset=utf-8",
    )


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    out = []
    for key, value in (bias or {}).items():
        if not key.isdigit() or int(key) >= vocab_size:
            raise BadRequest(
                f"logit_bias keys are token ids below {vocab_size}; got {key!r}.",
                param="logit_bias",
            )
        out.append((int(key), value))
    return tuple(out)


def _calls(calls: list[dict]) -> list[AnswerToolCall]:
    """The tool-call reader's calls (`chat.parse_tool_calls`, `chat.ToolCallStream`) as the
    answer declares them."""
    return msgspec.convert(calls, list[AnswerToolCall])
