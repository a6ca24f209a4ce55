"""What every answer of the engine shares, chat or legacy completion: its `usage`, and the
SSE framing of a stream (each chunk a `data:` event, then `[DONE]`); and the queue gauges
of `GET /metrics`. The answers' shapes are `onjob.protocol`'s (`chat.ChatCompletion`,
`completion.TextCompletion`, ...), the ones the proxy reads and documents."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from msgspec import UNSET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..protocol.fields import PromptTokensDetails, Usage


def usage(prompt: int, completion: int, cached: int = 0) -> Usage:
    """OpenAI's usage; `cached`: prompt tokens whose prefill was reused, reported as
    OpenAI and vLLM (`--enable-prompt-tokens-details`) report it, only when some were."""
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached) if cached else UNSET,
    )


async def sse(chunks: AsyncIterator[object]) -> AsyncIterator[bytes]:
    async for c in chunks:
        yield b"data: " + msgspec.json.encode(c) + b"\n\n"
    yield b"data: [DONE]\n\n"


def queue_metrics(model: str, running: int, waiting: int) -> bytes:
    """vLLM's `vllm:num_requests_running` and `vllm:num_requests_waiting` gauges, in
    Prometheus' text format, labelled with the served model as vLLM labels them."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Queue(model, running, waiting))
    return generate_latest(registry)


class _Queue:
    def __init__(self, model: str, running: int, waiting: int) -> None:
        self.figures = (model, running, waiting)

    def collect(self):
        model, running, waiting = self.figures
        for name, value, what in (
            ("vllm:num_requests_running", running, "Number of requests in the batch."),
            ("vllm:num_requests_waiting", waiting, "Number of requests waiting for the batch."),
        ):
            gauge = GaugeMetricFamily(name, what, labels=["model_name"])
            gauge.add_metric([model], value)
            yield gauge
