"""Stitching exchanges into trajectories, and keying their scenarios.

A request continues a trajectory when its messages start with an earlier request's
messages plus the reply it got, or plus some of that reply's tool calls (`alone()`: a
client hands back the calls it ran, the engine's call ids with them, and may leave the
others and the text out, as a Responses client picking `function_call` items does);
messages are hashed as a chain. The proxy computes each request's `Keys` (`keys()`) and
its replies' hashes (`continuations()`), which travel in the spool line, so any number
of proxy processes can serve one conversation; the one loader places the lines in
arrival order (`Stitcher.place_keys`). An edited history, a retry or a fork starts a new
trajectory: a trajectory is one linear conversation. Tenants stay apart: trajectories
and scenarios are one API key's (`scoped()`, `scenario_id()`). docs/collector.md,
"Trajectories and scenarios", says more.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from ..protocol import JsonObject
from ..protocol.chat import arguments_of
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
    api_key_id: str | None = None  # whose conversation: its continuations are that key's


def text_of(content: Any) -> str:
    """OpenAI message content (a string or a list of parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


_encode = msgspec.json.Encoder().encode


def _plain(value: object) -> bool:
    """A string msgspec writes exactly as `json.dumps` does (ASCII, no DEL), or None."""
    return value is None or (isinstance(value, str) and value.isascii() and "\x7f" not in value)


def canonical(message: dict) -> bytes:
    """A message as the stitcher compares it: what a client may re-serialise is normalised.

    The bytes are `json.dumps(..., sort_keys=True, separators=(",", ":"))`'s (the hashes of
    them are in the database): msgspec writes the same bytes, ~15x faster, for a message
    with no tool calls whose strings are plain ASCII, the common case, and once per
    message of every request."""
    calls = [
        [
            c.get("id"),
            (c.get("function") or {}).get("name"),
            arguments_of((c.get("function") or {}).get("arguments")),
        ]
        for c in message.get("tool_calls") or []
    ]
    role, text, call_id = (
        message.get("role"),
        text_of(message.get("content")),
        message.get("tool_call_id"),
    )
    value = [role, text, calls, call_id]
    if not calls and _plain(role) and _plain(text) and _plain(call_id):
        return _encode(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def chain(messages: list[dict]) -> list[str]:
    """hashes[k] covers messages[0..k]."""
    out, h = [], b""
    for m in messages:
        h = hashlib.blake2b(h + canonical(m), digest_size=16).digest()
        out.append(h.hex())
    return out


def extend(prefix_hash: str, message: dict) -> str:
    return hashlib.blake2b(
        bytes.fromhex(prefix_hash) + canonical(message), digest_size=16
    ).hexdigest()


def scoped(trajectory_id: str, api_key_id: str | None) -> str:
    """The stored id of the conversation a client names: the name itself on a server with
    no API keys, else `<key id>:<name>`, so no key can write into (or point feedback at)
    another key's conversation by naming it, and nothing in the answer tells that the
    other exists. Deterministic: every replica and restart maps a name the same way."""
    return trajectory_id if api_key_id is None else f"{api_key_id}:{trajectory_id}"


def scenario_key(messages: list[dict], explicit: str | None) -> tuple[str, str]:
    """(key, how keyed): the name the client gave, or a hash of the system prompt and the
    first user message."""
    if explicit:
        return explicit, EXPLICIT
    system = next(
        (text_of(m.get("content")) for m in messages if m.get("role") in ("system", "developer")),
        "",
    )
    user = next((text_of(m.get("content")) for m in messages if m.get("role") == "user"), "")
    return hashlib.blake2b(json.dumps([system, user]).encode(), digest_size=8).hexdigest(), DERIVED


def scenario_id(key: str, keyed: str, tenant: str | None = None) -> str:
    """A scenario's id. The `tenant` (the API key id; None on a server with no keys) is part
    of the id, not of the key: two keys' scenarios of the same key are two rows, while
    rubrics (`judge.rubrics`, by key) still apply to every key's scenario of that name."""
    scope = f"{keyed}\0{key}" if tenant is None else f"{keyed}\0{key}\0{tenant}"
    return "scn_" + hashlib.blake2b(scope.encode(), digest_size=8).hexdigest()


MAX_CANDIDATES = 8  # assistant messages, from the latest, a request may continue from


def alone(call: JsonObject) -> JsonObject:
    """A tool call as the assistant message holding it alone, with no text: how a reply
    is keyed for a client that hands back only some of its calls, or the calls without
    the reply's text. A Responses client sends an answer back as separate output items
    and often keeps only the `function_call`s it ran (`[o for o in r.output if o.type ==
    "function_call"][0]`), where a chat client echoes the whole message. The call's id is
    the engine's, drawn for that answer, so the call still names the reply it came from."""
    return {"role": "assistant", "tool_calls": [call]}


def _alone_key(prefix_hash: str, message: dict, whole: str) -> str | None:
    """The key of `message`'s first tool call alone after `prefix_hash`, when it has calls
    and that is not the message's own hash (a reply of one call and no text)."""
    calls = message.get("tool_calls")
    if not calls or not isinstance(calls, list):
        return None
    h = extend(prefix_hash, alone(calls[0]))
    return None if h == whole else h


@dataclass(frozen=True)
class Keys:
    """What the proxy computes of a request for stitching (in the spool line)."""

    # Per assistant message, latest first: the chain hash ending at it, then (when it
    # holds tool calls) the one ending at its first call `alone()`.
    candidates: list[str]
    prefix_hash: str  # chain hash of all the messages ("" for none)
    opening: str  # chain hash up to the first assistant message: the conversation's
    scenario_key: str
    scenario_keyed: str


def keys(messages: list[dict], scenario: str | None = None) -> Keys:
    hashes = chain(messages)
    candidates: list[str] = []
    seen = 0
    for j in range(len(messages) - 2, -1, -1):  # a last assistant message is no reply yet
        message = messages[j]
        if message.get("role") != "assistant":
            continue
        candidates.append(hashes[j])
        loose = _alone_key(hashes[j - 1] if j else "", message, hashes[j])
        if loose is not None:
            candidates.append(loose)
        seen += 1
        if seen == MAX_CANDIDATES:
            break
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if not hashes:
        opening = ""
    elif first is None:
        opening = hashes[-1]
    else:
        opening = hashes[max(first - 1, 0)]
    return Keys(
        candidates, hashes[-1] if hashes else "", opening, *scenario_key(messages, scenario)
    )


def continuations(prefix_hash: str, replies: list[dict]) -> list[str]:
    """The hashes a next turn continuing each reply will carry among its candidates: each
    reply's own (first, in the replies' order: `[0]` is the first choice's), then each of
    its tool calls `alone()`."""
    whole = [extend(prefix_hash, reply) for reply in replies]
    loose = [
        h
        for reply in replies
        for call in reply.get("tool_calls") or ()
        if (h := extend(prefix_hash, alone(call))) not in whole
    ]
    return whole + loose


@dataclass
class _Trajectory:
    latest_turn: int
    scenario: tuple[str, str, str]


_TRAJECTORIES, _CONTINUATIONS = 0, 1  # `Stitcher._kept`'s two halves


def _slot(api_key_id: str | None, h: str) -> str:
    """The index's key for a continuation: the hash within its API key's own space."""
    return h if api_key_id is None else f"{api_key_id}\0{h}"


class Stitcher:
    """The in-memory index: (API key, continuation hash) -> (trajectory, turn). Bounded (LRU).

    A derived or named scenario is one per API key (`scenario_id`)."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._continuations: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._trajectories: OrderedDict[str, _Trajectory] = OrderedDict()
        # While `staged`: each entry's value before the stage first changed it (None:
        # absent), per index.
        self._kept: tuple[dict[str, _Trajectory | None], dict[str, tuple | None]] | None = None

    @contextmanager
    def staged(self) -> Iterator[None]:
        """Placements that stand only if the block ends without an exception: a load that
        fails (a commit refused, a line DuckDB cannot read) leaves the index as it found
        it, so its lines are placed afresh when they load again. Placed twice, a turn
        would find its own first placement as the trajectory's latest turn and fork."""
        self._kept = ({}, {})
        try:
            yield
        except BaseException:
            indexes = (self._trajectories, self._continuations)
            for index, kept in zip(indexes, self._kept, strict=True):
                for key, value in kept.items():
                    if value is None:
                        index.pop(key, None)
                    else:
                        index[key] = value
            raise
        finally:
            self._kept = None

    def _keep(self, which: int, index: OrderedDict, key: str) -> None:
        """While staged, note an entry's value before its first change (a copy: a
        trajectory's state changes in place)."""
        if self._kept is not None and key not in self._kept[which]:
            value = index.get(key)
            self._kept[which][key] = replace(value) if isinstance(value, _Trajectory) else value

    def _trim(self, which: int, index: OrderedDict) -> None:
        while len(index) > self.capacity:
            self._keep(which, index, next(iter(index)))
            index.popitem(last=False)

    def place(
        self,
        messages: list[dict],
        *,
        trajectory_id: str | None = None,
        scenario: str | None = None,
        api_key_id: str | None = None,
        after_turn: int | None = None,
    ) -> Placement:
        """`place_keys` of the request's messages (the proxy's and the loader's halves in
        one: tests, benches)."""
        if trajectory_id and after_turn is None:
            trajectory_id = scoped(trajectory_id, api_key_id)
        return self.place_keys(
            keys(messages, scenario),
            trajectory_id=trajectory_id,
            api_key_id=api_key_id,
            after_turn=after_turn,
        )

    def place_keys(
        self,
        k: Keys,
        *,
        trajectory_id: str | None = None,
        api_key_id: str | None = None,
        after_turn: int | None = None,
    ) -> Placement:
        """Which trajectory and turn a request belongs to. `trajectory_id`: the stored id of
        a conversation the client named (already `scoped()`); with `after_turn` (a chain of
        Responses API calls) the request continues that turn of it, or, when the
        conversation has gone on since (a second answer to the same turn), forks a new one."""
        fresh = (
            scenario_id(k.scenario_key, k.scenario_keyed, api_key_id),
            k.scenario_key,
            k.scenario_keyed,
        )
        if trajectory_id and after_turn is not None:
            known = self._trajectories.get(trajectory_id)
            if known is not None and known.latest_turn != after_turn:
                return self._placed(new_id("traj_"), 0, known.scenario, k, api_key_id)
            scen = known.scenario if known else fresh
            return self._placed(trajectory_id, after_turn + 1, scen, k, api_key_id)
        if trajectory_id:
            known = self._trajectories.get(trajectory_id)
            turn = known.latest_turn + 1 if known else 0
            return self._placed(
                trajectory_id, turn, known.scenario if known else fresh, k, api_key_id
            )
        for h in k.candidates:
            hit = self._continuations.get(_slot(api_key_id, h))
            if hit is None:
                continue
            traj, turn = hit
            known = self._trajectories.get(traj)
            if known is not None and known.latest_turn == turn:
                return self._placed(traj, turn + 1, known.scenario, k, api_key_id)
            break  # continues an older turn: a fork, so a new trajectory
        return self._placed(new_id("traj_"), 0, fresh, k, api_key_id)

    def _placed(
        self,
        traj: str,
        turn: int,
        scen: tuple[str, str, str],
        k: Keys,
        api_key_id: str | None,
    ) -> Placement:
        self._remember_trajectory(traj, _Trajectory(turn, scen))
        return Placement(traj, turn, *scen, prefix_hash=k.prefix_hash, api_key_id=api_key_id)

    def knows(self, trajectory_id: str, turn: int | None = None) -> bool:
        """Whether this index holds the trajectory, and `turn` of it when given (a chain's
        previous turn: one placed by another process since is not held yet)."""
        known = self._trajectories.get(trajectory_id)
        return known is not None and (turn is None or known.latest_turn >= turn)

    def continues(self, api_key_id: str | None, candidates: list[str]) -> bool:
        """Whether this index holds the reply a request's latest assistant message is (its
        first candidate), in a trajectory it knows. A request whose latest reply it does not
        hold may still continue an earlier one it does; but where several processes place
        turns, that latest reply may be a turn another placed (a lake's writers)."""
        hit = self._continuations.get(_slot(api_key_id, candidates[0])) if candidates else None
        return hit is not None and hit[0] in self._trajectories

    def register(self, placement: Placement, hashes: list[str]) -> None:
        """The answered exchange's replies (`continuations()`) are what its next turn continues."""
        for h in hashes:
            slot = _slot(placement.api_key_id, h)
            self._keep(_CONTINUATIONS, self._continuations, slot)
            self._continuations[slot] = (placement.trajectory_id, placement.turn)
            self._continuations.move_to_end(slot)
        self._trim(_CONTINUATIONS, self._continuations)

    def record_replies(self, placement: Placement, replies: list[dict]) -> list[str]:
        """`register` the replies the client received; return their hashes."""
        hashes = continuations(placement.prefix_hash, replies)
        self.register(placement, hashes)
        return hashes

    def release(self, placement: Placement) -> None:
        """The exchange failed: its turn never happened, so a retry continues the trajectory."""
        known = self._trajectories.get(placement.trajectory_id)
        if known is not None and known.latest_turn == placement.turn:
            self._keep(_TRAJECTORIES, self._trajectories, placement.trajectory_id)
            if placement.turn == 0:
                del self._trajectories[placement.trajectory_id]
            else:
                known.latest_turn -= 1

    def warm(self, rows: list[tuple]) -> None:
        """Reload after a restart from (trajectory, turn, scenario id, key, keyed, hashes[,
        API key id]) rows; within a stage too (what is committed stays learnt)."""
        kept, self._kept = self._kept, None
        try:
            self._warm(rows)
        finally:
            self._kept = kept

    def _warm(self, rows: list[tuple]) -> None:
        for traj, turn, scen_id, key, keyed, hashes, *tenant in rows:
            api_key_id = tenant[0] if tenant else None
            known = self._trajectories.get(traj)
            if known is None or known.latest_turn <= turn:
                self._remember_trajectory(traj, _Trajectory(turn, (scen_id, key, keyed)))
            for h in hashes or []:
                self._continuations[_slot(api_key_id, h)] = (traj, turn)
        self._trim(_CONTINUATIONS, self._continuations)

    def forget(self, trajectory_ids: list[str]) -> None:
        """Deleted conversations: a request continuing one starts a new trajectory."""
        gone = set(trajectory_ids)
        if not gone:
            return
        for traj in gone:
            self._trajectories.pop(traj, None)
        for slot in [s for s, (traj, _) in self._continuations.items() if traj in gone]:
            del self._continuations[slot]

    def _remember_trajectory(self, traj: str, state: _Trajectory) -> None:
        self._keep(_TRAJECTORIES, self._trajectories, traj)
        self._trajectories[traj] = state
        self._trajectories.move_to_end(traj)
        self._trim(_TRAJECTORIES, self._trajectories)
