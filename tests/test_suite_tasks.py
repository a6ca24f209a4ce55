"""The learning suite's tasks (issue 45 item 4: examples/antonyms, capitals, plurals and
lookup; then languages, extract, sentiment and weather; then library; then flights): each
split is fixed and disjoint, the agent asks training questions only, and each reward and
referee score hand-made rollouts as their docstrings say, the referee passing the reward's
top grade alone. No engine."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageToolCall

from examples import tool_agent
from examples.antonyms import task as antonyms
from examples.arithmetic.demo import EXAMPLES, Options, example_of
from examples.capitals import task as capitals
from examples.extract import task as extract
from examples.flights import task as flights
from examples.languages import task as languages
from examples.library import task as library
from examples.lookup import task as lookup
from examples.plurals import task as plurals
from examples.sentiment import task as sentiment
from examples.weather import task as weather
from onjob.judge import Rollout

SUITE = (
    "antonyms",
    "capitals",
    "plurals",
    "lookup",
    "languages",
    "extract",
    "sentiment",
    "weather",
    "library",
    "flights",
)


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
    assert (len(languages.HELDOUT), len(languages.TRAIN)) == (30, 81)
    assert (len(extract.HELDOUT), len(extract.TRAIN)) == (30, 90)
    assert (len(sentiment.HELDOUT), len(sentiment.TRAIN)) == (30, 90)
    assert (len(weather.HELDOUT), len(weather.TRAIN)) == (30, 90)
    assert (len(library.HELDOUT), len(library.TRAIN)) == (30, 90)
    assert (len(flights.HELDOUT), len(flights.TRAIN)) == (30, 90)
    # Seeded: every import draws the same split.
    assert antonyms.HELDOUT[0] == 'What is the opposite of "import"?'
    assert lookup.HELDOUT[0] == "How many units of item 1017 are in stock?"
    assert languages.HELDOUT[0] == "What language is spoken in Mozambique?"
    assert extract.HELDOUT[0] == (
        'Message: "Clara Keller called on May 21 about order 90161, which is stuck in '
        'Bergen."\nWhat is the order number in this message?'
    )
    assert sentiment.HELDOUT[0] == (
        'Review: "The backpack broke after two days. Do not buy it."\n'
        "Is this review positive, negative or neutral? Answer with one word."
    )
    assert weather.HELDOUT[0] == "What is the temperature today in the town of Coldton?"
    assert library.HELDOUT[0] == 'Which shelf is "The Crimson Harbor" on?'
    assert flights.HELDOUT[0] == "When does boarding start for the flight to Marovo?"
    # The made-up tables are drawn the same way each time, and asked evenly.
    assert [extract.FIELDS[q]["asked"] for q in list(extract.FIELDS)[:4]] == [
        "order",
        "name",
        "city",
        "date",
    ]
    assert sorted(sentiment.REVIEWS.values()) == sorted([*sentiment.LABELS] * 40)
    assert len({city_id for city_id, _, _ in weather.TOWNS.values()}) == len(weather.TOWNS)
    assert len(library.CODES) == len(library.BOOKS)
    assert len(flights.CODES) == len(flights.FLIGHTS)
    # Each flight's question asks one field, the three in turn.
    assert [f.asked for f in list(flights.FLIGHTS.values())[:4]] == [
        "gate",
        "boarding",
        "terminal",
        "gate",
    ]
    assert sorted(flights.asked(q)[1] for q in [*flights.HELDOUT, *flights.TRAIN]) == sorted(
        [*flights.ASKED] * 40
    )


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


def test_languages_give_partial_credit_to_rambling_and_the_referee_passes_it_said_plainly():
    q = "What language is spoken in Brazil?"
    grades = {
        "Portuguese": 1.0,
        "Portuguese.": 1.0,
        "**portuguese**": 1.0,
        "The official language of Brazil is Portuguese.": 1.0,
        "In Brazil, people speak Portuguese.": 1.0,
        # Rambling: past the word limit, a second sentence, or prose cut at max_tokens.
        "In Brazil, the official language is Portuguese, which is the most widely spoken "
        "native language.": 0.5,
        "Portuguese. It is also spoken in Angola.": 0.5,
        "Brazil speaks Portuguese, a language that came over from Portugal in the sixteenth "
        "century and": 0.5,
        # A list of candidates names another language.
        "Spanish and Portuguese": 0.5,
        "Spanish": 0.0,
        "Brazilian.": 0.0,
        "": 0.0,
    }
    for answer, grade in grades.items():
        rollout = answered(languages, q, answer)
        assert languages.reward(rollout) == grade, answer
        assert languages.referee(rollout) == (grade == 1.0), answer
    # Any accepted language, and several when each is accepted.
    assert languages.exact("What language is spoken in Canada?", "English and French.")
    assert languages.exact("What language is spoken in Iran?", "Farsi")
    assert languages.grade("What language is spoken in Iran?", "Arabic") == 0.0
    assert languages.MAX_TOKENS < 32  # short enough that rambling is cut
    assert languages.messages(q)[-1]["content"].startswith(q)


def test_extract_gives_partial_credit_and_the_referee_passes_the_field_alone():
    q = extract.HELDOUT[0]
    fields = extract.FIELDS[q]
    assert fields["asked"] == "order" and extract.field(q) == fields["order"] == "90161"
    name, city, date = fields["name"], fields["city"], fields["date"]
    grades = {
        "90161": 1.0,
        "90161.": 1.0,
        '"90161"': 1.0,
        "#90161": 1.0,
        "The order number is 90161.": 1.0,
        "The order number in this message is 90161.": 1.0,
        "Order 90161": 0.5,
        "The order number is 90161, which is stuck.": 0.5,
        "It is the order number 90161.": 0.5,
        # Another field named besides: an echo of the message scores nothing.
        f"The order number is 90161, placed by {name}.": 0.0,
        f"Order 90161 is stuck in {city} since {date}.": 0.0,
        q.split('"')[1]: 0.0,
        "901610": 0.0,
        "9016": 0.0,
        "": 0.0,
    }
    for answer, grade in grades.items():
        rollout = answered(extract, q, answer)
        assert extract.reward(rollout) == grade, answer
        assert extract.referee(rollout) == (grade == 1.0), answer
    who = next(q for q in extract.TRAIN if extract.FIELDS[q]["asked"] == "name")
    whole = extract.field(who)
    assert extract.exact(who, whole) and extract.exact(who, f"The customer's name is {whole}.")
    assert extract.grade(who, whole.split()[0]) == 0.0  # half a name
    when = next(q for q in extract.TRAIN if extract.FIELDS[q]["asked"] == "date")
    assert extract.exact(when, extract.field(when) + "th")  # "March 14th"
    assert extract.exact(when, f"The date is {extract.field(when)}.")
    assert not extract.exact(when, f"The order number is {extract.field(when)}.")
    assert extract.messages(q)[0]["role"] == "system"


def test_sentiment_gives_partial_credit_and_the_referee_passes_the_label_alone():
    q = sentiment.HELDOUT[0]
    assert sentiment.label(q) == "negative"
    grades = {
        "negative": 1.0,
        "Negative.": 1.0,
        '"negative"': 1.0,
        "This review is negative.": 0.5,
        "Negative. The backpack broke.": 0.5,
        "Negative, not positive.": 0.0,  # a hedge between two labels
        "It is mostly positive, partly negative.": 0.0,
        "positive": 0.0,
        "neutral": 0.0,
        "bad": 0.0,
        "": 0.0,
    }
    for answer, grade in grades.items():
        rollout = answered(sentiment, q, answer)
        assert sentiment.reward(rollout) == grade, answer
        assert sentiment.referee(rollout) == (grade == 1.0), answer
    assert sentiment.messages(q) == [{"role": "user", "content": q}]
    assert q.endswith("Answer with one word.")
    for q, label in sentiment.REVIEWS.items():  # each review is its label's sentences
        text = q.split('"')[1]
        ends = [k for k, (_, general) in sentiment.SENTENCES.items() if text.endswith(general)]
        assert ends == [label], q


def _call(name: str, arguments: dict, call_id: str = "c1") -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def test_the_weather_reward_scores_each_step_on_the_step_it_takes():
    q = weather.HELDOUT[0]
    town = weather.town_of(q)
    city_id, degrees, _ = weather.TOWNS[town]
    asked = weather.messages(q)
    find = _call("find_city", {"name": town})
    find_lower = _call("find_city", {"name": town.lower()})
    find_wrong = _call("find_city", {"name": "Springfield"})
    cast = _call("forecast", {"city_id": city_id})
    cast_text = _call("forecast", {"city_id": str(city_id)})
    cast_wrong = _call("forecast", {"city_id": 12})
    other = _call("lookup", {"name": town})

    def reward(prompt: list[dict], message: dict, kind: str = "turn") -> float:
        return weather.reward(Rollout("m", [*prompt, {"role": "assistant", **message}], kind))

    def calls(*made: dict) -> dict:
        return {"content": None, "tool_calls": list(made)}

    # The first step: find_city with the town (any case); forecast with its id is right too.
    assert reward(asked, calls(find)) == 1.0
    assert reward(asked, calls(find_lower)) == 1.0
    assert reward(asked, calls(cast)) == reward(asked, calls(cast_text)) == 1.0
    assert reward(asked, calls(find_wrong)) == 0.0
    assert reward(asked, calls(cast_wrong)) == 0.0
    assert reward(asked, calls(other)) == 0.0
    assert reward(asked, calls(find, find_wrong)) == 0.5
    assert reward(asked, {"content": f"It is {degrees} degrees."}) == 1.0  # a lucky guess
    assert reward(asked, {"content": "It is sunny."}) == 0.0
    # The second: once the id is known, forecast with it; find_city again is no progress.
    found = weather.find_city(find["function"]["arguments"])
    assert found.startswith(f"{town}: city id {city_id}.")
    known_id = [
        *asked,
        {"role": "assistant", "content": None, "tool_calls": [find]},
        {"role": "tool", "tool_call_id": "c1", "content": found},
    ]
    assert reward(known_id, calls(cast)) == 1.0
    assert reward(known_id, calls(find)) == 0.0
    assert reward(known_id, calls(cast_wrong)) == 0.0
    assert reward(known_id, calls(cast, find)) == 0.5
    # The third: once the weather is known, an answer with the temperature; any call, 0.
    weather_now = weather.forecast(cast["function"]["arguments"])
    assert weather_now.startswith(f"City {city_id} ({town}): {degrees} degrees Celsius, ")
    known = [
        *known_id,
        {"role": "assistant", "content": None, "tool_calls": [cast]},
        {"role": "tool", "tool_call_id": "c1", "content": weather_now},
    ]
    assert reward(known, calls(cast)) == 0.0
    assert reward(known, {"content": f"It is {degrees} degrees Celsius in {town}."}) == 1.0
    assert reward(known, {"content": f"{degrees}"}, kind="trajectory") == 1.0
    assert reward(known, {"content": f"It is 1{degrees} degrees."}) == 0.0
    assert reward(known, {"content": f"It is {degrees}5 degrees."}) == 0.0
    assert reward(known, {"content": f"City {city_id}."}) == 0.0
    # A whole conversation that ends on a call was never answered.
    assert reward(known_id, calls(cast), kind="trajectory") == 0.0
    assert weather.referee(Rollout("m", [*asked, {"role": "assistant", **calls(find)}]))
    assert not weather.referee(Rollout("m", [*asked, {"role": "assistant", **calls(cast_wrong)}]))
    assert weather.right_call(q, find) and not weather.right_call(q, find, id_known=True)
    # The tools answer errors as text, as a real tool would.
    assert weather.find_city('{"name": "Springfield"}') == "error: no town named 'Springfield'"
    assert weather.forecast('{"city_id": 12}') == "error: no city with id 12"
    for bad in ("not json", "[1]", '{"town": 1}'):
        assert weather.find_city(bad).startswith("error:"), bad
    for bad in ("not json", '{"city_id": "x"}', '{"id": 1}'):
        assert weather.forecast(bad).startswith("error:"), bad
    assert [t["function"]["name"] for t in weather.TOOLS] == ["find_city", "forecast"]


class ScriptedClient:
    """An `openai` client whose model answers from a script, one message per request,
    keeping each request's arguments."""

    def __init__(self, script: list[ChatCompletionMessage]):
        self.script, self.requests = list(script), []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **request):
        self.requests.append(request)
        return SimpleNamespace(choices=[SimpleNamespace(message=self.script.pop(0))])


