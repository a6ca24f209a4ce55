"""Judge settings (composed into the server's settings in `deploy`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from .rubric import DEFAULT_RUBRIC


class RewardFn(BaseModel):
    model_config = ConfigDict(frozen=True)

    fn: str = Field(description="a Python callable as `module:function`, returning a float")
    weight: float = Field(1.0, ge=0)

    @field_validator("fn")
    @classmethod
    def _module_colon_function(cls, fn: str) -> str:
        module, _, name = fn.partition(":")
        if not module or not name:
            raise ValueError(f"{fn!r} is not `module:function`")
        return fn


SETTLE_S = 120.0  # `JudgeSettings.settled_s` where the loop fitted no settle_s


class JudgeSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    # Turn groups: alternatives re-sampled for logged exchanges.
    group_size: int = Field(
        8,
        ge=1,
        le=64,
        description="alternatives sampled per logged turn (one request with n: they share "
        "the prompt's prefill)",
    )
    temperature: float = Field(1.0, ge=0, le=2, description="sampling temperature for them")
    max_tokens: int = Field(256, ge=1, description="completion cap when the request sets none")
    max_groups: int = Field(16, ge=0, description="turn groups sampled per pass")
    per_scenario: int = Field(2, ge=1, description="turn groups per scenario per pass")
    settled_after: int = Field(
        0,
        ge=0,
        description="a scenario whose last this many scored groups each had all-equal "
        "rewards (nothing to learn) is re-sampled after the others, e.g. 2; 0 = off (not "
        "yet shown to help by bench/trainer/learn_offline.py)",
    )
    tool_turns_per_scenario: int = Field(
        4,
        ge=0,
        description="besides those, turn groups per scenario per pass on turns whose logged "
        "answer called a tool: a tool agent's most trainable turns (0: none besides)",
    )
    max_age_s: float = Field(7 * 86400, gt=0, description="only exchanges this recent")
    max_sample_tokens: int = Field(
        64_000, ge=1, description="tokens a pass may ask the engine for (prompt + completions)"
    )
    concurrency: int = Field(
        2,
        ge=1,
        description="sampling requests in flight (an offline pair's two answers, drawn "
        "together, count as one): live traffic keeps the rest",
    )
    request_timeout_s: float = Field(300.0, gt=0)

    # Scenario groups: finished production conversations that share a scenario.
    scenario_groups: bool = True
    min_trajectories: int = Field(2, ge=2)
    max_trajectories: int = Field(8, ge=2)
    settle_s: float | None = Field(
        None,
        ge=0,
        description="a conversation idle this long counts as finished (none: fitted by the "
        "loop to the traffic, 4x the 95th percentile of the gaps between a conversation's "
        "turns in the last hour, 10 s to 300 s; 120 s where nothing is fitted)",
    )

    def settled_s(self) -> float:
        """`settle_s`, or the loop's fallback where the traffic fitted none."""
        return SETTLE_S if self.settle_s is None else self.settle_s

    # RULER: an LLM ranks a group's members against each other (off unless a model is set).
    model: str | None = Field(
        None, description='litellm model name, e.g. "openai/gpt-4.1-mini" or "openai/<served>"'
    )
    api_base: str | None = Field(None, description="OpenAI-compatible base URL for the judge")
    api_key: SecretStr | None = None
    rubric: str = DEFAULT_RUBRIC
    rubrics: dict[str, str] = Field(
        default_factory=dict, description="scenario key -> rubric, overriding `rubric`"
    )
    ruler_orders: int = Field(
        1,
        ge=1,
        le=4,
        description="RULER readings of each group, the second in the first's order "
        "reversed, each member scored by their mean: a judge's pull toward a position "
        "cancels, for as many calls (the referee's is loop.gate.orders)",
    )
    judge_temperature: float = Field(0.0, ge=0, le=2)
    judge_max_tokens: int = Field(2048, ge=1)
    timeout_s: float = Field(120.0, gt=0, description="one judge call")
    attempts: int = Field(3, ge=1, description="tries per group (garbage answers included)")
    backoff_s: float = Field(1.0, ge=0, description="first wait between tries (doubles)")
    json_mode: bool = Field(
        False, description="ask for response_format=json_object (judges that support it)"
    )
    max_usd_per_day: float | None = Field(
        None,
        ge=0,
        description="judge spend per UTC day (litellm's cost of each call); when spent, RULER "
        "pauses until 00:00 UTC and its groups wait unscored (none: no limit)",
    )
    input_cost_per_token: float | None = Field(
        None,
        ge=0,
        description="USD per prompt token, for a judge litellm has no price for (a model "
        "of your own): without one its calls cost nothing to the budget",
    )
    output_cost_per_token: float | None = Field(
        None, ge=0, description="USD per completion token, likewise"
    )

    # How the sources combine into one reward per member (weighted mean).
    truncated_reward: float | None = Field(
        None,
        ge=0,
        le=1,
        description="the most a training group's answer cut at its token cap (finish_reason "
        "length) is rewarded, whatever its scorers said, e.g. 0: the release path stops "
        "candidates whose answers are cut more often than live's, so the coach need not pay "
        "for them (none: scored as any other; not yet shown to help by bench/release/learning.py)",
    )
    ruler_weight: float = Field(1.0, ge=0)
    feedback_weight: float = Field(
        1.0, ge=0, description="the weight of posted feedback (each metric's unless named below)"
    )
    feedback_weights: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict,
        description="metric name -> the weight of feedback posted with that `metric` "
        "(e.g. { thumbs = 1.0, resolved = 2.0 }); each metric is a score source of its own, "
        "`feedback:<metric>`",
    )
    rewards: dict[str, RewardFn] = Field(
        default_factory=dict, description="name -> reward function and its weight"
    )

    def rubric_for(self, scenario_key: str | None) -> str:
        return self.rubrics.get(scenario_key or "", self.rubric)

    def scorer(self) -> str | None:
        """What scores re-sampled answers, in words; None: nothing does (users' feedback
        scores only the answers they saw, so a re-sample would never be scored)."""
        said = []
        if self.model:
            said.append(f"RULER judge {self.model}")
        if self.rewards:
            said.append(f"reward functions {', '.join(self.rewards)}")
        return " and ".join(said) or None

    @property
    def scorers(self) -> list[str]:
        """The sources every member of a group must be scored by."""
        return ([f"ruler:{self.model}"] if self.model else []) + [
            f"fn:{name}" for name in self.rewards
        ]


# What the start-up banner, `onjob status` and the dashboard say when nothing scores.
NO_SCORER = (
    "nothing will be scored but what users' feedback says of their own answers, so no "
    "answer is re-sampled: add a reward function or a judge to onjob.toml, e.g. "
    '`[judge.rewards]` and `correct = { fn = "my_rewards:correct" }`, or `[judge]` and '
    '`model = "openai/gpt-4.1-mini"` (docs/judging.md)'
)
