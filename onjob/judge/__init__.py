"""Turns logged traffic into scored groups: re-sampling, RULER, reward functions, feedback.

A pass (`run_pass`) makes *turn groups* (a logged exchange's answer plus
`group_size` alternatives the engine samples for the same request, with token ids
and logprobs) and *trajectory groups* (finished conversations that share a
scenario), then scores every unscored group: RULER through litellm, the user's
reward functions (`Rollout` -> float), and feedback posted to `/v1/feedback`,
combined by weight into one `combined` score per member. Everything lands in the
collector's tables: `groups`, `members`, `judgements`, `scores`. `judge_agreement` checks
each judge against users: how often it orders members as their feedback does.
"""

from .agreement import Agreement, judge_agreement
from .errors import (
    ConfigError,
    InvalidAnswer,
    JudgeError,
    JudgeRefused,
    JudgeUnavailable,
    RewardFnFailed,
    SamplingFailed,
)
from .passes import KeyBudget, PassReport, run_pass
from .rollouts import Rollout
from .settings import NO_SCORER, JudgeSettings, RewardFn

__all__ = [
    "NO_SCORER",
    "Agreement",
    "ConfigError",
    "InvalidAnswer",
    "JudgeError",
    "JudgeRefused",
    "JudgeSettings",
    "JudgeUnavailable",
    "KeyBudget",
    "PassReport",
    "RewardFn",
    "RewardFnFailed",
    "Rollout",
    "SamplingFailed",
    "judge_agreement",
    "run_pass",
]
