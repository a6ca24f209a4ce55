"""What the shape guards count of an answer (`deploy/decide/shape.py: Shapes`): empty,
cut at its cap, or malformed, for chat answers and legacy completions alike."""

from __future__ import annotations

import pytest

from onjob.deploy.decide.shape import Shapes

CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


@pytest.mark.parametrize(
    ("choice", "empty"),
    [
        ({"message": {"role": "assistant", "content": None}}, True),
        ({"message": {"role": "assistant", "content": "  "}}, True),
        ({"message": {"role": "assistant", "content": "4"}}, False),
        ({"message": {"role": "assistant", "content": None, "tool_calls": [CALL]}}, False),
        ({"text": ""}, True),  # a legacy completion's answer is its text
        ({"text": "4"}, False),
    ],
)
def test_an_answer_with_no_text_and_no_call_counts_as_empty(choice, empty):
    shapes = Shapes()
    shapes.add({}, {"index": 0, "finish_reason": "stop", **choice}, 3)
    assert (shapes.answers, shapes.empty) == (1, int(empty))


def test_a_cut_answer_and_a_call_whose_arguments_are_not_an_object_are_counted():
    shapes = Shapes()
    bad = {**CALL, "function": {"name": "f", "arguments": "[1]"}}
    shapes.add(
        {}, {"message": {"content": None, "tool_calls": [bad]}, "finish_reason": "length"}, 9
    )
    assert (shapes.truncated, shapes.malformed, shapes.lengths) == (1, 1, [9])
