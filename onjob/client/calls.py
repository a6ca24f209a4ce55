"""Each call of the client as data: the request to send, whose key it needs, and the
type its answer decodes to. `Client` and `AsyncClient` send the same calls, one with
httpx's `Client`, the other with its `AsyncClient`, so every call is written once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import httpx
import msgspec

from .errors import ClientError, Refused

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP request to the server and how its answer is read."""

    method: Literal["GET", "POST"]
    path: str  # below the server's root: "/v1/feedback", "/admin/status"
    answer: Any  # the type the JSON answer decodes to (msgspec.convert)
    key: Literal["api", "admin"] = "admin"
    body: msgspec.Struct | None = None  # sent as JSON
    params: dict[str, str] = field(default_factory=dict)
    into: Path | None = None  # stream the answer's bytes into this file instead
    pick: str | None = None  # the answer is this field of the JSON object


def read(call: Call[T], resp: httpx.Response) -> T:
    """The answer of `call`, or `Refused` with the server's message."""
    if resp.status_code >= 400:
        raise Refused(resp.status_code, message_of(resp))
    try:
        data = resp.json()
        if call.pick is not None:
            data = data[call.pick]
        return msgspec.convert(data, call.answer)
    except (ValueError, KeyError, TypeError, msgspec.ValidationError) as exc:
        # another version's server, or not onjob at all at that address
        raise ClientError(f"{call.path} answered what this client cannot read: {exc}") from exc


def partial_of(path: Path) -> Path:
    """Where a download goes until it is whole (renamed onto `path` then), its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(path.name + ".partial")


def message_of(resp: httpx.Response) -> str:
    """What an error answer says: OpenAI's error shape, else the body's start."""
    try:
        return resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return resp.text[:300] or f"HTTP {resp.status_code}"


def root_of(base_url: str) -> str:
    """The server's root, whether given with the OpenAI clients' `/v1` or without."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url
