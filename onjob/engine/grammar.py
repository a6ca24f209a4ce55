"""Constrained decoding: `response_format` and forced tool calls as xgrammar grammars.

What a request constrains, and to what (`constraint`):

- `response_format` `json_object`: any JSON object; `json_schema` (strict or not):
  that schema. JSON is written on one line in `json.dumps`' style (`", "`, `": "`),
  so a small model cannot wander off into whitespace.
- `tool_choice` `"required"`: one call or more (one with `parallel_tool_calls:
  false`) of any listed function, nothing else; a named function: one call of it.
  Calls are written in the format the engine reads back (`chat.parse_tool_calls`),
  `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, with the arguments
  under the function's `parameters` schema, so a forced call is made of the same
  tokens as one the model chose to write.
- `"auto"` with tools is not constrained (as vLLM), unless `response_format` also
  asks for JSON: then the answer is that JSON or calls as above.

The sampler draws each constrained token from the model's distribution with the
grammar's disallowed tokens masked out (`mask_logits`), one matcher per choice, so
other rows of the same batch are untouched. The logprob recorded for the token stays
the raw, unmasked one (onjob's one definition, `onjob.logprobs`): the trainer's policy
forward knows nothing of grammars, and a masked logprob (0 for a token the grammar
forces) would differ from its raw log-softmax on every forced token.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..protocol import ChatCompletionRequest, JsonObject
from ..protocol.fields import Tool
from .errors import BadRequest

_WHERE = re.compile(r"^\[[^\]]*\] \S+: ")  # xgrammar's "[15:37:17] /project/cpp/x.cc:12: "


@dataclass(frozen=True)
class Constraint:
    """What an answer must match: xgrammar's structural tag (JSON), or a JSON schema alone."""

    param: str  # the request field a compile error is blamed on
    schema: str | None = None
    structural_tag: str | None = None


ToolMode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class Tools:
    """The tools a request offers the model and how it must use them."""

    offered: list[Tool]  # those the answer may call
    mode: ToolMode
    parallel: bool

    @classmethod
    def of(cls, req: ChatCompletionRequest) -> Tools:
        tools = list(req.tools or [])
        choice = req.tool_choice if req.tool_choice is not None else "auto"
        parallel = req.parallel_tool_calls is not False
        # As vLLM's `check_tool_usage` (vllm/entrypoints/openai/protocol.py, 0.13 to 0.33):
        # an empty `tools` is a 400 (0.33, and OpenAI; 0.13 took it as "none"), and a
        # `tool_choice` other than "none" needs `tools`.
        if req.tools == []:
            raise BadRequest(
                "`tools` must not be an empty array: give at least one tool or leave it out.",
                param="tools",
            )
        if choice == "none" or (req.tool_choice is None and not tools):
            return cls([], "none", parallel)
        if not tools:
            raise BadRequest("When using `tool_choice`, `tools` must be set.", param="tool_choice")
        if isinstance(choice, str):
            return cls(tools, choice, parallel)
        named = [t for t in tools if t.function.name == choice.function.name]
        if not named:
            raise BadRequest(
                f"tool_choice names the function `{choice.function.name}`, "
                "which is not in `tools`.",
                param="tool_choice",
            )
        return cls(named[:1], "named", parallel)


def constraint(req: ChatCompletionRequest, tools: Tools) -> Constraint | None:
    """The grammar a request's answer is decoded under, or None for free text."""
    schema = _response_schema(req)
    if tools.mode in ("required", "named"):
        calls = _calls(tools)
        return Constraint(param="tools", structural_tag=_tag(calls))
    if schema is None:
        return None
    if tools.mode == "auto":
        calls = _calls(tools)
        either = {"type": "or", "elements": [_json_format(schema, "response_format"), calls]}
        return Constraint(param="response_format", structural_tag=_tag(either))
    return Constraint(param="response_format", schema=json.dumps(schema))


def _response_schema(req: ChatCompletionRequest) -> Any:
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return {"type": "object"}
    if rf.json_schema is None or rf.json_schema.schema is None:
        raise BadRequest(
            "response_format of type json_schema needs json_schema.schema.",
            param="response_format",
        )
    return rf.json_schema.schema


def _calls(tools: Tools) -> JsonObject:
    tags = [
        {
            "type": "tag",
            "begin": '<tool_call>\n{"name": ' + json.dumps(t.function.name) + ', "arguments": ',
            "content": _json_format(
                t.function.parameters or {"type": "object", "properties": {}}, "tools"
            ),
            "end": "}\n</tool_call>",
        }
        for t in tools.offered
    ]
    if tools.mode == "named":
        return tags[0]
    return {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": "\n",
        "at_least_one": True,
        "stop_after_first": not tools.parallel,
    }


def _json_format(schema: Any, param: str) -> JsonObject:
    """A JSON schema as a structural-tag element, one line in `json.dumps`' style (the
    structural tag's own `json_schema` element allows any whitespace)."""
    import xgrammar as xgr

    try:
        grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    except Exception as exc:
        raise _refusal(exc, param) from exc
    return {"type": "grammar", "grammar": str(grammar)}


def _tag(fmt: dict) -> str:
    return json.dumps({"type": "structural_tag", "format": fmt})


def _refusal(exc: Exception, param: str) -> BadRequest:
    reason = _WHERE.sub("", str(exc).strip())
    return BadRequest(f"The schema in `{param}` cannot be decoded under: {reason}", param=param)


class Grammars:
    """The tokenizer's vocabulary as xgrammar sees it, and compiled grammars (cached)."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_ids = sorted(stop_ids)
        self._compiler = None
        self._lock = threading.Lock()

    def _get_compiler(self):
        import xgrammar as xgr

        with self._lock:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._stop_ids
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def compile(self, c: Constraint):
        """The compiled grammar for `c`; a schema xgrammar cannot compile is a 400 naming
        `c.param`. Slow for a new schema (milliseconds to a second): run it off the loop."""
        compiler = self._get_compiler()
        try:
            if c.schema is not None:
                return compiler.compile_json_schema(c.schema, any_whitespace=False)
            return compiler.compile_structural_tag(c.structural_tag)
        except Exception as exc:
            raise _refusal(exc, c.param) from exc


def matcher(compiled):
    import xgrammar as xgr

    return xgr.GrammarMatcher(compiled)


def mask_logits(logits: torch.Tensor, matchers: list) -> None:
    """Set to -inf, in place, each row's logits of tokens its matcher does not allow next."""
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(matchers), logits.shape[-1])
    for i, m in enumerate(matchers):
        m.fill_next_token_bitmask(bitmask, i)
    xgr.apply_token_bitmask_inplace(logits, bitmask)
