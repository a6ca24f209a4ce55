"""The learning suite's tasks (issue 45 item 4: examples/antonyms, capitals, plurals and
lookup): each split is fixed and disjoint, the agent asks training questions only, and
each reward and referee score hand-made rollouts as their docstrings say, the referee
passing the reward's top grade alone. No engine."""

from __future__ import annotations

import pytest

from examples.antonyms import task as antonyms
from examples.arithmetic.demo import EXAMPLES, Options, example_of
from examples.capitals import task as capitals
from examples.lookup import task as lookup
from examples.plurals import task as plurals
from onjob.judge import Rollout

SUITE = ("antonyms", "capitals", "plurals", "lookup")


def answered(task, q: str, answer: str) -> Rollout:
    return Rollout("m", [*task.messages(q), {"role": "assistant", "content": answer}])


@pytest.mark.parametrize("name", SUITE)
def test_each_task_has_a_fixed_disjoint_split_and_asks_training_questions(name):
    assert name in EXAMPLES
    ex = example_of(Options(example=name))
    task = __import__(f"examples.{name}.task", fromlist=["task"])
    assert ex.name == name and ex.reward == f"examples.{name}.task:reward"
    assert ex.referee == f"examples.{name}.task:referee"
    assert 25 <= len(task.HELDOUT) <= 30 and len(task.TRAIN) > len(task.HELDOUT)
    assert not set(task.TRAIN) & set(task.HELDOUT)
    assert len(set(task.TRAIN)) == len(task.TRAIN)
    assert ex.heldout(30) == task.HELDOUT[:30] and ex.heldout(1) == task.HELDOUT[:1]
    for seed in (1, 2, 3):
        asked = ex.questions(seed)
        assert asked and set(asked) <= set(task.TRAIN)
        assert ex.questions(seed) == asked  # a seed's questions are always the same
    assert ex.questions(1) != ex.questions(2)
    assert ex.first_messages(task.HELDOUT[0])[-1]["role"] == "user"
    assert ex.sample_tokens > 0


def test_the_split_is_the_one_in_the_docstrings():
    assert (len(antonyms.HELDOUT), len(antonyms.TRAIN)) == (30, 88)
    assert (len(capitals.HELDOUT), len(capitals.TRAIN)) == (30, 80)
    assert (len(plurals.HELDOUT), len(plurals.TRAIN)) == (30, 70)
    assert (len(lookup.HELDOUT), len(lookup.TRAIN)) == (30, 90)
    # Seeded: every import draws the same split.
    assert antonyms.HELDOUT[0] == 'What is the opposite of "import"?'
    assert lookup.HELDOUT[0] == "How many units of item 1017 are in stock?"


def test_antonyms_give_partial_credit_and_the_referee_passes_the_word_alone():
    q = 'What is the opposite of "hot"?'
    grades = {
        "cold": 1.0,
        "Cold.": 1.0,
        '"cold"': 1.0,
        "The opposite of hot is cold.": 0.5,
        "cold or warm": 0.5,
        "warm": 0.0,
        "coldness": 0.0,
        "": 0.0,
    }
    for answer, grade in grades.items():
        rollout = answered(antonyms, q, answer)
        assert antonyms.reward(rollout) == grade, answer
        assert antonyms.referee(rollout) == (grade == 1.0), answer
    # Any accepted opposite, whatever the question's own wording in the prompt.
    assert antonyms.reward(answered(antonyms, 'What is the opposite of "big"?', "Little")) == 1
    assert antonyms.messages(q)[-1]["content"].endswith("Answer with one word.")


def test_capitals_are_scored_exactly():
    q = "What is the capital of Peru?"
    right = [
        "Lima",
        "Lima.",
        "**lima**",
        "The capital of Peru is Lima.",
        "The capital is Lima",
        "Lima is the capital of Peru.",
        "The capital city of Peru is Lima.",
    ]
    wrong = [
        "Lima, Peru",
        "Cusco",
        "Lima or Cusco",
        "The capital of Peru is Lima, a big city.",
        "The capital of Chile is Lima.",
        "",
    ]
    for answer in right:
        assert capitals.reward(answered(capitals, q, answer)) == 1.0, answer
        assert capitals.referee(answered(capitals, q, answer)) is True, answer
    for answer in wrong:
        assert capitals.reward(answered(capitals, q, answer)) == 0.0, answer
        assert capitals.referee(answered(capitals, q, answer)) is False, answer
    # Accents, punctuation and the article are forgiven, and any accepted name passes.
    assert capitals.exact("What is the capital of Colombia?", "Bogota")
    assert capitals.exact("What is the capital of Colombia?", "Bogotá.")
    us = "What is the capital of the United States?"
    assert capitals.exact(us, "Washington, D.C.") and capitals.exact(us, "Washington")
    assert capitals.exact(us, "The capital of the United States is Washington, D.C.")
    assert capitals.exact("What is the capital of the Netherlands?", "Amsterdam")
    assert not capitals.exact(us, "New York City")


