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

from ..protocol import JsonObject
from ..protocol.chat import Message, ToolCall, arguments_of, text_of
from ..protocol.fields import Tool
from .errors import BadRequest

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


# `render`'s fallback for a template that ignores `tools`, as Jinja run before that
# template: vLLM renders prompts itself, and is given the model's template behind this
# preamble (`vllm.tool_template`), so both engines show the model the same prompt. Each
# line mirrors `_plain` and `render`; HF's `tojson` is json.dumps with its separators.
_PREAMBLE = """\
{%- set ns = namespace(out=[]) -%}
{%- for m in messages -%}
{%- set content = m.content if m.content is string else "" -%}
{%- if m.role == "developer" -%}
{%- set ns.out = ns.out + [{"role": "system", "content": content}] -%}
{%- elif m.role == "tool" -%}
{%- set ns.out = ns.out + [{"role": "user", "content": "<tool_response>\\n" + content + \
"\\n</tool_response>"}] -%}
{%- elif m.tool_calls -%}
{%- set calls = namespace(text=[]) -%}
{%- for c in m.tool_calls -%}
{%- set call = {"name": c.function.name, "arguments": c.function.arguments} -%}
{%- set calls.text = calls.text + ["<tool_call>\\n" + (call | tojson) + "\\n</tool_call>"] -%}
{%- endfor -%}
{%- set text = ([content] + calls.text) if content else calls.text -%}
{%- set ns.out = ns.out + [{"role": m.role, "content": text | join("\\n")}] -%}
{%- else -%}
{%- set ns.out = ns.out + [{"role": m.role, "content": content}] -%}
{%- endif -%}
{%- endfor -%}
{%- if tools -%}
{%- set schemas = namespace(text=[]) -%}
{%- for t in tools -%}
{%- set f = t.function -%}
{%- set described = (", \\"description\\": " + (f.description | tojson))
if f.description else "" -%}
{%- set parameters = (f.parameters | tojson) if f.parameters else \
"{\\"type\\": \\"object\\", \\"properties\\": {}}" -%}
{%- set schemas.text = schemas.text + ["{\\"type\\": \\"function\\", \\"function\\": " +
"{\\"name\\": " + (f.name | tojson) + described + ", \\"parameters\\": " + parameters + "}}"] -%}
{%- endfor -%}
{%- set block = HEAD + (schemas.text | join("\\n")) + TAIL -%}
{%- if ns.out and ns.out[0].role == "system" -%}
{%- set ns.out = [{"role": "system", "content": ns.out[0].content + "\\n\\n" + block}] +
ns.out[1:] -%}
{%- else -%}
{%- set ns.out = [{"role": "system", "content": block}] + ns.out -%}
{%- endif -%}
{%- endif -%}
{%- set messages = ns.out -%}
"""


def hermes_template(own: str) -> str:
    """A chat template that renders as `render` does for a template that ignores `tools`:
    `own` (the model's template) behind `_PREAMBLE`."""
    head, tail = TOOL_PROMPT.format(schemas="\0").split("\0")
    return _PREAMBLE.replace("HEAD", json.dumps(head)).replace("TAIL", json.dumps(tail)) + own


def render(
    tokenizer,
    messages: list[Message],
    tools: list[Tool] | None,
    reasoning_effort: str | None = None,
) -> str:
    """The prompt text for `messages`, ending with the assistant's generation prompt.

    The model reads text only: an image, audio or file part is refused (400), as OpenAI
    and vLLM refuse them for a text-only model, rather than dropped unseen.
    `reasoning_effort` is a variable of the chat template, when given (as vLLM gives it)."""
    _refuse_unseen(messages)
    template = tokenizer.chat_template or ""
    extra = {} if reasoning_effort is None else {"reasoning_effort": reasoning_effort}
    if tools and "tools" in template:
        return tokenizer.apply_chat_template(
            [_native(m) for m in messages],
            tools=[_schema(t) for t in tools],
            tokenize=False,
            add_generation_prompt=True,
            **extra,
        )
    plain = [_plain(m) for m in messages]
    if tools:
        block = TOOL_PROMPT.format(schemas="\n".join(json.dumps(_schema(t)) for t in tools))
        if plain[0]["role"] == "system":
            plain[0] = {"role": "system", "content": f"{plain[0]['content']}\n\n{block}"}
        else:
            plain.insert(0, {"role": "system", "content": block})
    return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True, **extra)


def _refuse_unseen(messages: list[Message]) -> None:
    for i, m in enumerate(messages):
        for j, part in enumerate(m.content if isinstance(m.content, list) else []):
            if part.type in ("image_url", "input_audio", "file"):
                raise BadRequest(
                    f"This model reads text only: a `{part.type}` part cannot be shown to it.",
                    param=f"messages[{i}].content[{j}]",
                )


