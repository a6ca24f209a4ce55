"""What a verdict shows, as typed records: the paired test's state, the held-out slice's,
each guard's figures, and the verdict itself.

Each is a msgspec Struct, one field per JSON key: the deployments log and the reviews
store them as JSON, the loop records the last verdict on each candidate (`ledger`), the
admin API sends them, and the dashboard and `onjob status` read them back into these
types (`Verdict.decode`), so a page shows what the loop decided rather than deciding
again. A guard's record carries its own outcome (`Alarm`): `tripped` (the candidate must
go) or `holding` (a promotion must wait), each the reason in words, or None.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Literal

import msgspec

from ...judge import agreement
from . import stats

Stage = Literal["offline", "canary"]


class Tally(msgspec.Struct, kw_only=True):
    """Pairs counted by the sign of their difference, with B's win rate (a tie counting
    half; None before any pair) and its Wilson 95% interval."""

    pairs: int
    wins: int
    ties: int
    losses: int
    win_rate: float | None
    ci95: tuple[float, float]

    @classmethod
    def of(cls, w: stats.WinRate) -> Tally:
        return cls(
            pairs=w.pairs,
            wins=w.wins,
            ties=w.ties,
            losses=w.losses,
            win_rate=w.rate if w.pairs else None,
            ci95=w.interval(),
        )


class TestState(msgspec.Struct, kw_only=True):
    """The release test as it stands: the e-values against their thresholds, the rule's
    parameters, and the candidate's place in its lineage's stream (`ledger.Level`)."""

    __test__ = False  # not a pytest class, for all its name

    pairs: int
    unjudged: int  # pairs counted as losses for want of a judgement
    pending: int  # pairs waiting behind one to be judged again
    mean_difference: float | None
    e_value: float
    promote_at: float
    futility_e_value: float
    rollback_at: float
    margin: float
    delta: float
    alpha_k: float
    k: int | None
    beta: float
    rank: int = 1
    period: int = 0
    carried: float = 0.0
    aside: int = 0  # pairs the referee never scored, set aside unread, prompts replaced

    @classmethod
    def of(
        cls, rule: stats.Rule, p: stats.Paired, alpha: float, k: int | None = None, **place
    ) -> TestState:
        return cls(
            pairs=p.pairs,
            unjudged=p.unjudged,
            pending=p.pending,
            mean_difference=p.mean if p.pairs else None,
            e_value=math.exp(p.better.log_e),
            promote_at=1 / alpha,
            futility_e_value=math.exp(p.futile.log_e),
            rollback_at=1 / rule.beta,
            margin=rule.margin,
            delta=rule.delta,
            alpha_k=alpha,
            k=k,
            beta=rule.beta,
            aside=p.aside,
            **place,
        )


class Forecast(msgspec.Struct, kw_only=True):
    """What the release test expects to cost (`answers.forecast`): the answers per arm its
    next pairs get, the pairs and engine tokens a candidate better by `delta` needs at
    this candidate's level and the referee's measured noise, and what happens at
    `max_pairs`; the strata of the day's traffic it would use up (`prompts.shortfalls`)."""

    answers: int  # per arm, for the next pairs
    most_answers: int  # what loop.decision_tokens allows
    fixed: bool  # loop.gate.samples set: not sized by the noise
    pairs_expected: int | None  # None: not measured yet, or no edge can decide
    pairs_so_far: int
    tokens_per_pair: int
    tokens_expected: int | None
    budget: int | None
    sd: float | None  # a pair's difference's spread at `answers`
    within: float | None  # one answer pair's variance on one prompt
    between: float | None  # the variance of the candidate's edge from prompt to prompt
    max_pairs: int
    reaches: bool  # the forecast is within half of max_pairs
    short: list[str] = []

    def summary(self) -> str:
        """In words, for the verdict's reason."""
        k = f"{self.answers} answer{'s' if self.answers > 1 else ''} per arm"
        if self.pairs_expected is None:
            out = f"next pairs at {k} (the referee's noise not measured yet)"
        else:
            out = (
                f"expects about {self.pairs_expected} pairs in all "
                f"({self.pairs_so_far} so far) at {k}, ~{_tokens(self.tokens_expected)} "
                f"engine tokens, for a candidate better by delta at its level (a pair's "
                f"spread {self.sd:.2f})"
            )
            if not self.reaches:
                out += "; the referee is too noisy for the test to be sure to decide in time"
        out += f"; at {self.max_pairs} pairs undecided: rolled back, live kept"
        for stratum in self.short:
            out += f"; {stratum}"
        return out


