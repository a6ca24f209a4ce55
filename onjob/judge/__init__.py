"""Turns logged traffic into scored groups: re-sampling, RULER, reward functions, feedback.

A pass (`run_pass`) makes *turn groups* (a logged exchange's answer plus
`group_size` alternatives the engine samples for the same request, with token ids
and logprobs) and *trajectory groups* (finished conversations that share a
scenario), then scores every unscored group: RULER through litellm, the user's
reward functions (`Rollout` -> float), and feedback posted to `/v1/feedback`,
combined by weight into one `combined` score per member. Everything lands in the
collector's tables: `groups`, `members`, `judgements`, `scores`. `judge_agreement` checks
each judge against users: how often it orders members as their feedback does.

What each module holds:

re-sampling, each request marked background (vLLM's `priority`), asked again without it
of an engine that refuses priorities, none at all with no judge and no reward function
(`sampling.py`, `passes.py`), background requests admitted while no one else queues in
the engine, read from its `/metrics` (`admission.py`; the offline test's pairs too),
groups, members, judgements and scores in DuckDB (`tables.py`, `rollouts.py`), one API
key's traffic per group and none of `proxy.untrained_keys`' (`tenants.py`; the snapshot,
canary, held-out and `onjob compare` prompts leave those keys out too), RULER
(`ruler.py`, `rubric.py`), reward functions (`rewards.py`), scenarios whose recent
groups scored every member alike re-sampled last when `judge.settled_after` is set
(`settled.py`), a scenario whose last two groups were flat left alone for half an hour
and whether a lineage's recent groups carry signal at all, said in `onjob status` and
the dashboard (`signal.py`), one pass (`passes.py`), each judge checked against users'
feedback (`agreement.py`)
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
