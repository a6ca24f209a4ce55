"""onjob's one logprob definition, shared by the engines, the proxy and the trainer.

The trainer's importance ratio divides the policy's logprob of each sampled token by the
sampler's, and the policy's is the model's raw distribution (log-softmax of the logits,
before temperature, top-p or penalties), so the sampler's must be too (`TRAINED`; vLLM's
`--logprobs-mode raw_logprobs`). Every exchange records the definition its engine used,
`+grammar` when an engine that does not say may have masked the logits under a grammar
(`constrained`), and one rule says what may be trained on (`untrainable`).
docs/engines.md, "`--logprobs-mode raw_logprobs`" and "One rule for what is trained on",
says why each case is there.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final, Literal

# vLLM's `--logprobs-mode` choices.
LogprobsMode = Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"]

TRAINED: Final = "raw_logprobs"  # the definition the trainer's ratio needs


# What vLLM answers for a sampled token with no logprob entry (its `logprobs` helpers' floor,
# vllm/entrypoints/openai/serving_chat.py `_create_chat_logprobs`): not a probability.
NO_LOGPROB: Final = -9999.0


def ask_for_tokens(body: dict, *, legacy: bool = False) -> None:
    """Set in an engine-bound `body` what onjob records of every answer it trains on: each
    sampled token's id and logprob. A legacy completion's `logprobs` counts the
    alternatives to list (the client's count; 0: the sampled token's alone). The proxy's
    forwarded requests and the judge's re-samples both go through here."""
    body["logprobs"] = body.get("logprobs", 0) if legacy else True
    body["return_token_ids"] = True


def constrained(request: dict) -> bool:
    """Whether vLLM decodes a chat request under a grammar (its logprobs then masked):

    - `response_format` `json_object`, `json_schema` or `structural_tag`;
    - vLLM's own fields `structured_outputs` and, on 0.11, `guided_json`, `guided_regex`,
      `guided_choice`, `guided_grammar` (counted whatever the release);
    - with tools: a forced call (`tool_choice` "required" or any object: a named
      function), `parallel_tool_calls: false` (vLLM 0.33 bounds the calls with a
      structural tag), and `tool_choice` "auto" (or unset) when any tool is `strict: true`:
      vLLM's structural-tag tool parsers (hermes, llama3_json; `VLLM_ENFORCE_STRICT_TOOL_
      CALLING`, on by default from 0.25) then constrain the call's arguments. Which release
      and parser run is unknown to the proxy, so these count whichever (0.13 decodes the
      last two freely, 0.33 masks both: tests/test_vllm_contract.py checks it on their code;
      vllm/entrypoints/openai/protocol.py `ChatCompletionRequest.to_sampling_params`,
      vllm/tool_parsers/abstract_tool_parser.py `adjust_request`)."""
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in (
        "json_object",
        "json_schema",
        "structural_tag",
    ):
        return True
    if any(request.get(k) is not None for k in GRAMMAR_FIELDS):
        return True
    tools = request.get("tools")
    if not tools:
        return False
    choice = request.get("tool_choice")
    if choice == "none":
        return False
    if choice == "required" or isinstance(choice, dict):
        return True
    if request.get("parallel_tool_calls") is False:
        return True
    return any(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("strict")
        for t in tools
    )


# vLLM's request fields that attach a grammar (see `constrained`).
GRAMMAR_FIELDS: Final = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


class Untrainable(StrEnum):
    """Why a logged answer is kept out of judge groups and training (`exchanges.untrainable`)."""

    DEFINITION = "definition"  # recorded under another logprob definition than TRAINED
    MASKED = "masked"  # decoded under a grammar: the logprobs are the masked distribution's
    NO_TOKENS = "no_tokens"  # a choice without token ids or logprobs
    NO_USAGE = "no_usage"  # no `usage.completion_tokens` to check the counts against
    COUNT = "count"  # token ids, logprobs and usage.completion_tokens do not agree
    NO_LOGPROB = "no_logprob"  # a token came back with vLLM's -9999.0: no logprob at all
    TOO_LARGE = "too_large"  # stored without its answer: past `collector.max_line_bytes`


def untrainable(
    definition: str | None,
    token_ids: list[list[int]] | None,
    logprobs: list[list[float]] | None,
    usage: Any,
) -> Untrainable | None:
    """The reason an answer (its choices' token ids and logprobs, the engine's `usage`)
    may not be trained on, or None when it may (the module docstring's rule)."""
    if definition is not None and definition.endswith(GRAMMAR):
        return Untrainable.MASKED
    if definition != TRAINED:
        return Untrainable.DEFINITION
    if not token_ids or not logprobs or len(token_ids) != len(logprobs):
        return Untrainable.NO_TOKENS
    if any(ids is None or lps is None for ids, lps in zip(token_ids, logprobs, strict=True)):
        return Untrainable.NO_TOKENS
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if type(completion) is not int:
        return Untrainable.NO_USAGE
    if any(len(ids) != len(lps) for ids, lps in zip(token_ids, logprobs, strict=True)):
        return Untrainable.COUNT
    if sum(len(ids) for ids in token_ids) != completion:
        return Untrainable.COUNT
    if any(lp <= NO_LOGPROB for lps in logprobs for lp in lps):
        return Untrainable.NO_LOGPROB
    return None


GRAMMAR: Final = "+grammar"  # suffix of a definition recorded for a grammar-masked answer


def recorded(definition: str, *, stated: bool, request: dict) -> str:
    """The definition to record for `request` answered by an engine whose definition is
    `definition`: `stated` by the engine itself (its word covers constrained requests
    too), or declared for it (then a constrained request's logprobs are masked)."""
    if not stated and constrained(request):
        return f"{definition}{GRAMMAR}"
    return definition
