"""Linear storage: a later turn stores only what is new, and the full request is rebuilt
on read.

Each turn re-sends every earlier message and token id, so a conversation stored whole
costs O(n²). A turn that continues an answered exchange (`parent_id`) stores only the
messages, large top-level fields and prompt token ids past those equal to its parent's
(`messages_kept`, `request_kept`, `prompt_kept`); a first turn is stored the same way
against an *opening* (`openings`, `opn_...`): the start its conversation shares with
others of its API key, system prompt and tools. `exchanges_full` (`schema.py`) rebuilds
every row exactly. The decision is made where the record is made (`Lineage.delta`, in
the proxy), with bounded memory: a conversation it no longer holds is stored whole, so
nothing is lost, only space. docs/collector.md, "Linear storage", has the details.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from ..protocol import JsonObject
from .records import OpeningRecord
from .trajectories import Keys

_encode = msgspec.json.Encoder().encode


def digest(message: object) -> bytes:
    """A message's identity for exact equality: its JSON encoding as parsed (key order kept),
    hashed (16 bytes: no collision in practice, and far smaller than the message)."""
    return hashlib.blake2b(_encode(message), digest_size=16).digest()


LARGE_FIELD = 256  # bytes of JSON: a top-level field this large is stored once per conversation


def fields(request: JsonObject) -> Mapping[str, bytes]:
    """Digests of a request's large top-level fields other than `messages` (`tools`, a JSON
    schema): a turn that sends the same leaves them out. Small ones are not worth a name."""
    out = {}
    for key, value in request.items():
        if key != "messages" and isinstance(value, dict | list):
            encoded = _encode(value)
            if len(encoded) >= LARGE_FIELD:
                out[key] = hashlib.blake2b(encoded, digest_size=16).digest()
    return out


@dataclass(frozen=True)
class Delta:
    """What a row stores relative to its parent (`parent_id` None: stored whole)."""

    parent_id: str | None = None
    messages_kept: int | None = None
    prompt_kept: int | None = None
    request_kept: list[str] | None = None  # large top-level fields equal to the parent's


WHOLE = Delta()


@dataclass
class _Last:
    exchange_id: str
    digests: list[bytes]
    fields: Mapping[str, bytes]  # digests of the large top-level fields (`fields()`)
    tokens: array | None  # prompt + first completion; None: the engine gave no token ids


def common_prefix(a: array, b: array) -> int:
    """The length of the common prefix of two int arrays (C comparisons, log n of them)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _slot(api_key_id: str | None, h: str) -> str:
    return h if api_key_id is None else f"{api_key_id}\0{h}"


LEADING_ROLES = ("system", "developer")  # the messages an opening may hold


def leading(messages: list) -> int:
    """How many messages at the start are system or developer messages."""
    n = 0
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in LEADING_ROLES:
            break
        n += 1
    return n


@dataclass
class _Seed:
    """Conversations that start alike: the first one's prompt ids until a second one
    comes (then `opening` is made from what the two prompts share)."""

    tokens: array | None
    opening: OpeningRecord | None = None
    opening_tokens: array | None = None

    @property
    def held(self) -> int:
        return len(self.tokens or ()) + len(self.opening_tokens or ())


