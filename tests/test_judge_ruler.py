"""RULER through litellm against a scripted OpenAI-compatible judge on loopback: every way a
judge can answer badly has its defined outcome, and shuffled candidates map back."""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest

from onjob.judge import JudgeSettings, Rollout
from onjob.judge.ruler import judge, parse

from .fake_judge import FakeJudge, candidates, scores_json

PROMPT = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 2 + 2?"},
]
VALUES = {"m-low": 0.1, "m-mid": 0.5, "m-high": 0.9}


def rollouts() -> list[Rollout]:
    return [
        Rollout(member_id, [*PROMPT, {"role": "assistant", "content": f"answer value={v}"}])
        for member_id, v in VALUES.items()
    ]


def settings(url: str, **overrides) -> JudgeSettings:
    base = {"model": "openai/judge", "api_base": url, "attempts": 3, "backoff_s": 0.01}
    return JudgeSettings(**{**base, **overrides})


def by_content(call: int, body: dict) -> tuple[int, str]:
    """A judge that reads each candidate's `value=` and gives it that score, in prose."""
    shown = candidates(body)
    values = {i: float(re.search(r"value=([\d.]+)", text).group(1)) for i, text in shown.items()}
    return 200, f"Here is my assessment.\n{scores_json(values)}\nHope that helps!"


def run(coro):
    return asyncio.run(coro)


def test_scores_in_prose_map_back_to_members_through_shuffled_orders():
    with FakeJudge(by_content) as fake:
        rng = random.Random(7)
        results = [run(judge(settings(fake.url), rollouts(), rng=rng)) for _ in range(6)]
    for result in results:
        assert result.status == "ok", result.error
        assert {m: s for m, (s, _) in result.scores.items()} == VALUES
        assert sorted(result.order) == sorted(VALUES)
    # The judge saw the members in different positions across calls, and the recorded
    # order is what it saw: candidate i in call k is result.order[i-1].
    assert len({tuple(r.order) for r in results}) > 1
    for result, body in zip(results, fake.calls, strict=True):
        shown = candidates(body)
        for i, member_id in enumerate(result.order, 1):
            assert f"value={VALUES[member_id]}" in shown[i]
    assert results[0].prompt_tokens == 100 and results[0].completion_tokens == 20


def position_biased(call: int, body: dict) -> tuple[int, str]:
    """A judge that reads each candidate's value but pulls toward the first shown: +0.1 for
    the first of the three, 0 for the second, -0.1 for the third."""
    shown = candidates(body)
    values = {
        i: float(re.search(r"value=([\d.]+)", text).group(1)) + 0.1 - 0.1 * (i - 1)
        for i, text in shown.items()
    }
    return 200, scores_json(values)


def test_a_second_reading_in_the_reverse_order_cancels_a_judges_pull_toward_a_position():
    with FakeJudge(position_biased) as fake:
        once = run(judge(settings(fake.url), rollouts(), rng=random.Random(3)))
        twice = run(judge(settings(fake.url, ruler_orders=2), rollouts(), rng=random.Random(3)))
    # One reading: each score is off by where the member happened to be shown.
    assert {m: s for m, (s, _) in once.scores.items()} != pytest.approx(VALUES)
    # Two: the second call showed the first's order reversed, and the mean is the value.
    assert twice.status == "ok" and len(fake.calls) == 3
    first, second = (list(candidates(body).values()) for body in fake.calls[1:])
    assert second == first[::-1]
    assert {m: s for m, (s, _) in twice.scores.items()} == pytest.approx(VALUES)
    assert sorted(twice.order) == sorted(VALUES)
    assert twice.prompt_tokens == 200  # both calls paid for
    # The cache keeps the readings apart: two orders are not one.
    assert twice.cache_key != once.cache_key


def test_the_common_prefix_goes_once_as_context_and_candidates_hold_only_answers():
    with FakeJudge(by_content) as fake:
        run(judge(settings(fake.url), rollouts()))
    prompt = fake.calls[0]["messages"][-1]["content"]
    assert prompt.count("What is 2 + 2?") == 1
    assert prompt.index("What is 2 + 2?") < prompt.index("<candidate")
    assert all("What is 2 + 2" not in text for text in candidates(fake.calls[0]).values())
    assert "Grading standards" in fake.calls[0]["messages"][0]["content"]


def test_fenced_json_block_is_parsed():
    def fenced(call, body):
        scores = dict.fromkeys(candidates(body), 0.5)
        return 200, f"```json\n{scores_json(scores)}\n```"

    with FakeJudge(fenced) as fake:
        result = run(judge(settings(fake.url), rollouts()))
    assert result.status == "ok" and result.attempts == 1


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (lambda shown: scores_json({1: 0.5, 2: 0.5}), "2 scores for 3 candidates"),
        (lambda shown: scores_json({1: 0.5, 2: 0.5, 7: 0.5}), "unknown candidate id '7'"),
        (lambda shown: scores_json({1: 0.5, 2: 1.5, 3: 0.1}), "not in [0, 1]"),
        (lambda shown: "I think they are all fine.", "no JSON with scores"),
    ],
    ids=["wrong-count", "unknown-id", "out-of-range", "no-json"],
)
def test_invalid_answers_are_retried_then_the_group_fails_with_the_reason(answer, reason):
    with FakeJudge(lambda call, body: (200, answer(candidates(body)))) as fake:
        result = run(judge(settings(fake.url, attempts=2), rollouts()))
    assert result.status == "failed"
    assert result.scores == {}  # never made-up scores
    assert reason in result.error and "after 2 attempts" in result.error
    assert len(fake.calls) == 2


def test_server_errors_are_retried_with_backoff_until_an_answer_comes():
    def flaky(call, body):
        return (500, "overloaded") if call < 3 else by_content(call, body)

    with FakeJudge(flaky) as fake:
        result = run(judge(settings(fake.url, attempts=3), rollouts()))
    assert result.status == "ok" and result.attempts == 3 and len(fake.calls) == 3


def test_a_judge_that_keeps_failing_fails_the_group_with_its_status():
    with FakeJudge(lambda call, body: (503, "down for maintenance")) as fake:
        result = run(judge(settings(fake.url, attempts=2), rollouts()))
    assert result.status == "failed" and "503" in result.error and len(fake.calls) == 2


def test_a_refusing_judge_is_not_retried():
    with FakeJudge(lambda call, body: (400, "context length exceeded")) as fake:
        result = run(judge(settings(fake.url, attempts=3), rollouts()))
    assert result.status == "failed" and "refused" in result.error and len(fake.calls) == 1


def test_a_slow_judge_times_out_and_the_group_fails():
    with FakeJudge(lambda call, body: (2.0, "{}")) as fake:
        result = run(judge(settings(fake.url, attempts=1, timeout_s=0.3), rollouts()))
    assert result.status == "failed" and "timed out" in result.error


def test_an_unreachable_judge_fails_the_group():
    with FakeJudge(by_content) as fake:
        url = fake.url
    result = run(judge(settings(url, attempts=1), rollouts()))
    assert result.status == "failed" and "cannot reach the judge" in result.error


def test_parse_accepts_a_bare_list_and_numeric_ids():
    text = json.dumps([{"id": 2, "score": 1, "explanation": "b"}, {"id": "1", "score": "0.25"}])
    assert parse(text, 2) == {1: (0.25, ""), 2: (1.0, "b")}
