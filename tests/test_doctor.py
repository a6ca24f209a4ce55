"""`onjob doctor` against a real local engine (which does everything onjob needs), and
against engines scripted at the HTTP boundary as vLLM answers when one thing is off."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from onjob.cli.doctor import diagnose
from onjob.cli.process import free_port

from .fake_engine import MODELS, chunk, completion

ONJOB = str(Path(sys.executable).with_name("onjob"))


def doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ONJOB, "doctor", *args], capture_output=True, text=True, timeout=300)


def test_the_local_engine_has_everything_onjob_needs(engine, tiny_adapter_dir):
    done = doctor("--engine-url", engine.url, "--adapter", str(tiny_adapter_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"engine {engine.url}"
    assert [line.split()[0] for line in lines[1:]] == ["ok"] * 9, done.stdout
    assert "ok       logprob definition: raw_logprobs" in done.stdout
    assert "ok       reasoning: not a reasoning model" in done.stdout
    # The tiny model's 1024 tokens: a longer prompt is a 400 naming the context length.
    assert "ok       long context: max_model_len 1024: a longer prompt is refused (400: " in (
        done.stdout
    )
    # The probe adapter is gone again.
    models = httpx.get(f"{engine.url}/models").json()["data"]
    assert not [m for m in models if m["id"].startswith("onjob-doctor-")]


def test_an_engine_that_does_not_answer_is_reported_with_exit_1():
    url = f"http://127.0.0.1:{free_port()}/v1"
    done = doctor("--engine-url", url)
    assert done.returncode == 1
    assert "MISSING  reachable" in done.stdout and "1 missing" in done.stderr


class VLLM:
    """vLLM's answers with one thing off: `off` is "runtime_lora" (started without
    VLLM_ALLOW_RUNTIME_LORA_UPDATING: the routes do not exist), "token_ids" (a version
    that ignores `return_token_ids`), "logprobs", "tools" (no tool-call parser), or
    "definition" (its model list states logprobs that are not raw_logprobs), "stream"
    (vLLM 0.11-0.12: a chunk its tool parser held back is dropped with its token ids and
    logprobs, while usage counts it; vllm/entrypoints/openai/serving_chat.py), "reasoning"
    (the same loss behind a reasoning parser), "long" (a prompt over max_model_len
    answered). "thinks" is a reasoning model with nothing off."""

    def __init__(self, off: str | None) -> None:
        self.off = off

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/models"):
            if self.off == "definition":  # an engine that states another definition
                card = {**MODELS["data"][0], **LEN, "logprobs": "processed_logprobs"}
                return httpx.Response(200, json={**MODELS, "data": [card]})
            return httpx.Response(200, json={**MODELS, "data": [{**MODELS["data"][0], **LEN}]})
        if path.endswith("_lora_adapter"):
            if self.off == "runtime_lora":
                return httpx.Response(404, json={"detail": "Not Found"})
            name = json.loads(request.content)["lora_name"]
            error = {"message": f"The lora adapter '{name}' cannot be found.", "code": 404}
            return httpx.Response(404, json={"error": {**error, "type": "NotFoundError"}})
        body = json.loads(request.content)
        if body.get("tools") and self.off == "tools":
            message = (
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set"
            )
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return httpx.Response(400, json={"error": error})
        if body.get("stream") and not body.get("tools"):
            return self.reasoning()
        prompt = body["messages"][-1]["content"]
        if len(prompt.split()) > LEN["max_model_len"] and self.off != "long":
            message = (
                f"This model's maximum context length is {LEN['max_model_len']} tokens. However, "
                f"your request has {len(prompt.split()) + 9} input tokens. Please reduce the "
                "length of the input messages."
            )
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return httpx.Response(400, json={"error": error})
        if body.get("stream"):
            counted = 3 if self.off == "stream" else 2
            usage = {"prompt_tokens": 5, "completion_tokens": counted, "total_tokens": 5 + counted}
            events = [
                chunk("a"),
                chunk("b", finish="stop"),
                chunk(usage=usage),
                b"data: [DONE]\n\n",
            ]
            return httpx.Response(200, content=b"".join(events))
        return self.answer()

    def reasoning(self) -> httpx.Response:
        said = (
            ("First, 17 times 20.", "That is 340.") if self.off in ("thinks", "reasoning") else ()
        )
        counted = 3 + len(said) + (self.off == "reasoning")
        usage = {"prompt_tokens": 5, "completion_tokens": counted, "total_tokens": 5 + counted}
        events = [
            *(thought(text) for text in said),
            chunk("391"),
            chunk(" it is"),
            chunk(".", finish="stop"),
            chunk(usage=usage),
            b"data: [DONE]\n\n",
        ]
        return httpx.Response(200, content=b"".join(events))

    def answer(self) -> httpx.Response:
        answer = completion()
        if self.off == "token_ids":
            del answer["prompt_token_ids"]
            del answer["choices"][0]["token_ids"]
        if self.off == "logprobs":
            answer["choices"][0]["logprobs"] = None
        return httpx.Response(200, json=answer)


LEN = {"max_model_len": 64}


def thought(text: str) -> bytes:
    """A streamed chunk of reasoning, as vLLM 0.13 and later name it."""
    event = json.loads(chunk(text)[6:])
    event["choices"][0]["delta"] = {"reasoning": text}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def checks_of(off: str | None) -> dict:
    async def run():
        transport = httpx.MockTransport(VLLM(off))
        async with httpx.AsyncClient(transport=transport, base_url="http://vllm/v1") as client:
            return await diagnose(client)

    return {c.name: c for c in asyncio.run(run())}


@pytest.mark.parametrize(
    ("off", "failing", "says"),
    [
        ("runtime_lora", "runtime LoRA loading", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"),
        ("token_ids", "logprobs and token ids", "no completion token ids"),
        ("logprobs", "logprobs and token ids", "no sampled logprobs"),
        ("tools", "tool calls", "--enable-auto-tool-choice --tool-call-parser"),
        ("definition", "logprob definition", "needs raw_logprobs"),
        ("stream", "streamed tokens", "2 token ids and 2 logprobs for 3 tokens"),
        ("reasoning", "reasoning", "5 token ids and 5 logprobs for 6 tokens"),
        ("long", "long context", "was answered 200, not refused with 400"),
    ],
)
def test_each_thing_an_engine_lacks_is_named_with_how_to_turn_it_on(off, failing, says):
    checks = checks_of(off)
    # Without a tool parser the streamed check's request (it carries a tool) fails too.
    also = ["streamed tokens"] if off == "tools" else []
    assert [name for name, c in checks.items() if not c.ok] == [failing, *also]
    assert says in checks[failing].detail


def test_a_scripted_vllm_with_everything_on_passes():
    checks = checks_of(None)
    assert all(c.ok for c in checks.values())
    # vLLM's model list does not state its definition: the check says what it must run with.
    assert "--logprobs-mode raw_logprobs" in checks["logprob definition"].detail
    assert checks["reasoning"].detail.startswith("not a reasoning model")
    assert "maximum context length is 64 tokens" in checks["long context"].detail


def test_a_reasoning_models_reasoning_and_its_tokens_are_checked():
    check = checks_of("thinks")["reasoning"]
    assert check.ok
    assert check.detail.startswith("a reasoning model: 31 characters of reasoning")