def _tokens(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


class HeldOutState(Tally, kw_only=True):
    """The held-out slice's own test: is the candidate worse than live where nobody
    trained? (`pairs.HeldOut`)"""

    unjudged: int
    pending: int
    mean_difference: float | None
    worse_e_value: float
    stop_at: float
    worse: bool


class Alarm(msgspec.Struct, kw_only=True):
    """A guard's outcome: why the candidate must go, or why a promotion must wait."""

    tripped: str | None = None
    holding: str | None = None


class ArmService(msgspec.Struct, kw_only=True):
    """One arm's conversations on real traffic since the canary started."""

    conversations: int
    failed: int  # with a request the engine or onjob failed
    p50_ms: float | None  # the median conversation's median latency
    turns: int = 0  # the requests those conversations made (a tool agent's: several each)


class Service(Alarm, kw_only=True):
    """The error and latency guards (`guards.on_traffic`)."""

    live: ArmService
    canary: ArmService


class ArmShape(msgspec.Struct, kw_only=True):
    """One arm's answers, counted by shape (`shape.Shapes`)."""

    answers: int
    median_length: int | None
    empty: int
    truncated: int
    malformed: int


class Shape(Alarm, kw_only=True):
    """The shape guards on one source of answers (`shape.guards`)."""

    live: ArmShape
    canary: ArmShape


class Drift(Alarm, kw_only=True):
    """The KL guard: the checkpoint's recorded KL to the base model (`trust.kl_guard`)."""

    kl_to_base: float | None = None
    kl_to_base_own: float | None = None
    bound: float | None = None


class JudgeAgreement(Alarm, kw_only=True):
    """The judge agreement guard: each judge's agreement with users, by its name and
    metric (`trust.agreement_guard`; the records are `judge.agreement.Agreement`'s)."""

    bound: float | None = None
    judges: dict[str, agreement.Agreement] = {}


class Checks(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The guards besides the service's: on the paired samples, the checkpoint's drift,
    its judges, and (as a canary) the shape of its real traffic."""

    pairs: Shape
    kl: Drift
    judges: JudgeAgreement
    traffic: Shape | None = None


class RoutingSeen(msgspec.Struct, kw_only=True):
    """The routing a canary's verdict is about (a decision applies to no other)."""

    live: str | None
    canary: str | None
    since: str


class ReleaseMode(msgspec.Struct, kw_only=True):
    """Whether the loop may promote by itself (`automatic`: a referee or users check the
    coach), and why (`trust.release_mode`)."""

    mode: Literal["referee", "users", "review"]
    reason: str
    automatic: bool

    @classmethod
    def of(cls, mode: Literal["referee", "users", "review"], reason: str) -> ReleaseMode:
        return cls(mode=mode, reason=reason, automatic=mode != "review")


class Evidence(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the dashboard, `onjob status` and the deployments log show of a verdict. The
    routing's part (`routing`, `test`, `guards`) only for a canary; `referee` and
    `release_mode` once the canary's round has read them."""

    live: str | None
    tests: list[str]
    paired: Tally
    unjudged_pairs: int  # every pair without a judged comparison
    e_process: TestState
    shape: Checks
    held_out: HeldOutState
    routing: RoutingSeen | None = None
    test: str | None = None
    guards: Service | None = None
    referee: list[str] | None = None
    release_mode: ReleaseMode | None = None
    forecast: Forecast | None = None


class Verdict(msgspec.Struct, frozen=True):
    """`verdict.decide`'s answer. Offline, "promote" means the test passed, its canary's
    guards to come."""

    decision: stats.Decision
    reason: str
    evidence: Evidence

    def encode(self) -> str:
        return stored_json(self)

    @classmethod
    def decode(cls, text: str | bytes) -> Verdict:
        return msgspec.json.decode(text, type=cls)


def stored_json(evidence: Evidence | Verdict | dict) -> str:
    """As the JSON columns hold evidence: `json`'s spacing, as rows written before these
    records were typed, so one `LIKE` or substring reads old and new rows alike."""
    return json.dumps(msgspec.to_builtins(evidence))


class Recorded(msgspec.Struct, frozen=True, kw_only=True):
    """The last verdict the loop reached on a candidate at one stage (`ledger.record`)."""

    stage: Stage
    verdict: Verdict
    at: datetime  # when the loop looked
