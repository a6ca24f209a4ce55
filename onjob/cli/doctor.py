"""`onjob doctor`: asks a running engine for what onjob needs of it and says what is missing.

Each check is a real request, the one onjob itself will send, so the answer holds for the
engine as it runs (its flags, its version, its environment), not for how it was meant to
be started:

- runtime LoRA loading: an unload of a name no engine has must be answered "cannot be
  found", which only the route that exists gives (`deploy/act/adapters.py` reads the answer);
  with `--adapter DIR`, a real adapter is also loaded, asked and unloaded;
- the sampler's logprobs and token ids on a chat completion (the trainer needs both), and
  their definition where the engine states it (`onjob.logprobs`: vLLM's model list does
  not, so for vLLM it is what `--logprobs-mode` was given);
- a request with `tools` answered, not refused with 400 (agents send tools; vLLM needs a
  tool-call parser for them);
- a streamed answer to a request with a strict tool that keeps every token: as many token
  ids and logprobs across its chunks as `usage.completion_tokens` (vLLM 0.11-0.12 drop the
  chunks a tool or reasoning parser holds back, ids and logprobs with them);
- a reasoning model's streamed answer: its reasoning text (`reasoning`, or 0.11's
  `reasoning_content`) arrives apart, and every token of it with its id and logprob (the
  proxy stores both); or a line saying the model wrote none;
- a long context: a prompt over the engine's `max_model_len` is refused with a clear 400,
  not left hanging, and one of three quarters of it is answered.

Exit status 0 when everything is there, 1 when anything is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..deploy.act import adapters
from ..logprobs import TRAINED
from .common import CONFIG, load_settings
from .exits import Exit, Failed

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
_ASK = [{"role": "user", "content": "Say hello."}]


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


async def diagnose(engine: httpx.AsyncClient, adapter: Path | None = None) -> list[Check]:
    """Every check against `engine` (its base_url ends in /v1), in order."""
    try:
        resp = await engine.get("/models")
        resp.raise_for_status()
        models = resp.json()["data"]
        card = next((m for m in models if not m.get("parent")), models[0])
        base = card["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        return [Check("reachable", False, f"GET {engine.base_url}/models failed: {exc!r}")]
    checks = [
        Check("reachable", True, f"serves {base}"),
        await _runtime_lora(engine),
        await _token_data(engine, base),
        _definition(card),
        await _tools(engine, base),
        await _streamed(engine, base),
        await _reasoning(engine, base),
        await _long_context(engine, base, card.get("max_model_len")),
    ]
    if adapter is not None:
        checks.append(await _adapter(engine, adapter))
    return checks


async def _runtime_lora(engine: httpx.AsyncClient) -> Check:
    name = "runtime LoRA loading"
    try:
        await adapters.unload(engine, f"onjob-doctor-{uuid.uuid4().hex[:8]}")
    except adapters.EngineControlError as exc:
        return Check(name, False, str(exc))
    return Check(name, True, "/v1/load_lora_adapter and /v1/unload_lora_adapter answer")


@dataclass(frozen=True)
class _Answer:
    status: int  # 0: no answer (refused, timed out)
    data: dict | None
    text: str

    def refusal(self) -> str:
        error = (self.data or {}).get("error")
        message = error.get("message") if isinstance(error, dict) else None
        return f"{self.status or 'no answer'}: {(message or self.text)[:300]}"


async def _chat(engine: httpx.AsyncClient, body: dict) -> _Answer:
    try:
        resp = await engine.post("/chat/completions", json={"max_tokens": 2, **body})
    except httpx.HTTPError as exc:
        return _Answer(0, None, repr(exc))
    try:
        data = resp.json()
    except ValueError:
        data = None
    return _Answer(resp.status_code, data if isinstance(data, dict) else None, resp.text)


def _definition(card: dict) -> Check:
    name = "logprob definition"
    stated = card.get("logprobs")
    if stated is None:
        return Check(
            name,
            True,
            f"not stated by the engine (vLLM's model list does not): it must run with "
            f"--logprobs-mode {TRAINED}, as `onjob engine --backend vllm` starts it",
        )
    if stated != TRAINED:
        return Check(
            name,
            False,
            f"{stated}: the trainer's importance ratio needs {TRAINED} (it refuses groups "
            "sampled otherwise)",
        )
    return Check(name, True, TRAINED)


async def _token_data(engine: httpx.AsyncClient, base: str) -> Check:
    name = "logprobs and token ids"
    body = {"model": base, "messages": _ASK, "logprobs": True, "return_token_ids": True}
    answer = await _chat(engine, body)
    data = answer.data or {}
    if answer.status != 200 or not data.get("choices"):
        return Check(name, False, f"a chat completion asking for them failed: {answer.refusal()}")
    choice = data["choices"][0]
    missing = []
    content = (choice.get("logprobs") or {}).get("content")
    if not (isinstance(content, list) and content and "logprob" in content[0]):
        missing.append("no sampled logprobs (`choices[].logprobs.content`) for `logprobs: true`")
    if not (isinstance(choice.get("token_ids"), list) and choice["token_ids"]):
        missing.append("no completion token ids (`choices[].token_ids`)")
    if not (isinstance(data.get("prompt_token_ids"), list) and data["prompt_token_ids"]):
        missing.append("no prompt token ids (`prompt_token_ids`)")
    if missing:
        return Check(
            name,
            False,
            "; ".join(missing) + ": the trainer needs the sampler's own tokens and logprobs "
            "(vLLM returns token ids for `return_token_ids: true` since it added that field; "
            "upgrade an older one)",
        )
    return Check(name, True, f"{len(content)} sampled tokens with logprobs and ids")


async def _tools(engine: httpx.AsyncClient, base: str) -> Check:
    name = "tool calls"
    answer = await _chat(engine, {"model": base, "messages": _ASK, "tools": _TOOLS})
    if answer.status == 200:
        return Check(name, True, "a request with `tools` is answered")
    return Check(
        name,
        False,
        f"a request with `tools` was refused ({answer.refusal()}): start vLLM with "
        "--enable-auto-tool-choice --tool-call-parser NAME (`onjob engine --backend vllm` "
        "chooses NAME from the model's family, or takes --tool-call-parser)",
    )


@dataclass(frozen=True)
class _Stream:
    """What a streamed answer carried across its events."""

    ids: int
    logprobs: int
    completion_tokens: int | None
    reasoning: str
    content: str


def _read_stream(text: str) -> _Stream | str:
    """The stream's counts and texts, or what is wrong with it."""
    ids = logprobs = 0
    usage, reasoning, content = None, [], []
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            return f"an event that is not JSON: {line[:200]}"
        usage = event.get("usage") or usage
        for choice in event.get("choices") or ():
            ids += len(choice.get("token_ids") or ())
            logprobs += len((choice.get("logprobs") or {}).get("content") or ())
            delta = choice.get("delta") or {}
            reasoning.append(delta.get("reasoning") or delta.get("reasoning_content") or "")
            content.append(delta.get("content") or "")
    counted = (usage or {}).get("completion_tokens")
    if not isinstance(counted, int):
        return "no `usage` with `stream_options.include_usage`"
    return _Stream(ids, logprobs, counted, "".join(reasoning), "".join(content))