def _said(content: str | None = None, *made: dict) -> ChatCompletionMessage:
    tool_calls = [ChatCompletionMessageToolCall(**call) for call in made] or None
    return ChatCompletionMessage(role="assistant", content=content, tool_calls=tool_calls)


def test_the_weather_agent_runs_both_tools_by_name_and_forces_its_first_two_turns():
    from examples.weather.agent import FORCED_TURNS, solve

    q = weather.TRAIN[0]
    town = weather.town_of(q)
    city_id, degrees, _ = weather.TOWNS[town]
    client = ScriptedClient(
        [
            _said(None, _call("find_city", {"name": town}, "c1")),
            _said(None, _call("forecast", {"city_id": city_id}, "c2")),
            _said(f"It is {degrees} degrees Celsius."),
        ]
    )
    answer, turns, calls, right_first = solve(client, "agent", q)
    assert (turns, calls, right_first) == (3, 2, True) and weather.correct(q, answer)
    forced = [r.get("tool_choice") for r in client.requests]
    assert FORCED_TURNS == 2 and forced == ["required", "required", None]
    sent = client.requests[-1]["messages"]
    results = [m["content"] for m in sent if m["role"] == "tool"]
    assert results == [
        weather.find_city(json.dumps({"name": town})),
        weather.forecast(json.dumps({"city_id": city_id})),
    ]
    # A call to a tool it was not given is answered with an error, the conversation goes on.
    client = ScriptedClient([_said(None, _call("lookup", {"item": 1})), _said("I cannot.")])
    answer, turns, calls, right_first = solve(client, "agent", q)
    assert (answer, turns, calls, right_first) == ("I cannot.", 2, 1, False)
    assert client.requests[1]["messages"][-1]["content"].startswith("error: no tool named")


