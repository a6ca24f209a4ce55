"""Continuous batching: one worker thread owns the model; requests join and leave at token steps.

Each new request is prefilled on its own (no padding waste), its KV cache is
repeated for its `n` choices (the prompt's forward is shared by the whole group),
then left-padded into the running batch. The last prefill is kept (`_Prefill`): a
request with the same prompt token for token and the same adapter (a group sent as
several requests of one choice each, an agent's rollouts of one scenario) copies its
KV cache and last logits instead of running the prompt again, so its answers are the
ones a request with `n` would have drawn. Any model change (`call()`) drops it. Every
step decodes one token for every row in the batch, whatever adapter each row uses.
Finished rows leave at once.

The cache keeps every layer's whole history, sliding-window layers included (a
`DynamicCache` made without the model's config), so that padding, merging and
compaction treat all layers alike; each step passes the 2-D padding mask and the
model builds its own masks per layer type (full, sliding window) from it.

A request with a grammar (`grammar.py`) gets one matcher per choice: each step, the
constrained rows' logits are copied and masked to what their matcher allows before
sampling; unconstrained rows of the same batch are sampled from their logits as they
are, and every row's reported logprob is taken from the unmasked logits.

Users' requests come first (`priority`, vLLM's meaning: lower is served earlier; onjob
marks its own work, the judge's samples and the offline test's pairs, as background).
Waiting requests are admitted most urgent first, oldest first. Rows decode in two lanes,
each a batch with its own cache: the **front** holds the most urgent rows and steps every
time; the **behind** lane holds less urgent rows, which step only on their share of the
engine's time (`background_share`) while the front decodes. On two cores a background
row in a user's step costs that step 0.6x of its speed, whatever the number of rows
(bench/engine/priorities.py --steps-only), so a user's rows never share a step with background
rows, and a user sees background work take at most that share of the time. A less urgent
request's prompt is prefilled a chunk of `prefill_chunk` tokens at a time (vLLM's
chunked prefill), on the behind lane's share; when the front empties the behind lane
becomes the front, and a more urgent request moves the front behind. When a more urgent
request waits and the batch is full, the least urgent rows are parked (their cache set
aside, vLLM's preemption by swapping) and rejoin when the urgent work is done. With no
user request in the engine, background work runs exactly as before, whole prefills and
full batches. `background_share` 1 keeps one lane for all (every row in every step).

The event loop never runs the model: handlers `submit()` and read events that the
worker posts with `call_soon_threadsafe`. Adapter loads run in the worker between
steps (`call()`), so no forward ever sees a half-loaded adapter.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from . import chat, grammar
from .errors import EngineError, GenerationFailed, NotFound
from .model import LoadedModel
from .sampling import Sampling, TextStream, generator_for, sample


@dataclass
class TokenEvent:
    index: int
    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    text: str
    finish_reason: str | None


class Generation:
    """One request in flight: its `n` choices' tokens arrive as events on the event loop."""

    def __init__(
        self,
        prompt_ids: list[int],
        adapter: str | None,
        n: int,
        sampling: Sampling,
        loop: asyncio.AbstractEventLoop,
        compiled_grammar=None,
        priority: int = 0,
    ) -> None:
        self.prompt_ids = prompt_ids
        self.adapter = adapter
        self.n = n
        self.sampling = sampling
        self.grammar = compiled_grammar  # xgrammar's CompiledGrammar, or None
        self.cancelled = False
        self.cached_tokens = 0  # prompt tokens whose prefill was reused (set at admission)
        self.priority = priority  # lower is served earlier (vLLM's meaning); users' are 0
        self.order = (priority, next(_arrivals))  # most urgent first, then oldest first
        self._loop = loop
        self._queue: asyncio.Queue[list[TokenEvent] | EngineError] = asyncio.Queue()

    def cancel(self) -> None:
        """Stop generating (client gone); the worker drops the rows at its next step."""
        self.cancelled = True

    async def events(self) -> AsyncIterator[TokenEvent]:
        finished = 0
        while finished < self.n:
            item = await self._queue.get()
            if isinstance(item, EngineError):
                raise item
            for event in item:
                finished += event.finish_reason is not None
                yield event

    def _post(self, item: list[TokenEvent] | EngineError) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled = True


