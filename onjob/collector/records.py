"""What the proxy hands to the collector: one line of the spool per exchange or feedback.

Spool lines are a tagged union (`"kind"`), so feedback is as durable as exchanges, and an
opening (`linear.py`) travels in the same segment as the exchanges stored against it.
JSON columns travel as `msgspec.Raw`: the proxy hands over the bytes it already has
(the client's request body, the answer it sent), and loading a spool line into
DuckDB never parses or re-serialises them.

A record is one line, whatever a client sent (`encode`): the spool is newline-delimited,
so a line break inside a record would split it, and a client could then forge whole
lines (another key's exchange, its feedback) or have its own exchange dropped as torn.
"""

from __future__ import annotations

from typing import Any, get_args

import msgspec

NULL = msgspec.Raw(b"null")


def to_json(value: Any) -> msgspec.Raw:
    """A JSON column's value from a Python object (None stays SQL NULL)."""
    return NULL if value is None else msgspec.Raw(msgspec.json.encode(value))


class ExchangeRecord(msgspec.Struct, kw_only=True, tag_field="kind", tag="exchange"):
    id: str
    ts: float  # epoch seconds: when the request arrived (the loader places lines in this order)
    # Placed by the loader (`trajectories.Stitcher.place_keys`) from the stitching keys below;
    # the proxy sets `trajectory_id` only for a conversation the client named (scoped) or a
    # Responses API chain (with `after_turn`), and never `turn` or `scenario_id`.
    trajectory_id: str | None = None
    turn: int | None = None
    scenario_id: str | None = None
    scenario_key: str
    scenario_keyed: str
    after_turn: int | None = None  # a Responses API chain: the turn this one continues
    retry_of: str | None = None  # a failed canary attempt this answers in place of: its place
    stitch: list[str] | None = None  # `Keys.candidates`: the continuations this may be
    prefix_hash: str | None = None  # `Keys.prefix_hash`
    model_alias: str | None = None
    api_key_id: str | None = None
    checkpoint: str | None = None
    arm: str | None = None
    stream: bool = False
    request: msgspec.Raw = NULL
    response: msgspec.Raw = NULL
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[list[int]] | None = None
    completion_logprobs: list[list[float]] | None = None
    usage: msgspec.Raw = NULL
    latency_ms: float | None = None
    status: int = 200
    error: str | None = None
    metadata: msgspec.Raw = NULL
    source: str = "production"
    continuation_hashes: list[str] | None = None  # its replies': what a next turn continues
    served_model: str | None = None  # the engine's `model` in its answer
    logprobs_mode: str | None = None  # the sampler's logprob definition (`onjob.logprobs`)
    # Why no judge group or training snapshot may take it (`onjob.logprobs.Untrainable`);
    # None: trainable. Set by whoever makes the record, for answered exchanges.
    untrainable: str | None = None
    api: str | None = None  # the API the client called: None (chat), responses, completions
    api_object: msgspec.Raw = NULL  # a stored Response and its input items (`responses`)
    # Linear storage (`linear.py`): the exchange this one continues, and how many of its
    # messages and prompt + completion token ids this one's begin with (not repeated in
    # `request.messages` and `prompt_token_ids`). None: stored whole.
    parent_id: str | None = None
    messages_kept: int | None = None
    prompt_kept: int | None = None
    request_kept: list[str] | None = None  # top-level fields left out: the parent's


class FeedbackRecord(msgspec.Struct, kw_only=True, tag_field="kind", tag="feedback"):
    id: str
    ts: float
    exchange_id: str | None = None
    trajectory_id: str | None = None
    api_key_id: str | None = None
    value: float
    comment: str | None = None
    metric: str | None = None  # its name ("thumbs", "resolved"); None: unnamed


class OpeningRecord(msgspec.Struct, kw_only=True, tag_field="kind", tag="opening"):
    """What conversations of one system prompt and tool set share at their start
    (`linear.py`): a first turn stores only what follows it. Its `ts` is that of the
    exchange it is spooled with, so a line deleted by date goes with its opening."""

    id: str
    ts: float
    api_key_id: str | None = None
    request: msgspec.Raw = NULL  # {"messages": the leading system messages, large fields}
    prompt_token_ids: list[int] | None = None


class Resample(msgspec.Struct, frozen=True, kw_only=True):
    """An answer the judge or a release test sampled for a logged turn, stored as a
    `resample` exchange in that turn's place (`Store.add_resample`): never on the spool
    (nobody was answered), written where its group is, in the group's transaction. JSON
    columns as their text."""

    id: str
    ts: float  # epoch seconds
    trajectory_id: str | None
    turn: int | None
    scenario_id: str | None
    api_key_id: str | None  # the logged turn's key: its prompt is that key's
    model_alias: str | None
    checkpoint: str | None
    arm: str | None
    request: str
    response: str
    prompt_token_ids: list[int] | None
    completion_token_ids: list[list[int]] | None
    completion_logprobs: list[list[float]] | None
    usage: str
    latency_ms: float | None
    metadata: str
    logprobs_mode: str | None
    untrainable: str | None


Record = ExchangeRecord | FeedbackRecord | OpeningRecord
# What a spool line may be: the tags of `Record`.
KINDS = tuple(r.__struct_config__.tag for r in get_args(Record))

_encode = msgspec.json.Encoder().encode
# JSON whitespace that ends a line for the spool's readers (DuckDB's `read_json` breaks on
# both; U+2028/U+2029 it reads as text, and JSON strings may hold them).
_BREAKS = bytes.maketrans(b"\n\r", b"  ")


def encode(record: Record) -> bytes:
    """A record as one spool line. msgspec escapes line breaks in the strings it writes, so a
    break can come only from a `Raw` field: the bytes a client sent (a pretty-printed
    body). There it is whitespace between tokens (a JSON string cannot hold a raw control
    character, and the proxy's decoder refuses one), so a space in its place keeps the
    JSON value exactly as sent. The check is two `memchr`s; bench/proxy/proxy_overhead.py
    measured no cost (docs/security.md)."""
    line = _encode(record)
    if b"\n" in line or b"\r" in line:
        line = line.translate(_BREAKS)
    return line
