"""Users first: the local engine serves a request of a lower `priority` (vLLM's meaning,
a user's is 0) before onjob's own background work, parks background rows to make room,
prefills a background prompt by chunks while a user's request decodes, and every
background answer still comes out whole and as it would alone. A real tiny model and the
real batcher in process, then a real engine process over HTTP with the openai client."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from onjob.cli.process import EngineProcess
from onjob.engine.batching import Batcher
from onjob.engine.model import LoadedModel
from onjob.engine.sampling import Sampling

PROMPT = [(11 * i + 5) % 900 + 100 for i in range(40)]
OTHER = [(7 * i + 3) % 900 + 100 for i in range(12)]
BACKGROUND = 10


@pytest.fixture(scope="module")
def loaded(tiny_model_dir) -> LoadedModel:
    return LoadedModel.load(tiny_model_dir, name="tiny")


def greedy(max_tokens: int) -> Sampling:
    return Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def tokens(events) -> list[int]:
    return [e.token_id for e in events]


def alone(loaded: LoadedModel, prompt: list[int], n: int, max_tokens: int) -> list[list[int]]:
    """Each choice's greedy tokens with nothing else in the engine."""

    async def run():
        batcher = Batcher(loaded, prefix_cache=False)
        batcher.start()
        try:
            gen = batcher.submit(prompt, None, n, greedy(max_tokens))
            events = [e async for e in gen.events()]
        finally:
            batcher.stop()
        return [tokens(e for e in events if e.index == i) for i in range(n)]

    return asyncio.run(run())


def test_a_users_request_parks_background_rows_that_fill_the_batch_and_they_finish_as_alone(
    loaded,
):
    expected_background = alone(loaded, PROMPT, 2, 60)
    expected_user = alone(loaded, OTHER, 1, 5)

    async def run():
        batcher = Batcher(loaded, max_batch=2, prefix_cache=False)
        batcher.start()
        finished: list[str] = []

        async def read(name, stream, first=()):
            events = [*first, *[e async for e in stream]]
            finished.append(name)  # consumed side by side: in the order they ended
            return events

        try:
            background = batcher.submit(PROMPT, None, 2, greedy(60), priority=BACKGROUND)
            stream = background.events()
            first = [await anext(stream)]  # the background rows fill the batch
            user = batcher.submit(OTHER, None, 1, greedy(5))
            events, user_events = await asyncio.gather(
                read("background", stream, first), read("user", user.events())
            )
        finally:
            batcher.stop()
        return events, user_events, finished == ["user", "background"]

    events, user_events, user_first = asyncio.run(run())
    # Without parking the user would wait for all 60 tokens of both background rows.
    assert user_first
    assert tokens(user_events) == expected_user[0]
    assert [tokens(e for e in events if e.index == i) for i in range(2)] == expected_background


