"""The types, bounds and field lists the chat and legacy requests share (`chat.py`,
`completion.py`). The bounds are vLLM's (`vllm/sampling_params.py` `_verify_args`:
`temperature` 0 to 2, `top_p` above 0 where OpenAI takes 0, penalties -2 to 2; older
releases took any non-negative temperature) and OpenAI's `logit_bias` of -100 to 100,
which vLLM clamps, so a request the proxy forwards is one the engine accepts.

And which of OpenAI's fields are only hints (`HINTS`: accepted and dropped, the answer is
the same without them) and which are refused by name (`REFUSED`): the proxy drops and
refuses these before any engine sees them, and the local engine answers the same to a
client that calls it directly.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

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


class FunctionDefinition(msgspec.Struct, kw_only=True):
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