_arrivals = itertools.count()
Layers = list[tuple[torch.Tensor, torch.Tensor]]  # each layer's keys and values


@dataclass
class _Row:
    gen: Generation
    index: int
    position: int
    text: TextStream
    generator: torch.Generator | None
    matcher: Any = None  # xgrammar's GrammarMatcher for a constrained row
    token_ids: list[int] = field(default_factory=list)
    done: bool = False


@dataclass(frozen=True)
class _Prefill:
    """One prompt's prefill for one row: each layer's keys and values, and the logits of
    the prompt's last position. Never changed in place: the batch's cache updates build
    new tensors (`torch.cat`), so these stay as the prefill left them."""

    prompt_ids: list[int]
    adapter: str | None
    layers: Layers
    logits: torch.Tensor  # [1, vocab], float32

    def cache(self) -> DynamicCache:
        return _cache_of(self.layers)


@dataclass
class _Filling:
    """A request whose prompt is prefilled a chunk per step while more urgent rows decode:
    its own one-row cache holds the first `done` prompt tokens."""

    gen: Generation
    cache: DynamicCache = field(default_factory=DynamicCache)
    done: int = 0
    logits: torch.Tensor | None = None  # the prompt's last position's, once `done` is all


@dataclass
class _Parked:
    """A generation's rows taken out of the batch for a more urgent request: their cache
    and padding mask as they were, so they rejoin where they stopped."""

    gen: Generation
    rows: list[_Row]
    layers: Layers
    mask: torch.Tensor

    @property
    def order(self) -> tuple[int, int]:
        return self.gen.order


@dataclass
class _Call:
    fn: Callable[[], Any]
    future: concurrent.futures.Future


# Prompt tokens per chunk of a less urgent request's prefill while a more urgent row
# decodes (`engine.prefill_chunk`): bench/engine/priorities.py measures what it costs users.
PREFILL_CHUNK = 32
# The behind lane's share of the engine's time while the front decodes
# (`engine.background_share`): a user's answer takes at most 1 / (1 - share) of its time
# alone, 1.18x, inside the 1.2x that issue 64 allows.
BACKGROUND_SHARE = 0.15
# Time the behind lane may bank while it waits for its turn: a burst of its steps after a
# long front is bounded, so a user's tokens never stall for longer than this at once.
_MOST_CREDIT_S = 0.5


class _Batch:
    """Rows decoding together: one cache, left-padded to one length, with its mask."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.cache = None
        self.mask: torch.Tensor | None = None  # [rows, cache length], False = left padding

    def priority(self) -> float:
        """The most urgent priority among the rows (inf: none)."""
        return min((r.gen.priority for r in self.rows), default=float("inf"))

    def clear(self) -> None:
        self.rows, self.cache, self.mask = [], None, None

    def merge(self, cache, mask: torch.Tensor, rows: list[_Row]) -> None:
        """Add prefilled rows, left-padding whichever side is shorter."""
        if not self.rows:
            self.cache, self.mask, self.rows = cache, mask, rows
            return
        old, new = self.mask.shape[1], mask.shape[1]
        _pad_left(self.cache, max(0, new - old))
        _pad_left(cache, max(0, old - new))
        self.mask = torch.cat(
            [F.pad(self.mask, (max(0, new - old), 0)), F.pad(mask, (max(0, old - new), 0))], 0
        )
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([mine.keys, theirs.keys], 0)
            mine.values = torch.cat([mine.values, theirs.values], 0)
        self.rows = self.rows + rows

    def compact(self) -> None:
        """Drop finished and cancelled rows, and cache columns that are padding for every row."""
        keep = [i for i, r in enumerate(self.rows) if not r.done and not r.gen.cancelled]
        if len(keep) < len(self.rows):
            self.keep(keep)

    def keep(self, keep: list[int]) -> None:
        """The batch cut to rows `keep`."""
        if not keep:
            self.clear()
            return
        layers, self.mask = self.slice(keep)
        self.rows = [self.rows[i] for i in keep]
        for layer, (keys, values) in zip(self.cache.layers, layers, strict=True):
            layer.keys, layer.values = keys, values

    def slice(self, rows: list[int]) -> tuple[Layers, torch.Tensor]:
        """Rows `rows`' cache and mask, without the columns that are padding for all of them."""
        index = torch.tensor(rows, device=self.mask.device)
        mask = self.mask[index]
        start = int(mask.any(0).nonzero()[0])
        layers = [
            (layer.keys[index, :, start:], layer.values[index, :, start:])
            for layer in self.cache.layers
        ]
        return layers, mask[:, start:]