def test_the_library_reward_scores_each_step_on_the_step_it_takes():
    q = library.HELDOUT[0]
    title = library.title_of(q)
    book = library.BOOKS[title]
    asked = library.messages(q)
    find = _call("find_book", {"title": title})
    find_loose = _call("find_book", {"title": f'"{title.lower().removeprefix("the ")}"'})
    find_wrong = _call("find_book", {"title": "The Great Gatsby"})
    where = _call("locate", {"code": book.code})
    where_lower = _call("locate", {"code": f" {book.code.lower()} "})
    where_wrong = _call("locate", {"code": "ZZ-0000"})

    def reward(prompt: list[dict], message: dict, kind: str = "turn") -> float:
        return library.reward(Rollout("m", [*prompt, {"role": "assistant", **message}], kind))

    def calls(*made: dict) -> dict:
        return {"content": None, "tool_calls": list(made)}

    # The first step: find_book with the title as a catalogue matches it; locate with its
    # code is right too.
    assert reward(asked, calls(find)) == reward(asked, calls(find_loose)) == 1.0
    assert reward(asked, calls(where)) == reward(asked, calls(where_lower)) == 1.0
    assert reward(asked, calls(find_wrong)) == reward(asked, calls(where_wrong)) == 0.0
    assert reward(asked, calls(_call("forecast", {"code": book.code}))) == 0.0
    assert reward(asked, calls(find, find_wrong)) == 0.5
    # The second: once the code is known, locate with it; find_book again is no progress.
    found = library.find_book(find["function"]["arguments"])
    assert found.startswith(f"{title}: book code {book.code}.")
    known_code = [
        *asked,
        {"role": "assistant", "content": None, "tool_calls": [find]},
        {"role": "tool", "tool_call_id": "c1", "content": found},
    ]
    assert reward(known_code, calls(where)) == 1.0
    assert reward(known_code, calls(find)) == 0.0
    assert reward(known_code, calls(where, find)) == 0.5
    # The third: once the shelf is known, an answer with it (any case); any call, 0; the
    # floor or the code alone is not the shelf.
    shelf_now = library.locate(where["function"]["arguments"])
    assert shelf_now == library.located(q)
    assert f"floor {book.floor}, shelf {book.shelf}, {book.out} of {book.copies}" in shelf_now
    known = [
        *known_code,
        {"role": "assistant", "content": None, "tool_calls": [where]},
        {"role": "tool", "tool_call_id": "c1", "content": shelf_now},
    ]
    assert reward(known, calls(where)) == 0.0
    assert reward(known, {"content": f"It is on shelf {book.shelf}, floor {book.floor}."}) == 1.0
    assert reward(known, {"content": f"Shelf {book.shelf.lower()}"}, kind="trajectory") == 1.0
    assert reward(known, {"content": f"Shelf 1{book.shelf}."}) == 0.0
    assert reward(known, {"content": f"Shelf {book.shelf}C."}) == 0.0
    assert reward(known, {"content": f"Floor {book.floor}, code {book.code}."}) == 0.0
    # A whole conversation that ends on a call was never answered.
    assert reward(known_code, calls(where), kind="trajectory") == 0.0
    assert library.referee(Rollout("m", [*asked, {"role": "assistant", **calls(find)}]))
    assert not library.referee(Rollout("m", [*asked, {"role": "assistant", **calls(where_wrong)}]))
    # The tools answer errors as text, as a real tool would.
    assert library.find_book('{"title": "Dune"}') == "error: no book titled 'Dune'"
    assert library.locate('{"code": "zz-1"}') == "error: no book with code 'ZZ-1'"
    for bad in ("not json", "[1]", '{"name": "x"}'):
        assert library.find_book(bad).startswith("error:"), bad
        assert library.locate(bad).startswith("error:"), bad
    assert [t["function"]["name"] for t in library.TOOLS] == ["find_book", "locate"]


