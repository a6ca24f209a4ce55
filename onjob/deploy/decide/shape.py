"""Guards against reward hacking: the shape of the canary's answers against live's.

A checkpoint trained to please a reward finds the reward's blind spots: it answers at
length when length pays, stops emitting valid tool calls or JSON when nothing checks
them, stops answering or runs to `max_tokens`. These show in the answers' shape before
they show in any reward, so the verdict compares, arm against arm:

- length: the share of the canary's answers longer than `max_length_ratio` times live's
  median answer, and `LENGTH_SLACK` tokens longer at least (over one half: the canary's
  median is beyond the ratio);
- empty answers (no text and no tool call), answers cut at `max_tokens`
  (`finish_reason: length`), malformed tool calls (arguments that are not a JSON
  object) and invalid JSON where the request asked for JSON (`response_format`): each a
  share of answers, the canary's against live's plus its allowed increase.

Like the error guard (`guards`), a guard *trips* (roll back) only when an
interval valid at every look (`stats.anytime_interval`) puts the canary beyond its
bound, and *holds* a promotion while the point estimate is. They run on two sources:
the real traffic since the canary started, and the paired samples of the canary's test
(the same prompts answered by both, so the comparison is like for like).

What they do not catch: hacking that keeps the shape. A short hedge ("4 or 7" where live
says "4", paid half by a reward that gives partial credit) is within `LENGTH_SLACK`,
neither empty, cut nor malformed, and passes every guard here. Only a judge that is not
the coach sees it: a referee (`loop.gate`), users' feedback, or a person reviewing the
canary (`trust.release_mode`: without either, the loop does not promote by itself).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from ...judge.rollouts import json_value
from ...proxy.tenants import Lineage
from ..settings import LoopSettings
from . import stats
from .evidence import ArmShape, Shape

# Short answers vary by a few tokens ("4" against "4 or 7"): a ratio alone would call
# that rambling. An answer must be this many tokens over the bound as well.
LENGTH_SLACK = 16


@dataclass
class Shapes:
    """The answers of one arm, counted."""

    answers: int = 0
    lengths: list[int] = field(default_factory=list)
    empty: int = 0
    truncated: int = 0
    malformed: int = 0  # tool calls whose arguments are not a JSON object, or invalid JSON

    def add(self, request: dict, choice: dict, length: int | None) -> None:
        message = choice.get("message") or {}
        # A legacy completion's answer is its `text`; a chat answer's, its message.
        content = message.get("content") if message else choice.get("text")
        text = content if isinstance(content, str) else json.dumps(content) if content else ""
        calls = message.get("tool_calls") or []
        self.answers += 1
        if length is not None:
            self.lengths.append(length)
        if not (text or "").strip() and not calls:
            self.empty += 1
        if choice.get("finish_reason") == "length":
            self.truncated += 1
        if any(not _json_object(c.get("function", {}).get("arguments")) for c in calls) or (
            _asks_json(request) and not calls and not _json_text(text)
        ):
            self.malformed += 1

    def summary(self) -> ArmShape:
        lengths = sorted(self.lengths)
        return ArmShape(
            answers=self.answers,
            median_length=lengths[len(lengths) // 2] if lengths else None,
            empty=self.empty,
            truncated=self.truncated,
            malformed=self.malformed,
        )


class _Served(msgspec.Struct, frozen=True, kw_only=True):
    """An answered production request of one arm (`real_traffic`)."""

    arm: str
    request: str | None
    response: str | None
    completion_token_ids: list[list[int]] | None


class _Sampled(msgspec.Struct, frozen=True, kw_only=True):
    """One answer of a paired sample (`paired_samples`): `choice` indexes its exchange's
    choices, `origin` its arm ("a" live)."""

    origin: str
    choice: int
    request: str | None
    response: str | None
    completion_token_ids: list[list[int]] | None


def real_traffic(store, lineage: Lineage, since) -> Mapping[str, Shapes]:
    """The lineage's answered production requests of each arm since `since`."""
    mine, scope = lineage.scope.sql("api_key_id")
    rows = store.rows(
        _Served,
        f"""
        SELECT arm, request, response, completion_token_ids FROM exchanges
        WHERE model_alias = ? AND ts >= ? AND source = 'production' AND status < 400
          AND arm IN ('live', 'canary') AND {mine}
        """,
        [lineage.alias, since, *scope],
    )
    out = {"live": Shapes(), "canary": Shapes()}
    for r in rows:
        request, response = json_value(r.request) or {}, json_value(r.response) or {}
        ids = r.completion_token_ids or []
        for i, choice in enumerate(response.get("choices") or ()):
            out[r.arm].add(request, choice, len(ids[i]) if i < len(ids) else None)
    return out


