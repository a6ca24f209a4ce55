"""A stateless Responses loop (`store` true or false, no `previous_response_id`: the client
re-sends its whole input each turn) is placed in trajectories exactly as the same
conversation over chat completions is (issue 67): the same turn numbers, the same turns
together, a fork apart. Each conversation is played by one `Agent` per API: chat (the
assistant's message echoed back whole, then `tool` messages) or Responses (output items
echoed back in one of the shapes clients send, whole or streamed; the issue's loop hands
back only the first `function_call`), through the real `openai` client against a real
`onjob serve` and a local engine whose model answers the question with text and two
calls, and read back from its DuckDB file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from openai import OpenAI

from onjob.cli.process import EngineProcess, ServerProcess

from .conftest import TOOLS, rows, teach

FLAT_TOOL = {"type": "function", **TOOLS[0]["function"]}
ASK = {"model": "twocalls", "temperature": 0}
QUESTION = "What's the weather in Rome and in Paris?"
ANSWER = "Checking both.\n" + "\n".join(
    f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'
    for city in ("Rome", "Paris")
)


@pytest.fixture(scope="module")
def two_calls_engine(tmp_path_factory, tokenizer):
    """The tiny model taught to answer QUESTION with a sentence and two calls, served as
    `twocalls`: an answer a client hands back in part."""
    model = teach(
        tokenizer,
        [([{"role": "user", "content": QUESTION}], TOOLS, ANSWER)],
        tmp_path_factory.mktemp("two-calls"),
    )
    args = ["--model", str(model), "--served-model-name", "twocalls", "--threads", "1"]
    with EngineProcess(args) as proc:
        yield proc


def echoed_whole(item) -> dict:
    """An output item as the issue's client echoes it: `model_dump(exclude_none=True)`."""
    return item.model_dump(exclude_none=True)


def echoed_bare(item) -> dict:
    """An output item rebuilt by hand: no `id`, no `status`; a message as its role and
    `output_text` parts, a call as its `call_id`, `name` and `arguments`."""
    if item.type == "function_call":
        return {
            "type": "function_call",
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.arguments,
        }
    parts = [{"type": "output_text", "text": p.text} for p in item.content]
    return {"type": "message", "role": item.role, "content": parts}


def echoed_as_is(item):
    """The SDK's own object (`input += r.output`)."""
    return item