def test_the_library_agent_runs_both_tools_by_name_and_forces_its_first_two_turns():
    from examples.library.agent import FORCED_TURNS, solve

    q = library.TRAIN[0]
    book = library.BOOKS[library.title_of(q)]
    client = ScriptedClient(
        [
            _said(None, _call("find_book", {"title": library.title_of(q)}, "c1")),
            _said(None, _call("locate", {"code": book.code}, "c2")),
            _said(f"Shelf {book.shelf}."),
        ]
    )
    answer, turns, calls, right_first = solve(client, "agent", q)
    assert (turns, calls, right_first) == (3, 2, True) and library.correct(q, answer)
    assert FORCED_TURNS == 2
    assert [r.get("tool_choice") for r in client.requests] == ["required", "required", None]
    sent = [m["content"] for m in client.requests[-1]["messages"] if m["role"] == "tool"]
    assert sent == [
        library.find_book(json.dumps({"title": library.title_of(q)})),
        library.located(q),
    ]


def _flights_question(field: str) -> str:
    """The first held-out question that asks `field`."""
    return next(q for q in flights.HELDOUT if flights.asked(q)[1] == field)


def test_the_flights_reward_scores_each_step_on_the_step_it_takes():
    q = _flights_question("gate")
    city = flights.city_of(q)
    flight = flights.FLIGHTS[city]
    asked = flights.messages(q)
    find = _call("find_flight", {"destination": city})
    find_loose = _call("find_flight", {"destination": f' "{city.lower()}" '})
    find_wrong = _call("find_flight", {"destination": "Paris"})
    status = _call("flight_status", {"code": flight.code})
    status_loose = _call("flight_status", {"code": flight.code.replace(" ", "").lower()})
    status_wrong = _call("flight_status", {"code": "ZZ 000"})

    def reward(prompt: list[dict], message: dict, kind: str = "turn") -> float:
        return flights.reward(Rollout("m", [*prompt, {"role": "assistant", **message}], kind))

    def calls(*made: dict) -> dict:
        return {"content": None, "tool_calls": list(made)}

    # The first step: find_flight with the city as a booking search matches it;
    # flight_status with its code is right too.
    assert reward(asked, calls(find)) == reward(asked, calls(find_loose)) == 1.0
    assert reward(asked, calls(status)) == reward(asked, calls(status_loose)) == 1.0
    assert reward(asked, calls(find_wrong)) == reward(asked, calls(status_wrong)) == 0.0
    assert reward(asked, calls(_call("locate", {"code": flight.code}))) == 0.0
    assert reward(asked, calls(find, find_wrong)) == 0.5
    # The second: once the code is known, flight_status with it; find_flight again is no
    # progress.
    found = flights.find_flight(find["function"]["arguments"])
    assert found.startswith(f"{city}: flight {flight.code}.")
    known_code = [
        *asked,
        {"role": "assistant", "content": None, "tool_calls": [find]},
        {"role": "tool", "tool_call_id": "c1", "content": found},
    ]
    assert reward(known_code, calls(status)) == 1.0
    assert reward(known_code, calls(find)) == 0.0
    assert reward(known_code, calls(status, find)) == 0.5
    # The third: once the status is known, an answer with the asked field (any case); any
    # call, 0; the other fields alone are not the gate.
    status_now = flights.flight_status(status["function"]["arguments"])
    assert status_now == flights.status(q)
    assert (
        f"terminal {flight.terminal}, gate {flight.gate}, boarding at {flight.boarding}"
        in status_now
    )
    known = [
        *known_code,
        {"role": "assistant", "content": None, "tool_calls": [status]},
        {"role": "tool", "tool_call_id": "c1", "content": status_now},
    ]
    assert reward(known, calls(status)) == 0.0
    assert reward(known, {"content": f"Gate {flight.gate}, terminal {flight.terminal}."}) == 1.0
    assert reward(known, {"content": f"gate {flight.gate.lower()}"}, kind="trajectory") == 1.0
    assert reward(known, {"content": f"Gate {flight.gate}0."}) == 0.0
    assert reward(known, {"content": f"Gate B{flight.gate}."}) == 0.0
    other = f"Terminal {flight.terminal}, boarding at {flight.boarding}, flight {flight.code}."
    assert reward(known, {"content": other}) == 0.0
    # A whole conversation that ends on a call was never answered.
    assert reward(known_code, calls(status), kind="trajectory") == 0.0
    assert flights.referee(Rollout("m", [*asked, {"role": "assistant", **calls(find)}]))
    assert not flights.referee(Rollout("m", [*asked, {"role": "assistant", **calls(status_wrong)}]))
    # The tools answer errors as text, as a real tool would.
    assert flights.find_flight('{"destination": "Paris"}') == "error: no flight to 'Paris' today"
    assert flights.flight_status('{"code": "zz 1"}') == "error: no flight with code 'ZZ 1'"
    for bad in ("not json", "[1]", '{"name": "x"}'):
        assert flights.find_flight(bad).startswith("error:"), bad
        assert flights.flight_status(bad).startswith("error:"), bad
    assert [t["function"]["name"] for t in flights.TOOLS] == ["find_flight", "flight_status"]