class Lineage:
    """Per live conversation: its last answered exchange, under the continuation hash its next
    turn will carry. Bounded LRU: at most `capacity` conversations and `max_tokens` token
    ids held (4 bytes each)."""

    OPENINGS = 4096  # starts held (LRU), within a quarter of `max_tokens`

    def __init__(
        self, capacity: int = 200_000, max_tokens: int = 8_000_000, salt: bytes = b""
    ) -> None:
        self.capacity = capacity
        self.max_tokens = max_tokens
        # In an opening's id: a lake's writers each make their own openings (two writers
        # inserting one id at once would leave it twice: a lake has no key to refuse it).
        self.salt = salt
        self._last: OrderedDict[str, _Last] = OrderedDict()
        self._tokens = 0
        self._seeds: OrderedDict[bytes, _Seed] = OrderedDict()
        self._seed_tokens = 0
        self.openings: dict[str, OpeningRecord] = {}  # by id: what `Collector.log` spools

    def delta(
        self,
        candidates: list[str],
        api_key_id: str | None,
        digests: list[bytes],
        large: Mapping[str, bytes],
        prompt_token_ids: list[int] | None,
    ) -> tuple[Delta, array | None, str | None]:
        """How a request whose stitching `candidates` are these is stored: against the
        answered exchange it continues when that is held, else whole. Also returns the
        prompt ids as an array and the parent's slot (for `remember`)."""
        prompt = array("i", prompt_token_ids) if prompt_token_ids is not None else None
        for h in candidates:
            slot = _slot(api_key_id, h)
            last = self._last.get(slot)
            if last is not None:
                break
        else:
            return WHOLE, prompt, None
        kept = 0
        for mine, theirs in zip(digests, last.digests, strict=False):
            if mine != theirs:
                break
            kept += 1
        tokens = 0
        if prompt is not None and last.tokens is not None:
            tokens = common_prefix(prompt, last.tokens)
        same = [k for k, d in large.items() if last.fields.get(k) == d]
        return Delta(last.exchange_id, kept, tokens, same or None), prompt, slot

    def remember(
        self,
        continuation: str,
        api_key_id: str | None,
        exchange_id: str,
        digests: list[bytes],
        large: Mapping[str, bytes],
        prompt: array | None,
        completion_token_ids: list[int] | None,
        parent: str | None = None,
    ) -> None:
        """An answered exchange is its conversation's last (what its next turn, continuing
        `continuation`, stores against); its `parent` slot is no longer."""
        tokens = None
        if prompt is not None:
            tokens = array("i", prompt)
            tokens.extend(completion_token_ids or ())
        if parent is not None:
            self._drop(parent)
        slot = _slot(api_key_id, continuation)
        self._drop(slot)
        self._last[slot] = _Last(exchange_id, digests, large, tokens)
        self._tokens += len(tokens) if tokens is not None else 0
        while self._last and (len(self._last) > self.capacity or self._tokens > self.max_tokens):
            self._drop(next(iter(self._last)))

    def opening(
        self,
        api_key_id: str | None,
        request: dict,
        digests: list[bytes],
        large: Mapping[str, bytes],
        prompt: array | None,
    ) -> Delta:
        """How a request with no parent held is stored: against the opening of the
        conversations that start as it does (its leading system messages and large fields,
        within its API key), else whole (the first such conversation seeds the opening)."""
        lead = leading(request["messages"])
        if not lead and not large:
            return WHOLE
        parts = [(api_key_id or "").encode(), str(lead).encode(), *digests[:lead]]
        parts += [k.encode() + d for k, d in sorted(large.items())]
        key = hashlib.blake2b(b"\0".join(parts), digest_size=16).digest()
        seed = self._seeds.get(key)
        if seed is None:
            self._hold(key, _Seed(array("i", prompt) if prompt is not None else None))
            return WHOLE
        self._seeds.move_to_end(key)
        if seed.opening is None:
            self._open(key, seed, api_key_id, request, lead, large, prompt)
        kept = 0
        if prompt is not None and seed.opening_tokens is not None:
            kept = common_prefix(prompt, seed.opening_tokens)
        return Delta(seed.opening.id, lead, kept, sorted(large) or None)

    def _open(
        self,
        key: bytes,
        seed: _Seed,
        api_key_id: str | None,
        request: dict,
        lead: int,
        large: Mapping[str, bytes],
        prompt: array | None,
    ) -> None:
        """A second conversation starts as the seed's first did: the opening is what the
        two share (the leading messages and large fields, equal by `key`; the prompt ids
        both began with), content-addressed."""
        shared = None
        if prompt is not None and seed.tokens is not None:
            shared = prompt[: common_prefix(prompt, seed.tokens)]
        raw = _encode({"messages": request["messages"][:lead], **{k: request[k] for k in large}})
        ident = hashlib.blake2b(self.salt + key + raw, digest_size=16)
        if shared is not None:
            ident.update(shared.tobytes())
        self._seed_tokens -= seed.held
        seed.opening = OpeningRecord(
            id="opn_" + ident.hexdigest(),
            ts=0.0,  # each spooled copy takes its exchange's
            api_key_id=api_key_id,
            request=msgspec.Raw(raw),
            prompt_token_ids=shared.tolist() if shared is not None else None,
        )
        seed.tokens, seed.opening_tokens = None, shared
        self._seed_tokens += seed.held
        self.openings[seed.opening.id] = seed.opening

    def _hold(self, key: bytes, seed: _Seed) -> None:
        self._seeds[key] = seed
        self._seed_tokens += seed.held
        while self._seeds and (
            len(self._seeds) > self.OPENINGS or self._seed_tokens > self.max_tokens // 4
        ):
            _, gone = self._seeds.popitem(last=False)
            self._seed_tokens -= gone.held
            if gone.opening is not None:
                self.openings.pop(gone.opening.id, None)

    def clear(self) -> None:
        """Forget every conversation and opening (after `onjob forget`: a parent may be
        gone, and what was deleted must not come back from memory)."""
        self._last.clear()
        self._tokens = 0
        self._seeds.clear()
        self._seed_tokens = 0
        self.openings.clear()

    def _drop(self, slot: str) -> None:
        last = self._last.pop(slot, None)
        if last is not None and last.tokens is not None:
            self._tokens -= len(last.tokens)

    def __len__(self) -> int:
        return len(self._last)

    @property
    def tokens(self) -> int:
        return self._tokens


