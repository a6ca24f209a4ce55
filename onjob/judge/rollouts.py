"""`Rollout`: one member of a group as scorers see it, and the prefix members share.

A turn-group member is one completion of a logged request: the request's messages
followed by that completion's assistant message. A trajectory-group member is a
whole conversation: its last request's messages followed by the last answer.
Reward functions receive a `Rollout`; RULER renders the members after their common
prefix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..collector.trajectories import text_of
from ..protocol import JsonObject

if TYPE_CHECKING:
    from .tables import MemberRow


@dataclass(frozen=True)
class Rollout:
    member_id: str
    messages: list[dict]  # the whole conversation, ending with this member's answer
    kind: str = "turn"  # turn | trajectory
    scenario: str | None = None  # the scenario key
    metadata: dict = field(default_factory=dict)  # the request's `metadata`
    tools: list[dict] | None = None
    exchange_id: str | None = None
    trajectory_id: str | None = None
    finish_reason: str | None = None  # of this member's answer: `length` = cut at its cap

    @property
    def completion(self) -> JsonObject:
        """The assistant message this member is judged on. A dict, as each of `messages`
        is: users' reward functions read it in OpenAI's message shape (`["content"]`)."""
        return self.messages[-1]

    @property
    def prompt(self) -> list[dict]:
        return self.messages[:-1]

    @property
    def text(self) -> str:
        return text_of(self.completion.get("content"))

    @property
    def tool_calls(self) -> list[dict]:
        return list(self.completion.get("tool_calls") or ())


def from_row(row: MemberRow) -> Rollout:
    """A member from the judge's query: its member row joined with its exchange."""
    request = json_value(row.request) or {}
    response = json_value(row.response) or {}
    choices = {c.get("index", i): c for i, c in enumerate(response.get("choices") or ())}
    choice = choices.get(row.choice) or {}
    message = choice.get("message") or {}
    # The answer as the conversation would carry it on: role, content, tool calls.
    answer = {"role": message.get("role") or "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        answer["tool_calls"] = message["tool_calls"]
    return Rollout(
        member_id=row.member_id,
        messages=[*request.get("messages", []), answer],
        kind=row.kind,
        scenario=row.scenario_key,
        metadata=request.get("metadata") or {},
        tools=request.get("tools"),
        exchange_id=row.exchange_id,
        trajectory_id=row.trajectory_id,
        finish_reason=choice.get("finish_reason"),
    )


def common_prefix(rollouts: list[Rollout]) -> int:
    """How many leading messages every member shares (never its own answer)."""
    if not rollouts:
        return 0
    shortest = min(len(r.messages) for r in rollouts) - 1
    n = 0
    while n < shortest and all(
        _canonical(r.messages[n]) == _canonical(rollouts[0].messages[n]) for r in rollouts
    ):
        n += 1
    return n


def content_hash(messages: list[dict]) -> str:
    return hashlib.sha256(_canonical(messages).encode()).hexdigest()[:32]


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def json_value(value):
    """A JSON column as DuckDB returns it (text) parsed; anything else as it is."""
    return json.loads(value) if isinstance(value, str | bytes) else value