def test_the_flights_questions_ask_one_field_each_and_the_answer_must_hold_it():
    for field in ("gate", "boarding", "terminal"):
        q = _flights_question(field)
        flight = flights.FLIGHTS[flights.city_of(q)]
        assert flights.asked(q) == (flights.city_of(q), field)
        assert flights.answer_of(q) == getattr(flight, field)
        everything = (
            f"Terminal {flight.terminal}, gate {flight.gate}, boarding at {flight.boarding}."
        )
        assert flights.correct(q, everything)  # the other fields beside it do not matter
        assert not flights.correct(q, None) and not flights.correct(q, f"Flight {flight.code}.")
    boarding = _flights_question("boarding")
    time = flights.answer_of(boarding)
    assert flights.correct(boarding, f"Boarding starts at {time}.")
    assert not flights.correct(boarding, f"Boarding starts at 1{time}.")
    assert not flights.correct(boarding, f"Boarding starts at {time}5.")
    assert not flights.correct(boarding, f"Boarding starts at {time}:00.")
    terminal = _flights_question("terminal")
    number = flights.answer_of(terminal)
    assert flights.correct(terminal, f"It leaves from TERMINAL {number}.")
    assert not flights.correct(terminal, f"Terminal {number}0.")
    # A digit alone is held by chance: the terminal counts named as one.
    assert not flights.correct(terminal, number) and not flights.correct(terminal, f"Gate {number}")
    with pytest.raises(ValueError):
        flights.asked("What is the capital of Peru?")


