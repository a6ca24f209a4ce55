"""Which of vLLM's tool-call parsers reads a model's tool calls, chosen from its family.

vLLM answers any chat request that carries `tools` without `tool_choice` (so "auto")
with 400 unless it was started with `--enable-auto-tool-choice --tool-call-parser NAME`,
and the parser must read the format the model was trained to write. Agents send tools
on most requests, so onjob picks the parser at start from the model's `config.json`
(`model_type`, Llama's rope type) and its name, for the families where vLLM's tool
calling docs name one parser; any other model is refused at start, not per request.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import OnjobError

# `tool_call_parser = "none"`: vLLM starts without tool calling (requests with tools 400).
NONE = "none"


@dataclass(frozen=True)
class Family:
    name: str
    parser: str


QWEN3_CODER = Family("Qwen3-Coder", "qwen3_coder")
LLAMA4 = Family("Llama 4", "llama4_pythonic")
LLAMA3 = Family("Llama 3.1/3.2/3.3", "llama3_json")
MISTRAL = Family("Mistral", "mistral")
QWEN = Family("Qwen2.5/Qwen3", "hermes")

# From the name alone (a hub id, or a directory without config.json).
_NAMES = [
    (re.compile(r"qwen3.*coder"), QWEN3_CODER),
    (re.compile(r"llama-?4"), LLAMA4),
    (re.compile(r"llama-?3\.[123]"), LLAMA3),
    (re.compile(r"mistral|mixtral|ministral"), MISTRAL),
    (re.compile(r"qwen2\.5|qwen3"), QWEN),
]


class UnknownFamily(OnjobError):
    """No parser is known for the model's family; the message says which setting to set."""


def family(model: str) -> Family | None:
    """The tool-calling family of `model` (a directory or a hub id), or None."""
    config_file = Path(model) / "config.json"
    name = model.lower()
    if not config_file.is_file():
        return next((f for pattern, f in _NAMES if pattern.search(name)), None)
    config = json.loads(config_file.read_text())
    kind = config.get("model_type")
    # The name also comes from config.json: a local copy may sit in a directory named
    # anything, and Qwen3-Coder shares Qwen3's model_type.
    name += " " + str(config.get("_name_or_path", "")).lower()
    if kind in ("qwen3", "qwen3_moe") and "coder" in name:
        return QWEN3_CODER
    if kind == "llama4":
        return LLAMA4
    # Llama 3.1 and later carry rope_type "llama3"; Llama 2, Llama 3.0 and other llama-type
    # models (SmolLM2, TinyLlama) have no tool-call format vLLM names.
    if kind == "llama" and (config.get("rope_scaling") or {}).get("rope_type") == "llama3":
        return LLAMA3
    if kind in ("mistral", "mixtral"):
        return MISTRAL
    if kind in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        return QWEN
    return None


def choose(model: str, configured: str | None) -> str | None:
    """The parser to start vLLM with: `configured` if set (None for "none"), else the
    family's. Raises `UnknownFamily` when neither says."""
    if configured is not None:
        return None if configured == NONE else configured
    found = family(model)
    if found is None:
        raise UnknownFamily(
            f"no tool-call parser is known for {model}'s family, and vLLM would answer "
            "every request that carries tools with 400. Set tool_call_parser "
            "(--tool-call-parser, ONJOB_ENGINE_TOOL_CALL_PARSER) to the vLLM parser for "
            "the format the model writes (hermes, llama3_json, mistral, pythonic, ...: "
            'see vLLM\'s tool calling docs), or to "none" if no agent sends tools.'
        )
    return found.parser