def paired_samples(store, tests: list[str]) -> Mapping[str, Shapes]:
    """The answers of the paired samples of `tests`: arm `a` as live, `b` as the canary."""
    rows = store.rows(
        _Sampled,
        """
        SELECT m.origin, m.choice, e.request, e.response, e.completion_token_ids
        FROM members m JOIN groups g ON g.id = m.group_id JOIN exchanges e ON e.id = m.exchange_id
        WHERE g.kind = 'ab' AND list_contains(?::VARCHAR[], g.test)
        """,
        [list(tests)],
    )
    out = {"live": Shapes(), "canary": Shapes()}
    for r in rows:
        request, response = json_value(r.request) or {}, json_value(r.response) or {}
        choices = response.get("choices") or []
        ids = r.completion_token_ids or []
        if r.choice < len(choices):
            length = len(ids[r.choice]) if r.choice < len(ids) else None
            arm = "live" if r.origin == "a" else "canary"
            out[arm].add(request, choices[r.choice], length)
    return out


def guards(arms: Mapping[str, Shapes], s: LoopSettings, source: str) -> Shape:
    """The shape guards on one source: the counts, and what tripped or holds (or None)."""
    live, canary = arms["live"], arms["canary"]
    tripped = holding = None
    alpha = s.alpha / 8  # a share of the verdict's alpha per guard
    for name, limit in (
        ("empty", s.max_empty_increase),
        ("truncated", s.max_truncated_increase),
        ("malformed", s.max_malformed_increase),
    ):
        c, lv = getattr(canary, name), getattr(live, name)
        alarm = stats.increase((c, canary.answers), (lv, live.answers), limit, alpha)
        if alarm:
            said = (
                f"{name} answers: canary {c / canary.answers:.0%} against live "
                f"{lv / live.answers:.0%} ({source})"
            )
            if alarm == "trip":
                tripped = tripped or f"{name} guard: {said}"
            else:
                holding = holding or f"the {name} guard holds: {said}"
    if live.lengths and canary.lengths and not tripped:
        median = sorted(live.lengths)[len(live.lengths) // 2]
        bound = max(s.max_length_ratio * median, median + LENGTH_SLACK)
        longer = sum(n > bound for n in canary.lengths)
        said = (
            f"{longer / len(canary.lengths):.0%} of canary answers longer than "
            f"{s.max_length_ratio:g} x live's median ({median} tokens; {source})"
        )
        alarm = stats.majority(longer, len(canary.lengths), alpha)
        if alarm == "trip":
            tripped = f"length guard: {said}"
        elif alarm == "hold":
            holding = holding or f"the length guard holds: {said}"
    return Shape(live=live.summary(), canary=canary.summary(), tripped=tripped, holding=holding)


def _json_object(arguments) -> bool:
    if isinstance(arguments, dict):
        return True
    try:
        return isinstance(json.loads(arguments), dict)
    except (TypeError, ValueError):
        return False


def _json_text(text: str) -> bool:
    try:
        json.loads(text)
    except (TypeError, ValueError):
        return False
    return True


def _asks_json(request: dict) -> bool:
    """Reads a top-level field alone: every row stores those whole (linear storage leaves
    out only earlier messages), so `exchanges` is read as it is, not rebuilt."""
    kind = (request.get("response_format") or {}).get("type")
    return kind in ("json_object", "json_schema")