def test_the_flights_agent_runs_both_tools_by_name_and_forces_its_first_two_turns():
    from examples.flights.agent import FORCED_TURNS, solve

    q = flights.TRAIN[0]
    city = flights.city_of(q)
    flight = flights.FLIGHTS[city]
    client = ScriptedClient(
        [
            _said(None, _call("find_flight", {"destination": city}, "c1")),
            _said(None, _call("flight_status", {"code": flight.code}, "c2")),
            _said(f"Terminal {flight.terminal}, gate {flight.gate}, boarding {flight.boarding}."),
        ]
    )
    answer, turns, calls, right_first = solve(client, "agent", q)
    assert (turns, calls, right_first) == (3, 2, True) and flights.correct(q, answer)
    assert FORCED_TURNS == 2
    assert [r.get("tool_choice") for r in client.requests] == ["required", "required", None]
    sent = [m["content"] for m in client.requests[-1]["messages"] if m["role"] == "tool"]
    assert sent == [flights.find_flight(json.dumps({"destination": city})), flights.status(q)]


def test_a_one_tool_agent_still_runs_its_tool_whatever_the_name_and_forces_one_turn():
    call = SimpleNamespace(function=SimpleNamespace(name="anything", arguments='{"a": 2}'))
    assert tool_agent.run(lambda arguments: f"ran {arguments}", call) == 'ran {"a": 2}'
    q = lookup.TRAIN[0]
    client = ScriptedClient(
        [_said(None, _call("lookup", {"item": lookup.item_of(q)})), _said("ok")]
    )
    tool_agent.solve(client, "agent", q, lookup, lookup.lookup)
    assert [r.get("tool_choice") for r in client.requests] == ["required", None]


@pytest.mark.parametrize("name", ["weather", "library", "flights"])
def test_a_two_tool_example_asks_each_question_several_times_in_a_row(name):
    example = __import__(f"examples.{name}.example", fromlist=["example"])
    ASKED, EXAMPLE = example.ASKED, example.EXAMPLE

    asked = EXAMPLE.questions(1)
    assert len(asked) == 2 * ASKED and len(set(asked)) < len(asked)
    assert all(asked[i] == asked[i - i % ASKED] for i in range(len(asked)))
