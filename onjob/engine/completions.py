"""`POST /v1/completions`: legacy text completions, as vLLM answers them.

The prompt is tokenized as it is (no chat template), and the answer has vLLM's shape:
`choices[].text`, logprobs as `tokens` / `token_logprobs` / `top_logprobs` /
`text_offset` (with `logprobs: 0`, the sampled token's alone), and with
`return_token_ids` the choice's `token_ids` and `prompt_token_ids`, which the proxy
keeps for the trainer as it does for chat. `null` is absent; what this engine cannot
honour (several prompts, `echo`, `suffix`, penalties, `logit_bias`) is a 400 naming it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.response import Stream
from msgspec import UNSET

from ..openai_errors import Error
from ..protocol import CompletionRequest, completion
from ..protocol.checks import decoded
from ..protocol.completion import CompletionChoice, LegacyLogprobs, TextCompletion, prompt_of
from .answers import sse, usage
from .batching import TokenEvent
from .errors import BadRequest, EngineError, NotFound
from .protocol import MOST_CHOICES
from .sampling import Sampling


def _refuse(req: CompletionRequest) -> None:
    """What this engine cannot honour, past what the protocol refuses (`echo`, `suffix`,
    `best_of`)."""
    if req.n is not None and req.n > MOST_CHOICES:
        raise BadRequest(f"`n` must be at most {MOST_CHOICES}.", param="n")
    for key in ("presence_penalty", "frequency_penalty"):
        if getattr(req, key) not in (None, 0, 0.0):
            raise BadRequest(f"`{key}` is not supported by this engine.", param=key)
    if req.logit_bias:
        raise BadRequest("`logit_bias` is not supported by this engine.", param="logit_bias")


def prompt_ids(loaded, prompt: Any) -> list[int]:
    """One prompt's token ids: a string tokenized as it is, or the ids given."""
    prompt = prompt_of(prompt)
    return loaded.tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else prompt


def logprobs_of(token_text, events: list[TokenEvent], offset: int) -> LegacyLogprobs:
    """The legacy logprobs of `events`, their text starting at `offset`."""
    tokens, top, offsets = [], [], []
    for e in events:
        text = token_text(e.token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(e.text)
        top.append({token_text(t): lp for t, lp in e.top} or None)
    return LegacyLogprobs(
        tokens=tokens,
        token_logprobs=[e.logprob for e in events],
        top_logprobs=top,
        text_offset=offsets,
    )


@post("/v1/completions", status_code=200)
async def completions(engine: Any, request: Request) -> Response | Stream:
    """The route, over the same batcher as chat (`engine`: the server's `Engine`)."""
    loaded, batcher, resolver = engine.loaded, engine.batcher, engine.resolver
    req = completion.checked(decoded(await request.body(), dict))
    _refuse(req)
    try:
        adapter = loaded.resolve(req.model)
    except NotFound:
        if resolver is None or not await resolver.load(batcher, req.model):
            raise
        adapter = loaded.resolve(req.model)
    ids = prompt_ids(loaded, req.prompt)
    room = loaded.max_model_len - len(ids)
    if room <= 0 or (req.max_tokens is not None and req.max_tokens > room):
        raise BadRequest(
            f"This model's maximum context length is {loaded.max_model_len} tokens; the "
            f"prompt has {len(ids)} and {req.max_tokens or 0} more were asked for.",
            param="prompt",
        )
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(s for s in req.stop or () if s)
    sampling = Sampling(
        max_tokens=req.max_tokens or min(engine.default_max_tokens, room),
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        seed=req.seed,
        stop=stop,
        top_logprobs=req.logprobs or 0,
        min_tokens=req.min_tokens or 0,
        ignore_eos=bool(req.ignore_eos),
    )
    n = req.n or 1
    gen = batcher.submit(ids, adapter, n, sampling)
    head = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": req.model,
    }
    if req.stream:
        return Stream(
            sse(_streamed(engine.token_text, req, head, ids, gen, n)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    try:
        answer = await _whole(engine.token_text, req, head, ids, gen, n)
        return Response(answer, media_type="application/json")
    finally:
        gen.cancel()


async def _whole(
    token_text, req: CompletionRequest, head: dict, ids: list[int], gen, n: int
) -> bytes:
    events: list[list[TokenEvent]] = [[] for _ in range(n)]
    finish: list[str | None] = [None] * n
    async for ev in gen.events():
        events[ev.index].append(ev)
        finish[ev.index] = ev.finish_reason or finish[ev.index]
    asked_ids = bool(req.return_token_ids)
    choices = [
        CompletionChoice(
            index=i,
            text="".join(e.text for e in events[i]),
            logprobs=None if req.logprobs is None else logprobs_of(token_text, events[i], 0),
            finish_reason=finish[i],
            stop_reason=None,
            token_ids=[e.token_id for e in events[i]] if asked_ids else UNSET,
            prompt_token_ids=ids if asked_ids else UNSET,
        )
        for i in range(n)
    ]
    completion = sum(len(e) for e in events)
    return msgspec.json.encode(
        TextCompletion(**head, choices=choices, usage=usage(len(ids), completion))
    )


async def _streamed(
    token_text, req: CompletionRequest, head: dict, ids: list[int], gen, n: int
) -> AsyncIterator[TextCompletion | Error]:
    offsets = [0] * n
    first = [True] * n
    completion = 0
    asked_ids = bool(req.return_token_ids)
    try:
        async for ev in gen.events():
            completion += 1
            i = ev.index
            logprobs = None if req.logprobs is None else logprobs_of(token_text, [ev], offsets[i])
            offsets[i] += len(ev.text)
            choice = CompletionChoice(
                index=i,
                text=ev.text,
                logprobs=logprobs,
                finish_reason=ev.finish_reason,
                stop_reason=None,
                token_ids=[ev.token_id] if asked_ids else UNSET,
                prompt_token_ids=ids if asked_ids and first[i] else UNSET,
            )
            first[i] = False
            yield TextCompletion(**head, choices=[choice])
        if req.stream_options and req.stream_options.include_usage:
            yield TextCompletion(**head, choices=[], usage=usage(len(ids), completion))
    except EngineError as exc:
        yield exc.body()
    finally:
        gen.cancel()