def test_plurals_give_partial_credit_and_the_referee_passes_the_plain_answer():
    q = 'What is the plural of "mouse"?'
    grades = {
        "mice": 1.0,
        "Mice.": 1.0,
        'The plural of "mouse" is "mice".': 1.0,
        "The plural form of mouse is mice.": 1.0,
        'The plural of "mouse" is "mice". It is irregular.': 0.5,
        "mice or mouses": 0.5,
        "mouses": 0.0,
        "The plural of mouse is mouse.": 0.0,
        "": 0.0,
    }
    for answer, grade in grades.items():
        rollout = answered(plurals, q, answer)
        assert plurals.reward(rollout) == grade, answer
        assert plurals.referee(rollout) == (grade == 1.0), answer
    assert plurals.exact('What is the plural of "person"?', "persons")  # either accepted form
    assert all(n not in forms for n, forms in plurals.PLURALS.items())  # never the noun itself


def test_the_lookup_reward_scores_each_step_on_the_step_it_takes():
    q = lookup.HELDOUT[0]
    item, count = lookup.item_of(q), lookup.STOCK[lookup.item_of(q)]
    asked = lookup.messages(q)
    call = {"id": "c1", "type": "function"}
    call["function"] = {"name": "lookup", "arguments": f'{{"item": {item}}}'}
    as_text = {**call, "function": {"name": "lookup", "arguments": f'{{"item": "{item}"}}'}}
    wrong = {**call, "function": {"name": "lookup", "arguments": '{"item": 12}'}}
    other = {**call, "function": {"name": "multiply", "arguments": f'{{"item": {item}}}'}}

    def reward(message: dict) -> float:
        return lookup.reward(Rollout("m", [*asked, {"role": "assistant", **message}]))

    # A right call is as good as a right answer.
    assert reward({"content": f"There are {count} units in stock."}) == 1.0
    assert reward({"content": None, "tool_calls": [call]}) == 1.0
    assert reward({"content": None, "tool_calls": [as_text]}) == 1.0
    assert reward({"content": None, "tool_calls": [wrong]}) == 0.0
    assert reward({"content": None, "tool_calls": [other]}) == 0.0
    assert reward({"content": None, "tool_calls": [call, wrong]}) == 0.5
    assert reward({"content": f"There are {count}0 units."}) == 0.0
    assert reward({"content": f"Item {item} is in stock."}) == 0.0
    called = [*asked, {"role": "assistant", "content": None, "tool_calls": [call]}]
    result = lookup.lookup(call["function"]["arguments"])
    assert result == f"Item {item}: {count} units in stock."
    known = [*called, {"role": "tool", "tool_call_id": "c1", "content": result}]
    again = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert lookup.reward(Rollout("m", [*known, again])) == 0.0  # no progress
    answer = {"role": "assistant", "content": f"{count} units."}
    assert lookup.reward(Rollout("m", [*known, answer])) == 1.0
    assert lookup.reward(Rollout("m", [*known, answer], kind="trajectory")) == 1.0
    # A whole conversation that ends on a call was never answered.
    assert lookup.reward(Rollout("m", called, kind="trajectory")) == 0.0
    assert lookup.referee(Rollout("m", called)) is True
    wrong_turn = [*asked, {"role": "assistant", "content": None, "tool_calls": [wrong]}]
    assert lookup.referee(Rollout("m", wrong_turn)) is False
    assert lookup.lookup('{"item": 12}') == "error: no item 12 in the stock table"
    assert lookup.lookup('{"code": 1}').startswith("error:")
    assert lookup.lookup("not json").startswith("error:")


def test_the_lookup_example_asks_each_question_several_times_in_a_row():
    from examples.lookup.example import ASKED, EXAMPLE

    asked = EXAMPLE.questions(1)
    assert len(asked) == 2 * ASKED and len(set(asked)) < len(asked)
    assert all(asked[i] == asked[i - i % ASKED] for i in range(len(asked)))
    assert lookup.TOOLS[0]["function"]["name"] == "lookup"
