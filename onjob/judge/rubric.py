"""What the RULER judge is told: the default rubric and the prompt around a group.

The members' common prefix goes once, as context; each member is a numbered
candidate holding only what follows the prefix. The judge answers with one score
in [0, 1] and an explanation per candidate, as JSON.
"""

from __future__ import annotations

import json

from ..collector.trajectories import text_of

DEFAULT_RUBRIC = """\
- A candidate that achieves what the user asked for should score much higher than one \
that does not.
- Correct, specific and complete beats vague, wrong or partial; a correct tool call with \
the right arguments counts as progress.
- Among candidates that succeed, the more direct and efficient one scores higher.
- Give partial credit for real progress towards the goal.
- If one candidate is only slightly better than another, make the difference in scores \
small; if it is much better, make it large."""

SYSTEM = """\
You are judging several candidate continuations of the same conversation with an AI \
agent. All candidates start from the context shown. Consider each candidate and give it \
a score between 0 and 1, using your best judgement of what the agent is trying to achieve.

Grading standards:
{rubric}

Answer with JSON only, in exactly this shape, one entry per candidate id:
{{"scores": [{{"id": "1", "explanation": "<one or two sentences>", "score": 0.5}}]}}"""


def render_message(message: dict) -> str:
    role = message.get("role", "?")
    lines = []
    content = text_of(message.get("content"))
    if role == "tool":
        lines.append(f"[tool result] {content}")
    elif content:
        lines.append(f"[{role}] {content}")
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        lines.append(f"[{role} calls tool] {fn.get('name')}({fn.get('arguments', '')})")
    if not lines:
        lines.append(f"[{role}] (empty)")
    return "\n".join(lines)


def render_tools(tools: list[dict] | None) -> str:
    out = []
    for tool in tools or ():
        fn = tool.get("function") or {}
        params = json.dumps(fn.get("parameters") or {}, separators=(",", ":"))
        out.append(f"- {fn.get('name')}{params}: {fn.get('description') or ''}".rstrip(": "))
    return "\n".join(out)


def prompt(
    rubric: str, context: list[dict], tools: list[dict] | None, candidates: list[list[dict]]
) -> list[dict]:
    """The judge's messages: candidate i (1-based) is `candidates[i-1]`."""
    parts = ["<context>", "\n".join(map(render_message, context)) or "(none)", "</context>"]
    if tools:
        parts += ["<tools>", render_tools(tools), "</tools>"]
    for i, messages in enumerate(candidates, 1):
        parts += [f'<candidate id="{i}">', "\n".join(map(render_message, messages)), "</candidate>"]
    return [
        {"role": "system", "content": SYSTEM.format(rubric=rubric)},
        {"role": "user", "content": "\n".join(parts)},
    ]
