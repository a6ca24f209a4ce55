"""Engines onjob serves through: the local engine (transformers + peft on CPU or GPU) and vLLM.

Both speak one HTTP contract, vLLM's OpenAI server with runtime LoRA loading,
so the proxy, judge and deploy code never know which one is running. Only this
package (and the trainer) imports torch; import it lazily.

What each module holds:

the local engine: the model and its adapters, at most `max_cpu_loras` with weights in
the model, the least recently used idle one taken out and loaded again from its path on
its next request, the LoRA layers switched off for a batch of base-model rows and on for
one with adapters only when that changes (`model.py`), continuous batching with a
full-history cache and the model's own masks per layer type, sliding windows included,
and the last prefill kept so a request with the same prompt and adapter copies it; users
first: requests admitted by vLLM's `priority`, the most urgent rows decoding in a front
lane every step and less urgent ones in a lane of their own on `background_share` of the
time, a less urgent prompt prefilled by chunks on that share, the least urgent rows
parked when a more urgent request finds the batch full (`batching.py`), sampling with
logprobs (`sampling.py`), constrained decoding of structured outputs and forced tool
calls with xgrammar (`grammar.py`), chat templates and tool calls, streamed as OpenAI
streams them, a forced call cut by `max_tokens` returned as its complete calls and an
answer under `parallel_tool_calls: false` ended at its first call (`chat.py`), adapters
loaded by name on a request's first use, vLLM's LoRA resolver contract, from a host
cache filled from the bucket (`resolver.py`; inside vLLM, onjob's resolver plugin:
`vllm_plugin.py`), the HTTP server with vLLM's contract (`server.py`: each route a
handler of its own, `/metrics` vLLM's two queue gauges, sharing the `Engine` that turns
a request into the batch's work and an answer; `protocol.py`: what it refuses of
`onjob.protocol`'s requests, and its own routes' bodies; its adapter routes answer
loopback peers with the adapter token only: `control.py`; legacy text completions in
`completions.py`; each answer built as `onjob.protocol`'s declaration of it, the one the
proxy reads and documents; usage and the SSE framing in `answers.py`); the vLLM launcher (`vllm.py`:
the version it needs and the ones tested, priority scheduling, the environment it
passes, the memory it checks, the context it caps, the Mistral grammar it refuses, the
Hermes preamble it gives a model whose template ignores tools) and where vLLM lives
(`vllm_install.py`: its own virtualenv, `onjob engine install vllm`) and its tool-call
parser per model family (`tool_parsers.py`); what vLLM's own request model and Hermes
parser do, recorded from its released wheel, is the local engine's contract test
(`tests/fixtures/vllm/`, `tests/test_vllm_contract.py`)
"""

from .settings import EngineSettings

__all__ = ["EngineSettings", "serve"]


def serve(settings: EngineSettings) -> None:
    """Run an engine in this process until interrupted."""
    from .main import serve as _serve

    _serve(settings)
