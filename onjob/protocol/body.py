"""A request body, read once by one rule that every later reader of it shares.

The proxy logs the client's bytes as sent and forwards what it decoded; every later
reader of the log (DuckDB's JSON functions, the stitcher, the judge, the trainer) reads
those bytes again. Two readings must never disagree, so `decode_body` refuses:

- bytes that are not UTF-8, or not one JSON object;
- nesting deeper than `MAX_DEPTH`: every later reader recurses, and must never reach
  Python's limit;
- **a duplicate key in any object.** msgspec (and vLLM's pydantic) keep the last value,
  DuckDB's `->>` the first: `{"messages": [A], "messages": [B]}` would be answered for B
  and logged as A, and a tenant could put prompt/answer pairs that never happened into
  what the adapter trains on. RFC 8259 leaves duplicates' meaning to the parser ("names
  SHOULD be unique"), so the one reading that every parser agrees on is none: a 400 that
  names the key. No client library sends one.

The duplicate check counts colons, at C speed: outside strings a colon ends a key, so the
client's bytes hold as many colons as the decoded body re-encoded exactly when no key was
dropped (the strings are the same, and JSON never escapes a colon unless a client writes
it `\u003a`). Only a body with more colons than its re-encoding, or with `\u003a`, is
parsed a second time, by `json`, to name the key. `decode_body` as a whole (the depth
bound's bracket count included) takes 27-32 µs for a 6 KB chat body where msgspec alone
takes 9-14, and 3.8 ms for 700 KB against 0.9 (`bench/proxy/body_check.py`, an idle 2-core
machine); a second parse with `json` would cost about 50 µs for the 6 KB body.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from .errors import InvalidRequest

__all__ = ["MAX_DEPTH", "JsonObject", "decode_body"]

MAX_DEPTH = 64

JsonObject = dict[str, Any]
"""A JSON object carried as its writer wrote it (a client's body, an engine's answer, a
schema): read where needed, passed on as is, every key kept."""

_decode = msgspec.json.decode
_encode = msgspec.json.encode


def decode_body(raw: bytes) -> JsonObject:
    """A request body as every OpenAI route reads it: valid UTF-8, one JSON object, no
    deeper than `MAX_DEPTH`, no key twice in one object."""
    try:
        body = _decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"Malformed JSON body: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"The body is not valid UTF-8: {exc}") from exc
    except RecursionError as exc:
        raise InvalidRequest(f"The body is nested deeper than {MAX_DEPTH} levels.") from exc
    if type(body) is not dict:
        raise InvalidRequest("The request body must be a JSON object.")
    # The number of opening brackets bounds the depth (counted at C speed, ~0.6 µs per KB);
    # only a body with more containers than MAX_DEPTH is walked.
    if raw.count(b"{") + raw.count(b"[") > MAX_DEPTH and not _within_depth(body, MAX_DEPTH):
        raise InvalidRequest(f"The body is nested deeper than {MAX_DEPTH} levels.")
    escaped = b"\\u003" in raw and (b"\\u003a" in raw or b"\\u003A" in raw)
    if escaped or raw.count(b":") != _encode(body).count(b":"):
        _refuse_duplicates(raw)
    return body


def _refuse_duplicates(raw: bytes) -> None:
    """Parse again, seeing each object's keys in order; a duplicate is a 400 naming it.
    (Where the colons told nothing, none may be found: the body is then as decoded.)"""

    def pairs(items: list[tuple[str, Any]]) -> JsonObject:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                shown = key if len(key) <= 100 else key[:100] + "..."
                raise InvalidRequest(
                    f"The key `{shown}` appears twice in one object of the body: send each "
                    "key once (JSON parsers disagree on which of two values counts)."
                )
            seen[key] = value
        return seen

    json.loads(raw, object_pairs_hook=pairs)


def _within_depth(value: Any, most: int) -> bool:
    """Whether no container lies deeper than `most` levels (breadth first, no recursion)."""
    level = [value]
    for _ in range(most):
        deeper = []
        for container in level:
            for item in container.values() if type(container) is dict else container:
                if type(item) is dict or type(item) is list:
                    deeper.append(item)
        if not deeper:
            return True
        level = deeper
    return False
