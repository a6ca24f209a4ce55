"""The proxy's own routes' bodies (feedback, models, health), one declaration each;
answers are built as these Structs, so what is documented is what is sent. The OpenAI
APIs' requests and answers (chat, legacy completions, the Responses API) are
`onjob.protocol`'s.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ..collector.writer import CollectorStats

# A metric's name: a word, as a score source's name and a settings key hold it.
MetricName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class Feedback(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A signal about one exchange or a whole conversation (one of the ids is needed),
    unnamed or of a named metric ("thumbs", "resolved"): each metric is a score source of
    its own (`feedback:<metric>`), so metrics on different scales are never averaged."""

    value: float
    exchange_id: str | None = None
    trajectory_id: str | None = None
    comment: str | None = None
    metric: MetricName | None = None


class Model(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"]
    data: list[Model]


class FeedbackRecorded(msgspec.Struct, kw_only=True):
    object: Literal["feedback"]
    id: str
    ts: float
    exchange_id: str | None
    trajectory_id: str | None
    api_key_id: str | None
    value: float
    comment: str | None
    metric: str | None


class Health(msgspec.Struct, kw_only=True):
    status: Literal["ok", "engine down"]  # 503 with "engine down": no engine answers
    # Only to the admin key (`Authorization: Bearer <admin key>`): this process's counters.
    pid: int | None = None  # which process answered (several answer on one port, --workers)
    engines: list[str] | None = None  # each engine's state (up, reloading, down), as configured
    collector: CollectorStats | None = None
