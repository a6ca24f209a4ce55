"""The settings the release machinery reads: the loop's own, and the sections of the other
packages it drives (the engine's URL, the judge, the trainer, the database).

`DeploySettings` is plain data; the command line's `ServeSettings` extends it with the
process-level sections and reads it from flags, the environment and the TOML file.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from ..collector import CollectorSettings
from ..judge import JudgeSettings
from ..judge.settings import RewardFn
from ..proxy import ProxySettings
from ..trainer import TrainSettings


class GateSettings(BaseModel):
    """The referee: the metric a canary must win on to be promoted, apart from the reward
    it was trained on (e.g. exact success while training pays partial credit). Empty: the
    training reward (judge.model and judge.rewards)."""

    model_config = ConfigDict(frozen=True)

    model: str | None = Field(
        None, description="a RULER judge (litellm model name) for paired comparisons"
    )
    rubric: str | None = Field(None, description="its rubric (default: judge.rubric)")
    rewards: dict[str, RewardFn] = Field(
        default_factory=dict, description="name -> reward function judging the pairs"
    )
    samples: int | None = Field(
        None,
        ge=1,
        le=64,
        description="answers each arm gives a paired prompt, both arms on one seed (none: "
        "sized by the referee's noise as the pairs come in, 2 to start with, up to 16 "
        "within loop.decision_tokens: a pass/fail referee gets several, a graded one few; "
        "docs/canary.md)",
    )
    orders: int = Field(
        1,
        ge=1,
        le=4,
        description="RULER readings of each pair (the judge.model's when no gate model is "
        "set): 2 reads it again in the reverse order, so a judge's pull toward a position "
        "cancels, for twice the calls",
    )

    @property
    def configured(self) -> bool:
        return bool(self.model or self.rewards)


class TenantBudget(BaseModel):
    """One tenant's daily share of the trainer and the judge (unset: none of its own)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    train_minutes_per_day: float | None = Field(
        None, gt=0, description="minutes of training runs for the tenant's lineages"
    )
    judge_usd_per_day: float | None = Field(
        None, gt=0, description="dollars of RULER calls on the tenant's groups"
    )