@dataclass
class Agent:
    """One conversation's client: `ask` sends the history and keeps the answer, `echo` adds
    the answer to the history, `results` a tool result per call of it, `say` a user
    message, `fork` a copy that goes on differently. `ids` are the exchanges it made."""

    client: OpenAI
    api: str  # "chat" or "responses"
    stream: bool = False
    shape: object = echoed_whole  # how a Responses client echoes an output item
    store: bool = False
    history: list = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    last: list = field(default_factory=list)  # chat: [message]; responses: its output items

    def say(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})

    @property
    def most(self) -> int:
        """Tokens for an answer: room for the two calls first, a few words after."""
        return 80 if not self.ids else 16

    def ask(self, tool_choice: str = "auto") -> None:
        if self.api == "chat":
            self._chat(tool_choice)
        else:
            self._responses(tool_choice)

    def _chat(self, tool_choice: str) -> None:
        ask = {**ASK, "messages": self.history, "tools": TOOLS, "tool_choice": tool_choice}
        ask["max_tokens"] = self.most
        if not self.stream:
            answer = self.client.chat.completions.create(**ask)
            self.ids.append(answer.id)
            self.last = [answer.choices[0].message.model_dump(exclude_none=True)]
            return
        text, calls, answer_id = "", {}, None
        for chunk in self.client.chat.completions.create(**ask, stream=True):
            answer_id = chunk.id
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for c in choice.delta.tool_calls or ():
                    call = calls.setdefault(
                        c.index, {"type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    call["id"] = c.id or call.get("id")
                    call["function"]["name"] += (c.function and c.function.name) or ""
                    call["function"]["arguments"] += (c.function and c.function.arguments) or ""
        message: dict = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        self.ids.append(answer_id)
        self.last = [message]

    def _responses(self, tool_choice: str) -> None:
        ask = {**ASK, "input": self.history, "tools": [FLAT_TOOL], "tool_choice": tool_choice}
        ask |= {"max_output_tokens": self.most, "store": self.store}
        if not self.stream:
            response = self.client.responses.create(**ask)
        else:
            events = list(self.client.responses.create(**ask, stream=True))
            assert events[-1].type in ("response.completed", "response.incomplete")
            response = events[-1].response
        self.ids.append(response.id)
        self.last = list(response.output)

    def calls(self) -> list[tuple[str, str]]:
        """(call id, function name) of each call in the last answer."""
        if self.api == "chat":
            return [(c["id"], c["function"]["name"]) for c in self.last[0].get("tool_calls", ())]
        return [(i.call_id, i.name) for i in self.last if i.type == "function_call"]

    def said(self) -> str:
        """The last answer's text."""
        if self.api == "chat":
            return self.last[0].get("content") or ""
        return "".join(p.text for i in self.last if i.type == "message" for p in i.content)

    def echo(self, *, first_call: bool = False) -> None:
        """The last answer into the history: chat's message whole; Responses' output items,
        or (`first_call`) its first `function_call` alone, as the issue's client does."""
        if self.api == "chat":
            self.history += self.last
            return
        kept = self.last
        if first_call:
            kept = [next(i for i in self.last if i.type == "function_call")]
        self.history += [self.shape(item) for item in kept]

    def results(self, output: str, *, first_call: bool = False) -> None:
        """A tool result for each call of the last answer (`first_call`: the first's)."""
        for call_id, _ in self.calls()[: 1 if first_call else None]:
            if self.api == "chat":
                self.history.append({"role": "tool", "tool_call_id": call_id, "content": output})
            else:
                self.history.append(
                    {"type": "function_call_output", "call_id": call_id, "output": output}
                )

    def fork(self) -> Agent:
        return Agent(
            self.client,
            self.api,
            self.stream,
            self.shape,
            self.store,
            list(self.history),
            last=self.last,
        )


def the_issues_loop(agent: Agent, tool_choice: str = "required") -> list[Agent]:
    """The issue's loop: calls, the first handed back with its output, an answer."""
    agent.say(QUESTION)
    agent.ask(tool_choice)
    assert len(agent.calls()) == 2, "the taught model makes two calls"
    if tool_choice == "auto":
        assert agent.said(), "and says something first, which the loop leaves out"
    agent.echo(first_call=True)
    agent.results('{"celsius": 24}', first_call=True)
    agent.ask()
    return [agent]


def the_issues_loop_unforced(agent: Agent) -> list[Agent]:
    """The same, the text before the calls left out too."""
    return the_issues_loop(agent, "auto")


def three_turns(agent: Agent) -> list[Agent]:
    """Calls (all handed back), an answer in words (as a message), a next question."""
    agent.say(QUESTION)
    agent.ask()
    agent.echo()
    agent.results('{"celsius": 24}')
    agent.ask("none")
    assert not agent.calls(), "tool_choice none answers in words"
    agent.echo()
    agent.say("And tomorrow?")
    agent.ask("none")
    return [agent]


def a_fork(agent: Agent) -> list[Agent]:
    """One first turn, then two different second turns after it."""
    agent.say(QUESTION)
    agent.ask()
    agent.echo()
    other = agent.fork()
    agent.results('{"celsius": 24}')
    agent.ask()
    other.results('{"celsius": 3}')
    other.ask()
    return [agent, other]


SCENARIOS = {
    "loop": the_issues_loop,
    "loop-unforced": the_issues_loop_unforced,
    "three": three_turns,
    "fork": a_fork,
}
# Each Responses client's way: (streamed, how it echoes output items, store).
VARIANTS = {
    "whole": (False, echoed_whole, False),
    "streamed": (True, echoed_whole, False),
    "bare": (False, echoed_bare, False),
    "bare-streamed": (True, echoed_bare, True),
    "objects": (False, echoed_as_is, True),
}
# Chat's loops, the reference: whole and streamed.
CHAT = {"chat": False, "chat-streamed": True}

# What chat completions give each scenario: (trajectory, turn) of each exchange in order,
# trajectories numbered as they first appear. A fork starts a new trajectory.
EXPECTED = {
    "loop": [(0, 0), (0, 1)],
    "loop-unforced": [(0, 0), (0, 1)],
    "three": [(0, 0), (0, 1), (0, 2)],
    "fork": [(0, 0), (0, 1), (1, 0)],
}


def placed(db, ids: list[str]) -> list[tuple[int, int]]:
    """(trajectory, turn) of each exchange, trajectories numbered by first appearance."""
    logged = {r["id"]: r for r in rows(db, "SELECT id, trajectory_id, turn FROM exchanges")}
    names: dict[str, int] = {}
    return [
        (names.setdefault(logged[i]["trajectory_id"], len(names)), logged[i]["turn"]) for i in ids
    ]


def test_stateless_responses_loops_are_stitched_as_their_chat_loops(tmp_path, two_calls_engine):
    # One API key per conversation: trajectories never span keys, so two conversations of
    # the same words (every scenario asks the same question) cannot stitch into each other.
    runs = [(s, v) for s in SCENARIOS for v in [*CHAT, *VARIANTS]]
    keys = {f"{s}-{v}": f"sk-{s}-{v}" for s, v in runs}
    env = {"ONJOB_PROXY__API_KEYS": json.dumps(keys)}
    db = tmp_path / "onjob.duckdb"
    made: dict[tuple[str, str], list[str]] = {}
    with ServerProcess(["--engine-url", two_calls_engine.url, "--db", str(db)], env=env) as server:
        for scenario, variant in runs:
            client = OpenAI(
                base_url=server.url, api_key=keys[f"{scenario}-{variant}"], max_retries=0
            )
            if variant in CHAT:
                agent = Agent(client, "chat", stream=CHAT[variant])
            else:
                stream, shape, store = VARIANTS[variant]
                agent = Agent(client, "responses", stream=stream, shape=shape, store=store)
            agents = SCENARIOS[scenario](agent)
            made[scenario, variant] = [i for a in agents for i in a.ids]

    for (scenario, variant), ids in made.items():
        assert placed(db, ids) == EXPECTED[scenario], (scenario, variant)


def test_stateless_responses_loops_across_two_servers_are_stitched_as_chat_is(
    tmp_path, two_calls_engine
):
    # The turns alternate between the primary and a proxy-only server (each computes the
    # keys of what it serves and spools them; the primary loads both).
    runs = [(s, v) for s in ("loop", "three") for v in ("chat", "whole", "streamed")]
    keys = {f"{s}-{v}": f"sk-{s}-{v}" for s, v in runs}
    env = {"ONJOB_PROXY__API_KEYS": json.dumps(keys)}
    db = str(tmp_path / "onjob.duckdb")
    engine = ["--engine-url", two_calls_engine.url, "--db", db]
    primary = ServerProcess(engine, env=env, log=tmp_path / "primary.log").start()
    made: dict[tuple[str, str], list[str]] = {}
    try:
        with ServerProcess(
            [*engine, "--primary", primary.base], env=env, log=tmp_path / "proxy.log"
        ) as proxy:
            for scenario, variant in runs:
                clients = [
                    OpenAI(
                        base_url=server.url, api_key=keys[f"{scenario}-{variant}"], max_retries=0
                    )
                    for server in (primary, proxy)
                ]
                api = "chat" if variant == "chat" else "responses"
                agent = Alternating(clients, api, stream=variant == "streamed")
                made[scenario, variant] = SCENARIOS[scenario](agent)[0].ids
    finally:
        primary.stop()
    for (scenario, variant), ids in made.items():
        assert placed(db, ids) == EXPECTED[scenario], (scenario, variant)


class Alternating(Agent):
    """An agent whose every turn goes to the next of its servers' clients."""

    def __init__(self, clients: list[OpenAI], api: str, *, stream: bool) -> None:
        super().__init__(clients[0], api, stream=stream)
        self.clients = clients

    def ask(self, tool_choice: str = "auto") -> None:
        self.client = self.clients[len(self.ids) % len(self.clients)]
        super().ask(tool_choice)