class Watched:
    """The loaded model, its forwards' input shapes written down (what the batcher asked
    of the model, not what it answered: every forward is the real one)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded, self.lengths, self.rows = loaded, [], []

    def __getattr__(self, name):
        return getattr(self.loaded, name)

    def forward(self, input_ids, *args):
        self.rows.append(input_ids.shape[0])
        self.lengths.append(input_ids.shape[1])
        return self.loaded.forward(input_ids, *args)


def side_by_side(watched: Watched, share: float) -> tuple[list[int], list[list[int]]]:
    """A user's 60 greedy tokens, and a background request of 3 rows that joins once the
    user's row decodes: each one's tokens by choice."""

    async def run():
        batcher = Batcher(watched, background_share=share, prefix_cache=False)
        batcher.start()
        try:
            user = batcher.submit(OTHER, None, 1, greedy(60))
            stream = user.events()
            head = [await anext(stream)]
            background = batcher.submit(PROMPT, None, 3, greedy(12), priority=BACKGROUND)
            user_events, events = await asyncio.gather(
                _collect(stream, head), _collect(background.events())
            )
        finally:
            batcher.stop()
        return tokens(user_events), [tokens(e for e in events if e.index == i) for i in range(3)]

    return asyncio.run(run())


async def _collect(stream, head=()) -> list:
    return [*head, *[e async for e in stream]]


def test_a_users_steps_never_carry_background_rows_which_decode_on_their_share(loaded):
    """On two cores a background row in a user's step costs the step 0.6x of its speed:
    the background rows decode in a batch of their own, on their share of the time, and
    both answers are the ones each would get alone."""
    expected_user, expected_background = alone(loaded, OTHER, 1, 60), alone(loaded, PROMPT, 3, 12)
    watched = Watched(loaded)
    user, background = side_by_side(watched, share=0.3)
    assert [user] == expected_user and background == expected_background
    decode = [rows for rows, n in zip(watched.rows, watched.lengths, strict=True) if n == 1]
    assert 4 not in decode  # never the user's row and the 3 background rows in one step
    # Background steps came between the user's (its share), not all after them.
    last_user = max(i for i, rows in enumerate(decode) if rows == 1)
    assert decode[:last_user].count(3) >= 1, decode


def test_with_no_share_background_waits_for_the_user_and_with_all_of_it_shares_each_step(
    loaded,
):
    expected_user = alone(loaded, OTHER, 1, 60)
    none, every = Watched(loaded), Watched(loaded)
    assert side_by_side(none, share=0.0)[0] == expected_user[0]
    decode = [rows for rows, n in zip(none.rows, none.lengths, strict=True) if n == 1]
    first_background = decode.index(3)
    assert set(decode[:first_background]) == {1} and set(decode[first_background:]) == {3}
    # 1: one batch for all, as before lanes: the user's steps carry the background rows.
    assert side_by_side(every, share=1.0)[0] == expected_user[0]
    assert 4 in [rows for rows, n in zip(every.rows, every.lengths, strict=True) if n == 1]


def test_a_background_prompt_is_prefilled_by_chunks_while_a_user_decodes_and_answers_as_alone(
    loaded,
):
    expected_background = alone(loaded, PROMPT, 1, 8)
    expected_user = alone(loaded, OTHER, 1, 100)
    watched = Watched(loaded)

    async def run():
        batcher = Batcher(watched, prefill_chunk=8, prefix_cache=False)
        batcher.start()
        try:
            user = batcher.submit(OTHER, None, 1, greedy(100))
            stream = user.events()
            head = [await anext(stream)]  # the user's row decodes
            background = batcher.submit(PROMPT, None, 1, greedy(8), priority=BACKGROUND)
            got = [e async for e in background.events()]
            rest = [e async for e in stream]
        finally:
            batcher.stop()
        return head + rest, got

    user_events, background_events = asyncio.run(run())
    assert tokens(user_events) == expected_user[0]
    assert tokens(background_events) == expected_background[0]
    # The user's prompt whole, then steps of one token, the 40-token background prompt in
    # five chunks of 8 among them: never whole while the user decodes.
    assert watched.lengths[0] == len(OTHER)
    assert sorted(n for n in watched.lengths[1:] if n > 1) == [8] * 5


def test_waiting_requests_are_admitted_most_urgent_first(loaded):
    order: list[str] = []

    async def run():
        batcher = Batcher(loaded, max_batch=1, prefix_cache=False)
        batcher.start()
        try:
            running = batcher.submit(OTHER, None, 1, greedy(30))
            stream = running.events()
            await anext(stream)  # the batch's one row is taken
            later = batcher.submit(PROMPT, None, 1, greedy(3), priority=BACKGROUND)
            sooner = batcher.submit(PROMPT, None, 1, greedy(3))

            async def finish(name, gen):
                async for e in gen.events():
                    if e.finish_reason:
                        order.append(name)

            await asyncio.gather(
                finish("background", later), finish("user", sooner), _drain(stream)
            )
        finally:
            batcher.stop()

    asyncio.run(run())
    assert order == ["user", "background"]


async def _drain(stream) -> None:
    async for _ in stream:
        pass


def queue(url: str) -> dict[str, float]:
    text = httpx.get(f"{url.removesuffix('/v1')}/metrics", timeout=10).text
    return {f.name: sum(s.value for s in f.samples) for f in text_string_to_metric_families(text)}


def test_a_real_engine_answers_a_user_while_its_batch_is_full_of_background_work(
    tiny_model_dir,
):
    args = ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--threads", "1"]
    with EngineProcess([*args, "--max-batch-size", "2"]) as engine:
        client = OpenAI(base_url=engine.url, api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "Count to a thousand."}]

        async def background_then_user():
            async with httpx.AsyncClient(base_url=engine.url, timeout=300) as http:
                body = {
                    "model": "tiny",
                    "messages": messages,
                    "n": 2,
                    "max_tokens": 900,
                    "ignore_eos": True,
                    "priority": BACKGROUND,
                }
                background = asyncio.create_task(http.post("/chat/completions", json=body))
                while queue(engine.url)["vllm:num_requests_running"] < 1:
                    await asyncio.sleep(0.01)  # a probe: the background request is in the batch
                user = await asyncio.to_thread(
                    client.chat.completions.create,
                    model="tiny",
                    messages=messages,
                    max_tokens=4,
                    extra_body={"ignore_eos": True},
                )
                still_running = not background.done()
                return user, still_running, await background

        user, still_running, background = asyncio.run(background_then_user())
        assert still_running  # the user did not wait for 2 x 900 background tokens
        assert user.usage.completion_tokens == 4
        assert background.status_code == 200
        assert [c["finish_reason"] for c in background.json()["choices"]] == ["length"] * 2
        assert background.json()["usage"]["completion_tokens"] == 1800
        assert queue(engine.url) == {
            "vllm:num_requests_running": 0.0,
            "vllm:num_requests_waiting": 0.0,
        }