class Batcher:
    def __init__(
        self,
        loaded: LoadedModel,
        *,
        max_batch: int = 16,
        prefix_cache: bool = True,
        prefill_chunk: int = PREFILL_CHUNK,
        background_share: float = BACKGROUND_SHARE,
    ) -> None:
        self.loaded = loaded
        self.max_batch = max_batch
        self.prefix_cache = prefix_cache
        self.prefill_chunk = prefill_chunk
        self.background_share = background_share
        self._last: _Prefill | None = None  # the last prefill, when `prefix_cache`
        self._inbox: queue.SimpleQueue[Generation | _Call | None] = queue.SimpleQueue()
        self._pending: list[Generation] = []  # in arrival order; admitted by `order`
        self._parked: list[_Parked] = []
        self._filling: _Filling | None = None
        self._front = _Batch()  # the most urgent rows: a step every time
        self._behind = _Batch()  # less urgent rows: steps on `background_share`
        self._credit = 0.0  # seconds of the engine's time the behind lane may take now
        self._thread = threading.Thread(target=self._run, name="onjob-engine", daemon=True)
        self.started_threads = torch.get_num_threads()  # what `threads(None)` goes back to
        self.threads_now = self.started_threads

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=30)

    def submit(
        self,
        prompt_ids: list[int],
        adapter: str | None,
        n: int,
        sampling: Sampling,
        compiled_grammar=None,
        priority: int = 0,
    ):
        gen = Generation(
            prompt_ids,
            adapter,
            n,
            sampling,
            asyncio.get_running_loop(),
            compiled_grammar,
            priority,
        )
        self._inbox.put(gen)
        return gen

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` in the worker between two steps (model changes) and return its result."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(_Call(fn, future))
        return await asyncio.wrap_future(future)

    async def threads(self, n: int | None) -> tuple[int, int]:
        """Set the forwards' torch threads to `n` (None: as at start); (before, after).
        Set in the worker: a thread's OpenMP team size is its own, fixed at its first
        parallel region from the count then, so a call from another thread would not
        reach the forwards."""

        def change() -> tuple[int, int]:
            before = torch.get_num_threads()
            torch.set_num_threads(n or self.started_threads)
            self.threads_now = torch.get_num_threads()
            return before, self.threads_now

        return await self.call(change)

    def load(self) -> tuple[int, int]:
        """Requests (running, waiting), vLLM's meaning: in the batch, or not yet (queued,
        parked or being prefilled by chunks). Read from the event loop while the worker
        changes them: a gauge, not a count to act on exactly."""
        rows, pending, filling = self._rows(), list(self._pending), self._filling
        running = len({r.gen for r in rows})
        waiting = self._inbox.qsize() + len(pending) + len(self._parked) + (filling is not None)
        return running, waiting

    def busy(self) -> set[str]:
        """Worker side: the adapters of the requests started (generating, parked or being
        prefilled), kept in the model."""
        return {g.adapter for g in self._started() if g.adapter is not None}

    def fail_adapter(self, name: str) -> None:
        """Worker side: end every request of adapter `name` (it is about to be unloaded)."""
        error = GenerationFailed(f"The lora adapter '{name}' was unloaded during generation.")
        for gen in self._started() | set(self._pending):
            if gen.adapter == name:
                gen._post(error)
                gen.cancel()
        self._drop_cancelled()
        self._compact()

    def _started(self) -> set[Generation]:
        filling = {self._filling.gen} if self._filling is not None else set()
        return {r.gen for r in self._rows()} | {p.gen for p in self._parked} | filling

    def _rows(self) -> list[_Row]:
        """Every row decoding, in either lane."""
        return self._front.rows + self._behind.rows

    # -- the worker --------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while self._drain(block=not self._idle_work()):
                try:
                    self._admit()
                    self._work()
                except Exception as exc:  # never let one bad step kill the worker
                    self._fail_batch(GenerationFailed(f"Generation failed: {exc}"))
        error = GenerationFailed("The engine is shutting down.")
        for gen in self._started() | set(self._pending):
            gen._post(error)

    def _idle_work(self) -> bool:
        return bool(self._rows() or self._pending or self._parked or self._filling)

    def _work(self) -> None:
        """One step of the front; then, on the behind lane's turn, a step of its rows and a
        chunk of the prompt being filled. The behind lane earns the turn by the front's
        time: `background_share` of the engine's time while the front decodes."""
        if not self._front.rows and self._behind.rows:  # the front is done: behind goes on
            self._front, self._behind = self._behind, self._front
        urgent = bool(self._front.rows)
        if urgent:
            started = time.perf_counter()
            self._step(self._front)
            if self._behind.rows or self._filling is not None:
                share = self.background_share
                earned = (time.perf_counter() - started) * share / max(1e-9, 1 - share)
                self._credit = min(self._credit + earned, _MOST_CREDIT_S)
        behind_work = self._behind.rows or self._filling is not None
        if not behind_work or (urgent and self._credit <= 0 and self.background_share < 1):
            return
        started = time.perf_counter()
        if self._behind.rows:
            self._step(self._behind)
        if self._filling is not None:
            self._fill()
        if urgent:
            self._credit -= time.perf_counter() - started
        else:
            self._credit = 0.0

    def _drain(self, block: bool) -> bool:
        """Take everything waiting in the inbox; False when asked to stop."""
        while True:
            try:
                item = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if item is None:
                return False
            if isinstance(item, Generation):
                self._pending.append(item)
                continue
            self._last = None  # the weights may change: a kept prefill may be stale
            try:
                item.future.set_result(item.fn())
            except Exception as exc:
                item.future.set_exception(exc)

    def _admit(self) -> None:
        """Most urgent first, oldest first: parked rows rejoin, waiting requests are
        prefilled whole, or by chunks while a more urgent row decodes; a more urgent
        request that finds the batch full parks the least urgent rows."""
        self._drop_cancelled()
        self._preempt()
        waiting: list[Generation | _Parked] = [*self._parked, *self._pending]
        for item in sorted(waiting, key=lambda w: w.order):
            gen = item.gen if isinstance(item, _Parked) else item
            rows = len(self._rows())
            if rows and rows + gen.n > self.max_batch:
                return
            if isinstance(item, _Parked):
                self._parked.remove(item)
                self._lane(gen.priority).merge(_cache_of(item.layers), item.mask, item.rows)
                continue
            if self._urgent() < gen.priority and not self._cached(gen):  # by chunks
                if self._filling is None and self._start(gen):
                    self._pending.remove(gen)
                    self._filling = _Filling(gen)
                continue
            self._pending.remove(gen)
            if self._start(gen):
                try:
                    self._prefill(gen)
                except Exception as exc:
                    self._failed(gen, exc)

    def _cached(self, gen: Generation) -> bool:
        """Whether the kept prefill is this request's prompt (its prefill costs nothing)."""
        last = self._last
        return last is not None and (last.adapter, last.prompt_ids) == (gen.adapter, gen.prompt_ids)

    def _urgent(self) -> float:
        """The most urgent priority among the rows decoding (inf: none)."""
        return min(self._front.priority(), self._behind.priority())

    def _lane(self, priority: int) -> _Batch:
        """The lane that rows of `priority` join: the front when none decoding there is
        more urgent (the front's rows go behind when all are less urgent), else behind.
        One lane for all when `background_share` is 1."""
        front = self._front
        if self.background_share >= 1 or not front.rows:
            return front
        if priority > front.priority():
            return self._behind
        if priority < front.priority():  # every front row is less urgent: they go behind
            if self._behind.rows:  # rare: both lanes had rows
                self._behind.merge(front.cache, front.mask, front.rows)
                front.clear()
            else:
                self._front, self._behind = self._behind, front
        return self._front

    def _start(self, gen: Generation) -> bool:
        """The request's adapter in the model before its prompt's forward; False (and the
        request answered) when it cannot be."""
        if gen.adapter is not None and gen.adapter not in self.loaded.adapters:
            # Unloaded between the request's arrival and now: never serve other weights.
            if gen in self._pending:
                self._pending.remove(gen)
            gen._post(NotFound(f"The model `{gen.adapter}` does not exist.", param="model"))
            gen.cancel()
            return False
        try:
            if gen.adapter is not None:
                self.loaded.use(gen.adapter, self.busy())  # loaded again if taken out
        except Exception as exc:
            if gen in self._pending:
                self._pending.remove(gen)
            self._failed(gen, exc)
            return False
        return True

    def _failed(self, gen: Generation, exc: Exception) -> None:
        failed = exc if isinstance(exc, EngineError) else None
        gen._post(failed or GenerationFailed(f"Generation failed: {exc}"))
        gen.cancel()
        self._compact()

    def _drop_cancelled(self) -> None:
        self._pending = [g for g in self._pending if not g.cancelled]
        self._parked = [p for p in self._parked if not p.gen.cancelled]
        if self._filling is not None and self._filling.gen.cancelled:
            self._filling = None

    def _preempt(self) -> None:
        """Park the least urgent rows while the most urgent waiting request does not fit
        and rows less urgent than it decode (vLLM's preemption, by swapping: on CPU the
        cache stays where it is, out of the batch)."""
        if not self._pending or not self._rows():
            return
        first = min(self._pending, key=lambda g: g.order)
        while len(self._rows()) + first.n > self.max_batch:
            behind = {r.gen for r in self._rows() if r.gen.priority > first.priority}
            if not behind:
                return
            self._park(max(behind, key=lambda g: g.order))

    def _park(self, gen: Generation) -> None:
        lane = self._front if any(r.gen is gen for r in self._front.rows) else self._behind
        mine = [i for i, r in enumerate(lane.rows) if r.gen is gen]
        layers, mask = lane.slice(mine)
        self._parked.append(_Parked(gen, [lane.rows[i] for i in mine], layers, mask))
        lane.keep([i for i, r in enumerate(lane.rows) if r.gen is not gen])

    def _fill(self) -> None:
        """One chunk of the filling request's prompt (the rest at once when nothing more
        urgent decodes); once whole, it joins the batch when there is room."""
        f = self._filling
        ids = f.gen.prompt_ids
        if f.done < len(ids):
            end = len(ids) if self._urgent() >= f.gen.priority else f.done + self.prefill_chunk
            chunk = torch.tensor([ids[f.done : end]], device=self.loaded.device)
            try:
                out = self.loaded.forward(chunk, None, None, f.cache, [f.gen.adapter])
            except Exception as exc:  # this request's alone: the batch goes on
                self._filling = None
                self._failed(f.gen, exc)
                return
            f.cache, f.done = out.past_key_values, min(end, len(ids))
            f.logits = out.logits[:, -1, :].float()
        rows = len(self._rows())
        if f.done < len(ids) or (rows and rows + f.gen.n > self.max_batch):
            return
        self._filling = None
        try:
            self._join(f.gen, f.cache, f.logits)
        except Exception as exc:
            self._failed(f.gen, exc)

    def _prefill(self, gen: Generation) -> None:
        device = self.loaded.device
        last = self._last
        if self._cached(gen):
            cache, logits = last.cache(), last.logits
            gen.cached_tokens = len(gen.prompt_ids)
        else:
            ids = torch.tensor([gen.prompt_ids], device=device)
            out = self.loaded.forward(ids, None, None, DynamicCache(), [gen.adapter])
            cache, logits = out.past_key_values, out.logits[:, -1, :].float()
        self._join(gen, cache, logits)

    def _join(self, gen: Generation, cache, logits: torch.Tensor) -> None:
        """A prefilled prompt's one-row cache into the batch as the request's `n` rows,
        each with its first token."""
        device = self.loaded.device
        if self.prefix_cache and gen.cached_tokens == 0:
            layers = [(layer.keys, layer.values) for layer in cache.layers]
            # A copy: the slice is a view that would keep every position's logits.
            self._last = _Prefill(list(gen.prompt_ids), gen.adapter, layers, logits.clone())
        logits = logits.expand(gen.n, -1)
        if gen.n > 1:
            cache.batch_repeat_interleave(gen.n)
        rows = [
            _Row(
                gen=gen,
                index=i,
                position=len(gen.prompt_ids),
                text=TextStream(self.loaded.tokenizer, gen.sampling.stop),
                generator=generator_for(gen.sampling, i),
                matcher=grammar.matcher(gen.grammar) if gen.grammar is not None else None,
            )
            for i in range(gen.n)
        ]
        mask = torch.ones(gen.n, len(gen.prompt_ids), dtype=torch.bool, device=device)
        self._lane(gen.priority).merge(cache, mask, rows)
        self._emit(rows, logits)
        self._compact()

    def _step(self, lane: _Batch) -> None:
        device = self.loaded.device
        rows = lane.rows
        ids = torch.tensor([[r.token_ids[-1]] for r in rows], device=device)
        positions = torch.tensor([[r.position] for r in rows], device=device)
        mask = torch.cat([lane.mask, torch.ones(len(rows), 1, dtype=torch.bool, device=device)], 1)
        out = self.loaded.forward(
            ids, mask.long(), positions, lane.cache, [r.gen.adapter for r in rows]
        )
        lane.mask = mask
        for r in rows:
            r.position += 1
        self._emit(rows, out.logits[:, -1, :].float())
        lane.compact()

    def _emit(self, rows: list[_Row], logits: torch.Tensor) -> None:
        """Sample one token per row, post the events, mark finished rows."""
        logprobs = torch.log_softmax(logits, dim=-1)  # raw: before any mask, bias or penalty
        eos = sorted(self.loaded.eos_ids)
        limit = self.loaded.max_model_len
        events: dict[Generation, list[TokenEvent]] = {}
        constrained = [
            i for i, r in enumerate(rows) if r.matcher is not None and not r.gen.cancelled
        ]
        masked: dict[int, torch.Tensor] = {}
        if constrained:
            rows_logits = logits[constrained]  # a copy: the raw logits stay as they are
            grammar.mask_logits(rows_logits, [rows[i].matcher for i in constrained])
            masked = dict(zip(constrained, rows_logits, strict=True))
        for i, row in enumerate(rows):
            s = row.gen.sampling
            if row.gen.cancelled:
                row.done = True
                continue
            # Under a grammar, the grammar alone says when the answer may end.
            early = s.ignore_eos or len(row.token_ids) < s.min_tokens
            block = eos if early and row.matcher is None else []
            token = sample(masked.get(i, logits[i]), s, row.generator, block, row.token_ids)
            if row.matcher is not None and not row.matcher.accept_token(token):
                row.gen._post(GenerationFailed(f"The grammar refused token {token} it allowed."))
                row.gen.cancel()
                row.done = True
                continue
            row.token_ids.append(token)
            top: list[tuple[int, float]] = []
            if s.top_logprobs:
                values, ids = torch.topk(logprobs[i], s.top_logprobs)
                top = list(zip(ids.tolist(), values.tolist(), strict=True))
            finish = None
            if token in self.loaded.eos_ids:
                finish = "stop"
            elif len(row.token_ids) >= s.max_tokens or row.position + 1 >= limit:
                finish = "length"
            text, stopped = row.text.update(row.token_ids, final=finish is not None)
            if stopped:
                finish = "stop"
            elif finish is None and s.stop_after_call and chat.first_call_closed(row.text.text):
                text += row.text.update(row.token_ids, final=True)[0]
                finish = "stop"
            row.done = finish is not None
            events.setdefault(row.gen, []).append(
                TokenEvent(row.index, token, float(logprobs[i, token]), top, text, finish)
            )
        for gen, batch in events.items():
            gen._post(batch)

    def _fail_batch(self, error: EngineError) -> None:
        for gen in {r.gen for r in self._rows()}:
            gen._post(error)
            gen.cancel()
        self._front.clear()
        self._behind.clear()

    def _compact(self) -> None:
        self._front.compact()
        self._behind.compact()


def _cache_of(layers: Layers) -> DynamicCache:
    cache = DynamicCache()
    for i, (keys, values) in enumerate(layers):
        cache.update(keys, values, i)
    return cache


def _pad_left(cache, n: int) -> None:
    if n:
        for layer in cache.layers:
            layer.keys = F.pad(layer.keys, (0, 0, n, 0))
            layer.values = F.pad(layer.values, (0, 0, n, 0))
