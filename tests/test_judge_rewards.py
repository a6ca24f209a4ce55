"""How a group's scores become one reward per member (`judge.passes.combine`), and what the
re-sampled alternatives are asked for (`judge.sampling.request_for`)."""

from __future__ import annotations

import json

import pytest

from onjob.judge import JudgeSettings
from onjob.judge.passes import combine
from onjob.judge.sampling import request_for
from onjob.judge.tables import LoggedTurn

SETTINGS = JudgeSettings(model="openai/judge", rewards={"ok": {"fn": "m:ok", "weight": 2.0}})


def test_feedback_only_the_logged_answer_has_does_not_enter_any_reward():
    """The logged answer carries feedback, its re-sampled rivals cannot: its reward must not
    be mean(judge, feedback) against the judge alone for them."""
    by_member = {
        "logged": {"ruler:openai/judge": (0.5, None), "feedback": (1.0, None)},
        "rival": {"ruler:openai/judge": (0.5, None)},
    }
    assert combine(SETTINGS, by_member) == {"logged": 0.5, "rival": 0.5}


def test_sources_every_member_has_are_weighted_on_one_scale():
    """A reward function's number and feedback are read on [0, 1] like RULER's scores: 7.0
    counts as 1, -3 as 0; weights, not units, decide."""
    by_member = {
        "a": {"ruler:openai/judge": (0.2, None), "fn:ok": (7.0, None), "feedback": (5.0, None)},
        "b": {"ruler:openai/judge": (0.8, None), "fn:ok": (-3.0, None), "feedback": (-1.0, None)},
    }
    rewards = combine(SETTINGS, by_member)
    assert rewards["a"] == pytest.approx((0.2 + 2 * 1.0 + 1.0) / 4)
    assert rewards["b"] == pytest.approx((0.8 + 0.0 + 0.0) / 4)


def _logged(request: dict) -> LoggedTurn:
    return LoggedTurn(
        id="x-1",
        trajectory_id=None,
        turn=0,
        scenario_id=None,
        api_key_id=None,
        model_alias=None,
        checkpoint=None,
        arm=None,
        request=json.dumps(request),
        response=None,
        prompt_token_ids=None,
    )


def test_alternatives_are_asked_for_with_their_sampling_settings_written_out():
    logged = _logged({"messages": [], "temperature": 0.2, "top_p": 0.9})
    body = request_for(logged, "base", JudgeSettings(temperature=1.0))
    assert (body["temperature"], body["top_p"]) == (1.0, 0.9)
    body = request_for(_logged({"messages": []}), "base", JudgeSettings())
    assert (body["temperature"], body["top_p"]) == (1.0, 1.0)
