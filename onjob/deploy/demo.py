"""`onjob demo`: for now, start the local engine with the bundled model and chat once."""

from __future__ import annotations

import sys
import time

import httpx

from .. import bundled
from .process import EngineProcess


def run(port: int = 0) -> int:
    bundled.prepare()
    print("onjob demo: starting the local engine (SmolLM2-135M-Instruct on CPU)...", flush=True)
    with EngineProcess(port=port) as engine:
        print(f"onjob demo: engine ready at {engine.url}", flush=True)
        question = "What is the capital of France? Answer in one sentence."
        started = time.monotonic()
        reply = httpx.post(
            f"{engine.url}/chat/completions",
            json={
                "model": bundled.MODEL_NAME,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 48,
                "temperature": 0,
            },
            timeout=300,
        )
        if reply.status_code != 200:
            print(
                f"onjob demo: the engine answered {reply.status_code}: {reply.text}",
                file=sys.stderr,
            )
            return 1
        body = reply.json()
        print(f"user:      {question}")
        print(f"assistant: {body['choices'][0]['message']['content']}")
        usage = body["usage"]
        print(
            f"({usage['completion_tokens']} tokens in {time.monotonic() - started:.1f} s; "
            f"prompt {usage['prompt_tokens']} tokens)"
        )
    return 0