class LoopSettings(BaseModel):
    """resample -> judge -> train -> canary -> compare -> decide, inside `onjob serve`."""

    model_config = ConfigDict(frozen=True)

    interval_s: float = Field(
        30.0, ge=0, description="seconds between the loop's iterations (0: never)"
    )
    alias: str = Field("agent", description="the alias the loop trains and canaries")
    train: bool = Field(True, description="false: the loop only re-samples and judges")
    min_new_groups: int | None = Field(
        None,
        ge=1,
        description="trainable groups that start a run (none: fitted to the traffic, the "
        "groups with a spread of rewards scored in the last 10 minutes, at least 4, at most "
        "trainer.max_groups; 6 for a lineage's first run)",
    )
    canary_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="a new checkpoint's share of the alias (none: fitted to the traffic, "
        "the share that brings min_guard_conversations in about 5 minutes, 10% to 50%)",
    )
    pairs_per_round: int = Field(
        8,
        ge=1,
        description="paired re-samples per round: of the offline test (rounds back to back, "
        "at the engine's speed) and of each canary round",
    )
    canary_max_rounds: int = Field(
        2880,
        ge=1,
        description="rounds (loop iterations) a canary may run without a promotion before "
        "it is rolled back with the reason (2880: a day at the default interval)",
    )
    canary_max_s: float = Field(
        86400.0,
        gt=0,
        description="wall time a canary may run without a promotion before it is rolled "
        "back with the reason",
    )
    min_pairs: int = Field(10, ge=1, description="pairs before any decision")
    max_pairs: int = Field(
        300,
        ge=1,
        description="pairs (ties and unjudged ones included) by which an undecided test "
        "rolls back and keeps live; a candidate late in its period needs more pairs than "
        "the first (its share of alpha is smaller), and a no-better one is rolled back "
        "long before by the futility test",
    )
    margin: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="a candidate is promoted only when its mean paired score difference "
        "over live (canary - live, scores in [0, 1]) is shown to exceed this",
    )
    delta: float = Field(
        0.1,
        gt=0,
        lt=0.5,
        validation_alias=AliasChoices("delta", "sprt_delta"),
        description="the improvement over the margin the test is powered for (mean paired "
        "score difference); a candidate shown not to reach margin + delta is rolled back "
        "(sprt_delta, its old name, is still read)",
    )
    alpha: float = Field(
        0.05,
        gt=0,
        lt=0.5,
        description="in each period (loop.alpha_period_days) of a lineage's stream of "
        "candidates, the chance that any one no better than live by the margin is promoted; "
        "candidate k of the period is tested at its share (docs/canary.md), plus the level "
        "of the candidate before it when that one was promoted, however often its test looks",
    )
    alpha_period_days: float = Field(
        365.0,
        gt=0,
        description="the period over which loop.alpha is spent, from the lineage's first "
        "candidate; each period starts with all of it again (so over N periods the chance of "
        "any bad promotion is at most N alpha)",
    )
    alpha_split: Literal["tenant", "server"] = Field(
        "tenant",
        description="with tenants (proxy.tenants), how loop.alpha is shared between the "
        "lineages: `tenant`, each lineage's stream of candidates at alpha (each tenant's "
        "users face at most alpha; the server as a whole at most alpha times the lineages); "
        "`server`, lineage j (in the order its first candidate was tested) at "
        "6 alpha / (pi^2 j^2), so over every lineage at most alpha, at less power for "
        "lineages that come later",
    )
    beta: float = Field(
        0.05,
        gt=0,
        lt=0.5,
        description="chance of stopping (held-out slice) or rolling back a candidate "
        "better than live by margin + delta",
    )
    max_unjudged_share: float = Field(
        0.2,
        ge=0,
        le=1,
        description="share of pairs the referee could not score after its attempts past "
        "which a promotion waits (the candidate's own losses for want of a judgement, and "
        "pairs set aside as the referee's failure), and past which, shown with 95% "
        "confidence at every look, the test stops: the referee is broken",
    )
    decision_tokens: int | None = Field(
        4_000_000,
        ge=1,
        description="engine tokens a release test's pairs may spend (both arms' prompts and "
        "answers): the answers per arm are capped so that loop.max_pairs pairs fit, at the "
        "tokens the pairs so far measured (none: only the cap of 16 answers)",
    )
    rejudge_attempts: int = Field(
        3,
        ge=1,
        description="a pair the referee could not score is judged again, at each round, up "
        "to this many attempts in all; the test reads its pairs in order and waits at it "
        "until then (a judge failing only now and then costs no power), and one still "
        "unjudged after them counts as the candidate's loss",
    )
    backoff_s: float = Field(
        300.0,
        ge=0,
        description="after a candidate is not promoted, the next training run waits this "
        "long, doubled for each candidate in a row not promoted, up to a day",
    )
    tenant_budgets: dict[str, TenantBudget] = Field(
        default_factory=dict,
        description="each tenant's (proxy.tenants) share of the shared trainer and judge "
        "per UTC day, e.g. { acme = { train_minutes_per_day = 30, judge_usd_per_day = 2 } }; "
        "a tenant whose share is spent waits (its groups kept) while the others go on. "
        "trainer.max_minutes_per_day and judge.max_usd_per_day still cap the server",
    )
    max_candidates_per_day: int | None = Field(
        6,
        ge=1,
        description="the training budget: new candidates per alias per UTC day (none: "
        "unbounded); each spends a share of alpha",
    )
    max_error_increase: float = Field(
        0.05, ge=0, description="canary share of failed conversations over live's"
    )
    max_latency_ratio: float = Field(
        1.5, gt=1, description="canary median conversation latency / live's"
    )
    min_guard_conversations: int = Field(
        20,
        ge=1,
        description="turns served per arm since the canary started before a promotion (a "
        "conversation of n turns counts n: each is a request a user waited on)",
    )
    gate: GateSettings = Field(default_factory=GateSettings)
    holdout_share: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="share of scenarios (by a hash of their id, decided at a scenario's "
        "first sight) never trained on, whose pairs test whether a candidate is worse than "
        "live there, before it serves anyone (their own test, not the release test's; "
        "none: fitted to the traffic, "
        "holdout_pairs / scenarios seen, between 10% and 30%)",
    )
    holdout_pairs: int = Field(
        12,
        ge=1,
        description="held-out prompts a candidate and live answer before a canary: the "
        "held-out slice's own test (is it worse than live there?)",
    )
    # Reward hacking shows in the answers' shape before it shows in the reward: each guard
    # compares the canary's answers with live's, on real traffic and on the paired samples.
    max_length_ratio: float = Field(
        1.5, gt=1, description="canary median answer length / live's (tokens)"
    )
    max_empty_increase: float = Field(
        0.05, ge=0, description="canary share of empty answers over live's"
    )
    max_truncated_increase: float = Field(
        0.05, ge=0, description="canary share of answers cut at max_tokens over live's"
    )
    max_kl_to_base: float | None = Field(
        0.5,
        gt=0,
        description="KL to the base model per token (k3, measured by the trainer on its "
        "snapshot's tokens, weighted by candidate / sampler, and on answers the candidate "
        "samples itself; the larger) past which a candidate is stopped and a canary "
        "rolled back (none: unbounded)",
    )
    min_judge_agreement: float | None = Field(
        0.6,
        ge=0,
        le=1,
        description="where users' feedback exists: a coach or referee judge that orders "
        "answers as users do less often than this (95% interval below it) blocks every "
        "promotion (none: off)",
    )
    max_malformed_increase: float = Field(
        0.05,
        ge=0,
        description="canary share of malformed tool calls or invalid JSON where JSON was "
        "asked, over live's",
    )


class DeploySettings(BaseModel):
    """What deploy's functions take: each package's section, composed once by the CLI."""

    model_config = ConfigDict(frozen=True)

    proxy: ProxySettings = Field(default_factory=ProxySettings)
    collector: CollectorSettings = Field(default_factory=CollectorSettings)
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    trainer: TrainSettings = Field(default_factory=TrainSettings)
    loop: LoopSettings = Field(default_factory=LoopSettings)

    @model_validator(mode="after")
    def _budgets_name_tenants(self) -> DeploySettings:
        for name in self.loop.tenant_budgets:
            if name not in self.proxy.tenants:
                known = ", ".join(self.proxy.tenants) or "none: proxy.tenants is empty"
                raise ValueError(
                    f"loop.tenant_budgets names {name!r}, which is not a tenant ({known})"
                )
        return self
