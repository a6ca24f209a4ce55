"""The guards: what must hold besides the paired test, each as one `Guard`.

A guard *trips* (stop the candidate, roll the canary back) only when an interval valid at
every look says the candidate is beyond its bound; it *holds* a promotion while the point
estimate is, or while too little has been seen. On the candidate itself (`on_candidate`):
the shape of its paired answers (`shape`), its KL to the base model and its judges'
agreement with users (`trust`). On real traffic once it is a canary (`on_traffic`): errors
and latency per conversation, and the shape of its answers, against live's.
"""

from __future__ import annotations

import msgspec

from ...proxy.tenants import Lineage
from ..settings import LoopSettings
from . import shape, stats, trust
from .evidence import Alarm, ArmService, Service


class Guard(msgspec.Struct, frozen=True):
    """One guard by its name, with its figures and its outcome (`found`)."""

    name: str
    found: Alarm

    @property
    def tripped(self) -> str | None:
        """Why the candidate must go, or None."""
        return self.found.tripped

    @property
    def holding(self) -> str | None:
        """Why a promotion must wait, or None."""
        return self.found.holding


def on_candidate(
    store, candidate: str, tests: list[str], settings: LoopSettings, judges: list[str]
) -> list[Guard]:
    """The guards that see the candidate, served or not: its paired answers' shape, its
    drift from the base model, and whether its judges agree with users."""
    return [
        Guard(
            "pairs", shape.guards(shape.paired_samples(store, tests), settings, "paired samples")
        ),
        Guard("kl", trust.kl_guard(store, candidate, settings)),
        Guard("judges", trust.agreement_guard(store, list(judges), settings)),
    ]


def on_traffic(store, lineage: Lineage, since, settings: LoopSettings) -> list[Guard]:
    """The guards on the lineage's real traffic (its alias, its keys) since the canary
    started."""
    answers = shape.real_traffic(store, lineage, since)
    return [
        Guard("service", _errors_and_latency(store, lineage, since, settings)),
        Guard("traffic", shape.guards(answers, settings, "real traffic")),
    ]


class _Conversation(msgspec.Struct, frozen=True, kw_only=True):
    """One conversation of an arm since the canary began: its turns, whether any failed on
    the server's side, and its median latency (None: no turn succeeded)."""

    arm: str
    trajectory_id: str | None
    turns: int
    failed: bool | None
    latency_ms: float | None


def _errors_and_latency(store, lineage: Lineage, since, settings: LoopSettings) -> Service:
    """Errors and latency per conversation on each arm since the canary began; no
    promotion before each arm served `min_guard_conversations` turns. Errors are
    the engine's and onjob's (a canary whose adapter fails counts), not the client's (400,
    401, 413) or a client hanging up (499).

    Errors: the share of conversations with a failed request, canary's against live's plus
    `max_error_increase`. Latency: the share of canary conversations slower than
    `max_latency_ratio` times live's median conversation; over one half means the canary's
    median is beyond the ratio."""
    mine, scope = lineage.scope.sql("api_key_id")
    rows = store.rows(
        _Conversation,
        f"""
        SELECT arm, trajectory_id, count(*) AS turns,
               bool_or(status >= 400 AND status NOT IN (400, 401, 413, 499)) AS failed,
               median(latency_ms) FILTER (WHERE status < 400) AS latency_ms
        FROM exchanges
        WHERE model_alias = ? AND ts >= ? AND source = 'production' AND arm IN ('live', 'canary')
          AND {mine}
        GROUP BY arm, trajectory_id
        """,
        [lineage.alias, since, *scope],
    )
    arms: dict[str, list[_Conversation]] = {"live": [], "canary": []}
    for r in rows:
        arms[r.arm].append(r)
    seen = {}
    for arm, convs in arms.items():
        times = sorted(c.latency_ms for c in convs if c.latency_ms is not None)
        seen[arm] = ArmService(
            conversations=len(convs),
            failed=sum(bool(c.failed) for c in convs),
            p50_ms=times[len(times) // 2] if times else None,
            turns=sum(c.turns for c in convs),
        )
    out = Service(live=seen["live"], canary=seen["canary"])
    live, canary = out.live, out.canary
    a = settings.alpha / 2  # two guards
    errors = stats.increase(
        (canary.failed, canary.conversations),
        (live.failed, live.conversations),
        settings.max_error_increase,
        a,
    )
    if errors:
        c_rate = canary.failed / canary.conversations
        l_rate = live.failed / live.conversations
        said = f"canary conversations failed {c_rate:.1%} against live {l_rate:.1%}"
        if errors == "trip":
            out.tripped = f"error guard: {said} (more than +{settings.max_error_increase:.0%})"
        else:
            out.holding = f"the error guard holds: {said}"
    if not out.tripped and live.p50_ms:
        bound = settings.max_latency_ratio * live.p50_ms
        timed = [c for c in arms["canary"] if c.latency_ms is not None]
        slow = sum(c.latency_ms > bound for c in timed)
        said = (
            f"{slow} of {len(timed)} canary conversations slower than "
            f"{settings.max_latency_ratio:g} x live's median ({live.p50_ms:.0f} ms)"
        )
        latency = stats.majority(slow, len(timed), a)
        if latency == "trip":
            out.tripped = f"latency guard: {said}"
        elif latency == "hold" and not out.holding:
            out.holding = f"the latency guard holds: {said}"
    # The floor counts turns served: each turn of a tool agent's conversation is a request a
    # user waited on, failed or not, and is checked as one. Counted in conversations, an
    # agent of 1.5 conversations a minute (2-4 turns each) waited 27 minutes at a 50%
    # canary for the guards alone; the tests above keep their alpha either way.
    need = settings.min_guard_conversations
    if not out.holding and min(live.turns, canary.turns) < need:
        # The share the canary got, beside the fraction status shows: an arm is drawn per
        # opening, so conversations that open alike get far less (or more) than asked.
        share = canary.turns / max(live.turns + canary.turns, 1)
        out.holding = (
            f"the guards need {need} turns served per arm (live {live.turns} in "
            f"{live.conversations} conversations, canary {canary.turns} in "
            f"{canary.conversations}: {share:.1%} of the turns)"
        )
    return out