def _schema(tool: Tool) -> JsonObject:
    fn = {"name": tool.function.name}
    if tool.function.description:
        fn["description"] = tool.function.description
    fn["parameters"] = tool.function.parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def _native(m: Message) -> JsonObject:
    out: dict[str, Any] = {"role": m.role, "content": text_of(m.content)}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": c.type, "function": {"name": name, "arguments": arguments}}
            for c, (name, arguments) in _function_calls(m)
        ]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    return out


def _plain(m: Message) -> JsonObject:
    """A message for a template that knows only role and string content."""
    content = text_of(m.content)
    if m.role == "developer":
        return {"role": "system", "content": content}
    if m.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    if m.tool_calls:
        calls = [
            "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
            for _, (name, arguments) in _function_calls(m)
        ]
        content = "\n".join([content, *calls]) if content else "\n".join(calls)
    return {"role": m.role, "content": content}


def _function_calls(m: Message) -> list[tuple[ToolCall, tuple[str, Any]]]:
    """Each function call of an assistant message with its name and arguments, decoded
    from their JSON string where they are JSON (as templates expect an object); calls of
    other tool types are not shown to the model."""
    return [
        (call, (call.function.name, arguments_of(call.function.arguments)))
        for call in m.tool_calls or ()
        if call.function is not None
    ]


def parse_tool_calls(
    text: str, limit: int | None = None, *, cut: bool = False
) -> tuple[str | None, list[dict]]:
    """Split model output into (content, tool_calls) as vLLM's Hermes parser does
    (vllm/tool_parsers/hermes_tool_parser.py, 0.13; tests/fixtures/vllm/ records it):
    content is the text before the first `<tool_call>`, as written; each call needs
    `name` and `arguments`, re-written with `json.dumps`; one unparseable call leaves the
    whole output as content. With `limit` (1 under `parallel_tool_calls: false`), calls
    past it are dropped.

    `cut`: the output was a forced call (a grammar wrote it) cut by `max_tokens`, so
    everything before the cut is a prefix of well-formed calls: the complete calls (one
    whose JSON closed before a cut `</tool_call>` among them) are returned and the
    unfinished last one dropped, since a forced answer is a tool call
    (OpenAI's contract for `tool_choice` "required"). vLLM parses a "required" answer
    as one JSON list of calls (`vllm/entrypoints/openai/engine/serving.py`,
    `TypeAdapter(list[FunctionDefinition]).validate_json` under
    `contextlib.suppress(ValidationError)`), so a cut one comes back with no calls and
    no content; the finish reason stays "length" here as there.

    Two deliberate differences (tests/test_vllm_contract.py): each call's JSON is read
    with a JSON decoder from its `<tool_call>` on, so an argument string that contains
    `</tool_call>` does not end the call (vLLM's regex ends it there and returns text);
    and `arguments` written as a JSON string is passed as is (vLLM encodes it again)."""
    calls = []
    pos = 0
    while (at := text.find(_OPEN, pos)) >= 0:
        start = at + len(_OPEN)
        start += len(text[start:]) - len(text[start:].lstrip())
        try:
            data, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            if cut and calls:
                break
            return text, []
        rest = text[end:].lstrip()
        if cut and rest and _CLOSE.startswith(rest):
            rest = ""  # the cut fell inside the closing tag: the call itself is whole
        if rest and not rest.startswith(_CLOSE):
            return text, []
        pos = len(text) - len(rest) + (len(_CLOSE) if rest else 0)
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return text, []
        if "arguments" not in data:
            return text, []
        args = data["arguments"]
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": data["name"],
                    "arguments": args
                    if isinstance(args, str)
                    else json.dumps(args, ensure_ascii=False),
                },
            }
        )
    if not calls:
        return text, []
    return text[: text.index(_OPEN)] or None, calls[:limit]


def first_call_closed(text: str) -> bool:
    """Whether `text` holds a complete `<tool_call>...</tool_call>`: where an answer that
    may make one call only (`parallel_tool_calls: false`) has nothing more to say."""
    at = text.find(_OPEN)
    if at < 0 or text.find(_CLOSE, at) < 0:  # cheap: checked at every token
        return False
    start = at + len(_OPEN)
    start += len(text[start:]) - len(text[start:].lstrip())
    try:
        _, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        return False
    return text[end:].lstrip().startswith(_CLOSE)


_DECODER = json.JSONDecoder()
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')


