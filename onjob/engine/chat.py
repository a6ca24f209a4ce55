"""Messages to prompt text, and model output back to OpenAI `tool_calls`.

Tools use the Hermes/Qwen convention that small open models know: the schemas sit
in `<tools>` in the system prompt and the model answers with
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. A chat template that
handles `tools` itself gets them directly.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from .protocol import Message, Tool

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

TOOL_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{schemas}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def text_of(content: str | list[dict[str, Any]] | None) -> str:
    """OpenAI content (a string or a list of parts) as plain text; non-text parts are dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def render(tokenizer, messages: list[Message], tools: list[Tool] | None) -> str:
    """The prompt text for `messages`, ending with the assistant's generation prompt."""
    template = tokenizer.chat_template or ""
    if tools and "tools" in template:
        return tokenizer.apply_chat_template(
            [_native(m) for m in messages],
            tools=[_schema(t) for t in tools],
            tokenize=False,
            add_generation_prompt=True,
        )
    plain = [_plain(m) for m in messages]
    if tools:
        block = TOOL_PROMPT.format(schemas="\n".join(json.dumps(_schema(t)) for t in tools))
        if plain[0]["role"] == "system":
            plain[0] = {"role": "system", "content": f"{plain[0]['content']}\n\n{block}"}
        else:
            plain.insert(0, {"role": "system", "content": block})
    return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)


def _schema(tool: Tool) -> dict:
    fn = {"name": tool.function.name}
    if tool.function.description:
        fn["description"] = tool.function.description
    fn["parameters"] = tool.function.parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def _native(m: Message) -> dict:
    out: dict[str, Any] = {"role": m.role, "content": text_of(m.content)}
    if m.tool_calls:
        out["tool_calls"] = [
            {**c, "function": {**c["function"], "arguments": _arguments(c["function"])}}
            for c in m.tool_calls
        ]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    return out


def _plain(m: Message) -> dict:
    """A message for a template that knows only role and string content."""
    content = text_of(m.content)
    if m.role == "developer":
        return {"role": "system", "content": content}
    if m.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    if m.tool_calls:
        calls = [
            "<tool_call>\n"
            + json.dumps({"name": c["function"]["name"], "arguments": _arguments(c["function"])})
            + "\n</tool_call>"
            for c in m.tool_calls
        ]
        content = "\n".join([content, *calls]) if content else "\n".join(calls)
    return {"role": m.role, "content": content}


def _arguments(function: dict) -> Any:
    args = function.get("arguments", {})
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """Split model output into (content, tool_calls). Unparseable calls stay as text."""
    calls = []
    for match in _TOOL_CALL.finditer(text):
        try:
            data = json.loads(match.group(1))
        except json.JSONDecodeError:
            return text, []
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return text, []
        args = data.get("arguments", data.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": data["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    if not calls:
        return text, []
    content = text[: text.index("<tool_call>")].strip()
    return content or None, calls