async def _streamed(engine: httpx.AsyncClient, base: str) -> Check:
    name = "streamed tokens"
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in _TOOLS]
    body = {
        "model": base,
        "messages": [{"role": "user", "content": "What time is it in Paris?"}],
        "tools": strict,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "return_token_ids": True,
        "max_tokens": 32,
    }
    answer = await _chat(engine, body)
    if answer.status != 200:
        return Check(
            name, False, f"a streamed request with a strict tool failed: {answer.refusal()}"
        )
    read = _read_stream(answer.text)
    if isinstance(read, str):
        return Check(name, False, read)
    ids, logprobs, counted = read.ids, read.logprobs, read.completion_tokens
    if ids == logprobs == counted:
        return Check(name, True, f"{counted} tokens streamed, each with its id and logprob")
    return Check(
        name,
        False,
        f"the stream carried {ids} token ids and {logprobs} logprobs for {counted} tokens: "
        "vLLM before 0.13 drops the chunks its tool or reasoning parser holds back, with "
        "their token ids and logprobs (onjob marks such answers untrainable); upgrade vLLM",
    )


async def _reasoning(engine: httpx.AsyncClient, base: str) -> Check:
    name = "reasoning"
    body = {
        "model": base,
        "messages": [{"role": "user", "content": "What is 17 times 23? Think it through."}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "return_token_ids": True,
        "max_tokens": 64,
    }
    answer = await _chat(engine, body)
    if answer.status != 200:
        return Check(name, False, f"a streamed question failed: {answer.refusal()}")
    read = _read_stream(answer.text)
    if isinstance(read, str):
        return Check(name, False, read)
    if not read.ids == read.logprobs == read.completion_tokens:
        return Check(
            name,
            False,
            f"the answer carried {read.ids} token ids and {read.logprobs} logprobs for "
            f"{read.completion_tokens} tokens: its reasoning parser held tokens back with "
            "their ids and logprobs (vLLM before 0.13); upgrade vLLM",
        )
    if read.reasoning:
        return Check(
            name,
            True,
            f"a reasoning model: {len(read.reasoning)} characters of reasoning apart from the "
            f"content, in {read.completion_tokens} tokens each with its id and logprob",
        )
    if "<think>" in read.content:
        return Check(
            name,
            True,
            "the model reasons in its content (`<think>`), which onjob records as content; "
            "start vLLM with --reasoning-parser NAME to have it apart",
        )
    return Check(name, True, "not a reasoning model: no reasoning text in its answer")


async def _long_context(engine: httpx.AsyncClient, base: str, max_model_len) -> Check:
    name = "long context"
    if not isinstance(max_model_len, int) or max_model_len <= 0:
        return Check(name, False, "the engine's model list states no `max_model_len`")

    async def ask(words: int) -> _Answer:
        # One short common word is one token or more in the tokenizers onjob serves.
        prompt = " ".join(["word"] * words)
        messages = [{"role": "user", "content": prompt}]
        return await _chat(engine, {"model": base, "messages": messages, "max_tokens": 1})

    over = await ask(max_model_len + 64)
    if over.status == 0:
        return Check(
            name, False, f"a prompt over max_model_len {max_model_len} got {over.refusal()}"
        )
    if over.status != 400:
        return Check(
            name,
            False,
            f"a prompt over max_model_len {max_model_len} was answered {over.status}, not "
            "refused with 400",
        )
    near = await ask(max_model_len * 3 // 4)
    if near.status != 200:
        return Check(
            name,
            False,
            f"a prompt of three quarters of max_model_len {max_model_len} failed: {near.refusal()}",
        )
    return Check(
        name,
        True,
        f"max_model_len {max_model_len}: a longer prompt is refused "
        f"({over.refusal()[:80]}), three quarters of it answered",
    )


async def _adapter(engine: httpx.AsyncClient, path: Path) -> Check:
    name = "an adapter loaded, asked and unloaded"
    lora = f"onjob-doctor-{uuid.uuid4().hex[:8]}"
    try:
        await adapters.ensure_loaded(engine, lora, str(path.resolve()))
    except adapters.EngineControlError as exc:
        return Check(name, False, str(exc))
    try:
        answer = await _chat(engine, {"model": lora, "messages": _ASK})
    finally:
        try:
            await adapters.unload(engine, lora)
            left = None
        except adapters.EngineControlError as exc:
            left = str(exc)
    if answer.status != 200 or (answer.data or {}).get("model") != lora:
        return Check(name, False, f"asking the adapter failed: {answer.refusal()}")
    if left is not None:
        return Check(name, False, f"loaded and answered, but not unloaded: {left}")
    return Check(name, True, f"{path} loaded as {lora}, answered, unloaded")


async def _run(
    urls: list[str], adapter: Path | None, timeout: float, token: str | None
) -> list[list[Check]]:
    # The adapter token onjob sends (proxy.engine_token, or the one `onjob serve
    # --start-engine` keeps beside the database): an engine that asks for one answers the
    # adapter routes only with it.
    headers = {"Authorization": f"Bearer {token}"} if token else None
    reports = []
    for url in urls:
        async with httpx.AsyncClient(base_url=url, timeout=timeout, headers=headers) as engine:
            reports.append(await diagnose(engine, adapter))
    return reports


def cmd_doctor(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    urls = [args.engine_url] if args.engine_url else settings.proxy.replica_urls
    adapter = Path(args.adapter) if args.adapter else None
    reports = asyncio.run(_run(urls, adapter, args.timeout, settings.proxy.engine_token))
    for url, checks in zip(urls, reports, strict=True):
        print(f"engine {url}")
        for c in checks:
            print(f"  {'ok' if c.ok else 'MISSING':<8} {c.name}: {c.detail}")
    missing = [c for checks in reports for c in checks if not c.ok]
    if missing:
        raise Failed(f"{len(missing)} missing")
    return Exit.OK


def add_commands(sub) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check that a running engine does what onjob needs",
        description=(
            "Ask a running engine (vLLM or `onjob engine`) for what onjob needs: runtime LoRA "
            "loading, the sampler's logprobs and token ids, requests with tools answered, "
            "a streamed answer that keeps every token id and logprob, a reasoning model's "
            "reasoning kept apart with its tokens, and a long prompt answered or refused. "
            "Says what is missing and how to turn it on; exit status 1 if anything is. "
            "Without --engine-url: every engine of the settings (proxy.engine_urls, or "
            "proxy.engine_url)."
        ),
        parents=[CONFIG],
    )
    doctor.add_argument("--engine-url", help="the engine's OpenAI base URL (…/v1)")
    doctor.add_argument(
        "--adapter", metavar="DIR", help="also load this LoRA directory, ask it and unload it"
    )
    doctor.add_argument(
        "--timeout", type=float, default=120, help="seconds per request (default 120)"
    )
    doctor.set_defaults(func=cmd_doctor)