class ToolCallStream:
    """Streamed model output as OpenAI streams it: content deltas, then per call a first
    delta with its `id`, `type` and `function.name` (arguments ""), then argument fragments.

    It reads the same `<tool_call>` format as `parse_tool_calls`, tag by tag; the JSON
    inside is passed through, not parsed. A call whose head is `{"name": ..., "arguments":`
    (how the engine's grammar and the Hermes format write it) streams its arguments as
    they come, holding back only from the last `}` (the call's own closing brace may be
    it); any other shape is sent whole when its `</tool_call>` arrives. Text after the
    first call is dropped, as `parse_tool_calls` drops it; so are calls past `limit`.
    Under `tool_choice` "auto" nothing checks the arguments, so a call the model leaves
    malformed is streamed as far as it got (the non-streamed answer returns such text as
    content); under a grammar every call is well formed.
    """

    def __init__(self, limit: int | None = None) -> None:
        self._limit = limit
        self._text = ""
        self._pos = 0  # how much of the text has been turned into deltas
        self._state = "content"  # content | head | arguments | between | done
        self._sent = 0  # argument characters of the current call already sent
        self.calls = 0

    def feed(self, text: str, final: bool) -> tuple[str, list[dict]]:
        """(content delta, tool-call deltas) for `text`, the output's next piece.

        A call's first delta goes out alone (its arguments follow with the next piece),
        and the deltas of one piece carry each call's index once, as OpenAI's chunks do
        (the openai client's stream helper counts on both); only the last piece, with
        nothing after it, may carry a call's head and its arguments together."""
        self._text += text
        content, deltas = "", []
        while True:
            before = (self._state, self._pos)
            if self._state == "content":
                content += self._content(final)
            elif self._state == "head":
                deltas += self._head(final)
                if deltas and not final:
                    return content, deltas
            elif self._state == "arguments":
                deltas += self._arguments(final)
            elif self._state == "between":
                self._between()
            if (self._state, self._pos) == before:
                return content, _merged(deltas)

    def _content(self, final: bool) -> str:
        rest = self._text[self._pos :]
        at = rest.find(_OPEN)
        if at >= 0:
            self._pos += at + len(_OPEN)
            self._state = "head"
            return rest[:at]
        keep = 0 if final else _partial(rest, _OPEN)
        self._pos += len(rest) - keep
        return rest[: len(rest) - keep]

    def _head(self, final: bool) -> list[dict]:
        rest = self._text[self._pos :]
        match = _HEAD.match(rest)
        if match:
            self._pos += match.end()
            self._state, self._sent = "arguments", 0
            return [self._first(json.loads(match.group(1)))]
        for close in _closes(rest):
            _, calls = parse_tool_calls(_OPEN + rest[:close] + _CLOSE)
            if calls:
                self._pos += close + len(_CLOSE)
                break
        else:
            if not final:
                return []
            self._pos += len(rest)
            _, calls = parse_tool_calls(_OPEN + rest)
        self._state = "between"
        if not calls:
            return []
        call = calls[0]["function"]
        index = self.calls
        return [
            self._first(call["name"]),
            {"index": index, "function": {"arguments": call["arguments"]}},
        ]

    def _arguments(self, final: bool) -> list[dict]:
        rest = self._text[self._pos :]
        close = _closing(rest)
        if close is None and final and (k := _partial(rest, _CLOSE)):
            close = _closing(rest[:-k] + _CLOSE)  # a cut inside the closing tag
        if close is not None or final:
            body = rest if close is None else rest[:close]
            stripped = body.rstrip()
            arguments = stripped[:-1] if stripped.endswith("}") else stripped
            self._pos += len(rest) if close is None else min(close + len(_CLOSE), len(rest))
            self._state = "between"
        else:
            brace = rest.rfind("}")
            arguments = rest if brace < 0 else rest[:brace]
        fragment = arguments[self._sent :]
        self._sent = max(self._sent, len(arguments))
        if not fragment:
            return []
        return [{"index": self.calls - 1, "function": {"arguments": fragment}}]

    def _between(self) -> None:
        if self._limit is not None and self.calls >= self._limit:
            self._state, self._pos = "done", len(self._text)
            return
        rest = self._text[self._pos :]
        at = rest.find(_OPEN)
        if at >= 0:
            self._pos += at + len(_OPEN)
            self._state = "head"
        else:
            self._pos += len(rest) - _partial(rest, _OPEN)

    def _first(self, name: str) -> JsonObject:
        self.calls += 1
        return {
            "index": self.calls - 1,
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }


def _merged(deltas: list[dict]) -> list[dict]:
    """One delta per call index: later argument fragments appended to the first."""
    out: dict[int, dict] = {}
    for d in deltas:
        if d["index"] in out:
            function = out[d["index"]]["function"]
            function["arguments"] += d["function"]["arguments"]
        else:
            out[d["index"]] = {**d, "function": dict(d["function"])}
    return list(out.values())


def _closes(text: str):
    """Where each `</tool_call>` in `text` starts."""
    at = text.find(_CLOSE)
    while at >= 0:
        yield at
        at = text.find(_CLOSE, at + 1)


def _closing(arguments: str) -> int | None:
    """Where the `</tool_call>` that ends a call's arguments starts: the first one after
    valid JSON and the call's closing brace (one inside an argument string is not it)."""
    for close in _closes(arguments):
        stripped = arguments[:close].rstrip()
        if stripped.endswith("}"):
            try:
                json.loads(stripped[:-1])
            except json.JSONDecodeError:
                continue
            return close
    return None


def _partial(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
