"""The types, bounds and field lists the chat and legacy APIs share (`chat.py`,
`completion.py`), requests and answers. The bounds are vLLM's
(`vllm/sampling_params.py` `_verify_args`: `temperature` 0 to 2, `top_p` above 0 where
OpenAI takes 0, penalties -2 to 2; older releases took any non-negative temperature) and
OpenAI's `logit_bias` of -100 to 100, which vLLM clamps, so a request the proxy forwards
is one the engine accepts.

And which of OpenAI's fields are only hints (`HINTS`: accepted and dropped, the answer is
the same without them) and which are refused by name (`REFUSED`): the proxy drops and
refuses these before any engine sees them, and the local engine answers the same to a
client that calls it directly.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

Temperature = Annotated[float, Meta(ge=0, le=2)]
TopP = Annotated[float, Meta(gt=0, le=1)]
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]  # presence and frequency
LogitBias = dict[str, Annotated[float, Meta(ge=-100, le=100)]]

HINTS: frozenset[str] = frozenset(
    {
        "store",  # every exchange is logged anyway
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "service_tier",
        "prediction",  # predicted outputs: a latency hint, the answer is the same without it
    }
)
# Honouring these needs what no engine behind onjob has, and ignoring them would change
# the answer. (`modalities` other than ["text"] is refused too, checked on its own.)
REFUSED: dict[str, str] = {
    "audio": "audio output is not served",
    "web_search_options": "web search is not served",
    "verbosity": "the engine has no verbosity control",
    "moderation": "moderation is not served",
    "functions": "deprecated: send `tools`",
    "function_call": "deprecated: send `tool_choice`",
}


class FunctionDefinition(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # calls forced by tool_choice are always decoded under the schema


class Tool(msgspec.Struct, kw_only=True):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # padding against side channels: none to pad


# -- What the answers share. An answer's parts are `Exact`: the local engine builds them,
# the proxy reads an engine's streamed events into them and sends them on, `/openapi.json`
# documents them and the log keeps them. A field left out stays out (UNSET is not encoded),
# so an event re-encoded carries the fields its engine sent, no more; a field the
# declaration does not know refuses the typed reading, and the proxy reads that answer as a
# dict instead (`checks.known`), every field passed on as sent.

TokenId = Annotated[int, Meta(ge=0, lt=2**31)]  # stored as int32 (`array("i")`)
Count = Annotated[int, Meta(ge=0)]
Index = Annotated[int, Meta(ge=0, lt=1024)]  # a choice's or a tool call's place
# Stored as FLOAT (float32): a value past its range would refuse the whole spool line.
Logprob = Annotated[float, Meta(ge=-3.4e38, le=3.4e38)]


class Exact(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An answer's part: every field declared, an absent one left out."""


class PromptTokensDetails(Exact, kw_only=True):
    cached_tokens: Count | UnsetType | None = UNSET  # prompt tokens whose prefill was reused


class Usage(Exact, kw_only=True):
    prompt_tokens: Count | UnsetType | None = UNSET
    completion_tokens: Count | UnsetType | None = UNSET
    total_tokens: Count | UnsetType | None = UNSET
    prompt_tokens_details: PromptTokensDetails | UnsetType | None = UNSET