def stored(
    lineage: Lineage,
    *,
    keys: Keys,
    api_key_id: str | None,
    continuations: list[str],
    exchange_id: str,
    request: dict,
    prompt_token_ids: list[int] | None,
    completion_token_ids: list[int] | None,
    answered: bool,
) -> tuple[bytes | None, list[int] | None, Delta]:
    """What an exchange's row stores of its request and prompt: (the request's JSON with only
    the new messages, or None to store the client's bytes whole; the prompt token ids to
    store; the delta). An `answered` exchange becomes what the turn continuing its first
    reply (`continuations[0]`) is stored against (`completion_token_ids`: that reply's)."""
    messages = request.get("messages")
    if not isinstance(messages, list):  # a legacy completion: no turns to continue
        return None, prompt_token_ids, WHOLE
    # On the proxy's path, per request: ~0.9 us a message (encode + hash, 300-600 characters
    # each), and the prompt ids copied once into an array; measured ~26 us for 8 messages and
    # 480 token ids, ~190 us for 101 messages and 6,450 token ids (2 busy cores). The
    # stitcher's chain hashes cost about as much.
    digests = [digest(m) for m in messages]
    large = fields(request)
    delta, prompt, parent = lineage.delta(
        keys.candidates, api_key_id, digests, large, prompt_token_ids
    )
    if delta.parent_id is None:
        delta = lineage.opening(api_key_id, request, digests, large, prompt)
    if answered and continuations:
        lineage.remember(
            continuations[0],
            api_key_id,
            exchange_id,
            digests,
            large,
            prompt,
            completion_token_ids,
            parent,
        )
    if delta.parent_id is None:
        return None, prompt_token_ids, delta
    left_out = delta.request_kept or ()
    body = _encode(
        {
            k: messages[delta.messages_kept :] if k == "messages" else v
            for k, v in request.items()
            if k not in left_out
        }
    )
    if prompt_token_ids is not None:
        prompt_token_ids = prompt_token_ids[delta.prompt_kept :]
    return body, prompt_token_ids, delta


def rebuilt(ids_sql: str) -> str:
    """A FROM item: the exchanges whose ids `ids_sql` selects (one column), each with its
    full `request` and `prompt_token_ids` (`exchanges_rebuilt`, `schema.py`). Only those
    rows and their ancestors are walked; `exchanges_full` is every row."""
    return f"exchanges_rebuilt((SELECT list(id) FROM ({ids_sql})), false)"
