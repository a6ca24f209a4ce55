"""onjob's one logprob definition, shared by the engines, the proxy and the trainer.

The trainer's importance ratio divides the policy's logprob of each sampled token by
the sampler's. The policy's is always the model's raw distribution: log-softmax of
the logits, before temperature, top-p or penalties. So the sampler's must be too:
the local engine returns exactly that, and vLLM does when started with
`--logprobs-mode raw_logprobs` (its default has changed between releases, so
`onjob engine --backend vllm` passes it explicitly).

Every logged exchange records the definition its engine used (`exchanges.logprobs_mode`):
what the engine's model list states (the local engine says it), else what
`proxy.engine_logprobs` declares (vLLM's model list does not say). The trainer refuses a
group with a member recorded under another definition.

One more case: a request decoded under a grammar (`response_format` json, a forced
`tool_choice`). The local engine still records the unmasked logprobs (and says so), but
vLLM masks the logits before its sampler takes its "raw" logprobs, so they are the
masked distribution's. An engine that does not state its definition is taken to do as
vLLM does: such an exchange is recorded as `<declared>+grammar`, which is not TRAINED.
"""

from __future__ import annotations

from typing import Final, Literal

# vLLM's `--logprobs-mode` choices.
LogprobsMode = Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"]

TRAINED: Final = "raw_logprobs"  # the definition the trainer's ratio needs


def constrained(request: dict) -> bool:
    """Whether a chat request is decoded under a grammar: a JSON `response_format` or a
    `tool_choice` that forces a call ("required", a named function, allowed tools)."""
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return True
    choice = request.get("tool_choice")
    return bool(request.get("tools")) and (choice == "required" or isinstance(choice, dict))


def recorded(definition: str, *, stated: bool, request: dict) -> str:
    """The definition to record for `request` answered by an engine whose definition is
    `definition`: `stated` by the engine itself (its word covers constrained requests
    too), or declared for it (then a constrained request's logprobs are masked)."""
    if not stated and constrained(request):
        return f"{definition}+grammar"
    return definition
