"""Stitching exchanges into trajectories, and keying their scenarios.

A request continues a trajectory when its messages start with an earlier
request's messages plus the reply that request got (then new messages follow).
Messages are hashed as a chain (the hash of message k covers messages 1..k), so
a request of n messages is matched against every earlier (messages + reply)
with n lookups in an in-memory index, on the hot path, before the request is
forwarded (the canary arm depends on the trajectory).

A client that edits history produces a chain that matches nothing and starts a
new trajectory; one that continues an older turn of a trajectory (a retry or a
fork) also starts a new one, so a trajectory is always one linear conversation.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .ids import new_id

DERIVED = "derived"
EXPLICIT = "explicit"


@dataclass(frozen=True)
class Placement:
    trajectory_id: str
    turn: int
    scenario_id: str
    scenario_key: str
    scenario_keyed: str
    prefix_hash: str  # chain hash of the request's messages


def text_of(content: Any) -> str:
    """OpenAI message content (a string or a list of parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, RecursionError):  # not JSON, or too deep to normalise
            return raw
    return raw


def canonical(message: dict) -> str:
    """A message as the stitcher compares it: what a client may re-serialise is normalised."""
    calls = [
        [
            c.get("id"),
            (c.get("function") or {}).get("name"),
            _arguments((c.get("function") or {}).get("arguments")),
        ]
        for c in message.get("tool_calls") or []
    ]
    return json.dumps(
        [message.get("role"), text_of(message.get("content")), calls, message.get("tool_call_id")],
        sort_keys=True,
        separators=(",", ":"),
    )


def chain(messages: list[dict]) -> list[str]:
    """hashes[k] covers messages[0..k]."""
    out, h = [], b""
    for m in messages:
        h = hashlib.blake2b(h + canonical(m).encode(), digest_size=16).digest()
        out.append(h.hex())
    return out


def extend(prefix_hash: str, message: dict) -> str:
    return hashlib.blake2b(
        bytes.fromhex(prefix_hash) + canonical(message).encode(), digest_size=16
    ).hexdigest()


def scenario_of(messages: list[dict], explicit: str | None) -> tuple[str, str, str]:
    """(scenario id, key, how keyed). Derived keys hash the system prompt and first user message."""
    if explicit:
        key, keyed = explicit, EXPLICIT
    else:
        system = next(
            (
                text_of(m.get("content"))
                for m in messages
                if m.get("role") in ("system", "developer")
            ),
            "",
        )
        user = next((text_of(m.get("content")) for m in messages if m.get("role") == "user"), "")
        key = hashlib.blake2b(json.dumps([system, user]).encode(), digest_size=8).hexdigest()
        keyed = DERIVED
    digest = hashlib.blake2b(f"{keyed}\0{key}".encode(), digest_size=8).hexdigest()
    return f"scn_{digest}", key, keyed


@dataclass
class _Trajectory:
    latest_turn: int
    scenario: tuple[str, str, str]


class Stitcher:
    """The in-memory index: continuation hash -> (trajectory, turn). Bounded (LRU)."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._continuations: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._trajectories: OrderedDict[str, _Trajectory] = OrderedDict()

    def place(
        self,
        messages: list[dict],
        *,
        trajectory_id: str | None = None,
        scenario: str | None = None,
        after_turn: int | None = None,
    ) -> Placement:
        """`trajectory_id` names the conversation; with `after_turn` (a chain of Responses
        API calls) the request continues that turn of it, or, when the conversation has
        gone on since (a second answer to the same turn), forks a new one."""
        hashes = chain(messages)
        if trajectory_id and after_turn is not None:
            known = self._trajectories.get(trajectory_id)
            if known is not None and known.latest_turn != after_turn:
                return self._placed(new_id("traj_"), 0, known.scenario, hashes)
            scen = known.scenario if known else scenario_of(messages, scenario)
            return self._placed(trajectory_id, after_turn + 1, scen, hashes)
        if trajectory_id:
            known = self._trajectories.get(trajectory_id)
            turn = known.latest_turn + 1 if known else 0
            scen = known.scenario if known else scenario_of(messages, scenario)
            return self._placed(trajectory_id, turn, scen, hashes)
        for k in range(len(messages) - 1, 0, -1):
            if messages[k - 1].get("role") != "assistant":
                continue
            hit = self._continuations.get(hashes[k - 1])
            if hit is None:
                continue
            traj, turn = hit
            known = self._trajectories.get(traj)
            if known is not None and known.latest_turn == turn:
                return self._placed(traj, turn + 1, known.scenario, hashes)
            break  # continues an older turn: a fork, so a new trajectory
        return self._placed(new_id("traj_"), 0, scenario_of(messages, scenario), hashes)

    def _placed(
        self, traj: str, turn: int, scen: tuple[str, str, str], hashes: list[str]
    ) -> Placement:
        self._remember_trajectory(traj, _Trajectory(turn, scen))
        return Placement(traj, turn, *scen, prefix_hash=hashes[-1] if hashes else "")

    def record_replies(self, placement: Placement, replies: list[dict]) -> list[str]:
        """Register each reply the client received as a possible continuation; return the hashes."""
        out = []
        for reply in replies:
            h = extend(placement.prefix_hash, reply)
            self._continuations[h] = (placement.trajectory_id, placement.turn)
            self._continuations.move_to_end(h)
            out.append(h)
        while len(self._continuations) > self.capacity:
            self._continuations.popitem(last=False)
        return out

    def release(self, placement: Placement) -> None:
        """The exchange failed: its turn never happened, so a retry continues the trajectory."""
        known = self._trajectories.get(placement.trajectory_id)
        if known is not None and known.latest_turn == placement.turn:
            if placement.turn == 0:
                del self._trajectories[placement.trajectory_id]
            else:
                known.latest_turn -= 1

    def warm(self, rows: list[tuple[str, int, str, str, str, list[str]]]) -> None:
        """Reload after a restart from (trajectory, turn, scenario id, key, keyed, hashes) rows."""
        for traj, turn, scen_id, key, keyed, hashes in rows:
            known = self._trajectories.get(traj)
            if known is None or known.latest_turn <= turn:
                self._remember_trajectory(traj, _Trajectory(turn, (scen_id, key, keyed)))
            for h in hashes or []:
                self._continuations[h] = (traj, turn)
        while len(self._continuations) > self.capacity:
            self._continuations.popitem(last=False)

    def _remember_trajectory(self, traj: str, state: _Trajectory) -> None:
        self._trajectories[traj] = state
        self._trajectories.move_to_end(traj)
        while len(self._trajectories) > self.capacity:
            self._trajectories.popitem(last=False)
