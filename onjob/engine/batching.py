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

The event loop never runs the model: handlers `submit()` and read events that the
worker posts with `call_soon_threadsafe`. Adapter loads run in the worker between
steps (`call()`), so no forward ever sees a half-loaded adapter.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections import deque
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
    ) -> None:
        self.prompt_ids = prompt_ids
        self.adapter = adapter
        self.n = n
        self.sampling = sampling
        self.grammar = compiled_grammar  # xgrammar's CompiledGrammar, or None
        self.cancelled = False
        self.cached_tokens = 0  # prompt tokens whose prefill was reused (set at admission)
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
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    logits: torch.Tensor  # [1, vocab], float32

    def cache(self) -> DynamicCache:
        cache = DynamicCache()
        for i, (keys, values) in enumerate(self.layers):
            cache.update(keys, values, i)
        return cache


@dataclass
class _Call:
    fn: Callable[[], Any]
    future: concurrent.futures.Future


class Batcher:
    def __init__(
        self, loaded: LoadedModel, *, max_batch: int = 16, prefix_cache: bool = True
    ) -> None:
        self.loaded = loaded
        self.max_batch = max_batch
        self.prefix_cache = prefix_cache
        self._last: _Prefill | None = None  # the last prefill, when `prefix_cache`
        self._inbox: queue.SimpleQueue[Generation | _Call | None] = queue.SimpleQueue()
        self._pending: deque[Generation] = deque()
        self._rows: list[_Row] = []
        self._cache = None
        self._mask: torch.Tensor | None = None  # [rows, cache length], False = left padding
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
    ):
        gen = Generation(
            prompt_ids, adapter, n, sampling, asyncio.get_running_loop(), compiled_grammar
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

    def busy(self) -> set[str]:
        """Worker side: the adapters of the rows generating now (kept in the model)."""
        return {r.gen.adapter for r in self._rows if r.gen.adapter is not None}

    def fail_adapter(self, name: str) -> None:
        """Worker side: end every request of adapter `name` (it is about to be unloaded)."""
        error = GenerationFailed(f"The lora adapter '{name}' was unloaded during generation.")
        for gen in {r.gen for r in self._rows} | set(self._pending):
            if gen.adapter == name:
                gen._post(error)
                gen.cancel()
        self._pending = deque(g for g in self._pending if not g.cancelled)
        self._compact()

    # -- the worker --------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while self._drain(block=not self._rows and not self._pending):
                try:
                    self._admit()
                    if self._rows:
                        self._step()
                except Exception as exc:  # never let one bad step kill the worker
                    self._fail_batch(GenerationFailed(f"Generation failed: {exc}"))
        error = GenerationFailed("The engine is shutting down.")
        for gen in {r.gen for r in self._rows} | set(self._pending):
            gen._post(error)

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
        while self._pending:
            gen = self._pending[0]
            if gen.cancelled:
                self._pending.popleft()
                continue
            if self._rows and len(self._rows) + gen.n > self.max_batch:
                return
            self._pending.popleft()
            if gen.adapter is not None and gen.adapter not in self.loaded.adapters:
                # Unloaded between the request's arrival and now: never serve other weights.
                gen._post(NotFound(f"The model `{gen.adapter}` does not exist.", param="model"))
                continue
            try:
                if gen.adapter is not None:
                    self.loaded.use(gen.adapter, self.busy())  # loaded again if taken out
                self._prefill(gen)
            except Exception as exc:
                failed = exc if isinstance(exc, EngineError) else None
                gen._post(failed or GenerationFailed(f"Generation failed: {exc}"))
                gen.cancel()
                self._compact()

    def _prefill(self, gen: Generation) -> None:
        device = self.loaded.device
        last = self._last
        if last is not None and last.adapter == gen.adapter and last.prompt_ids == gen.prompt_ids:
            cache, logits = last.cache(), last.logits
            gen.cached_tokens = len(gen.prompt_ids)
        else:
            ids = torch.tensor([gen.prompt_ids], device=device)
            out = self.loaded.forward(ids, None, None, DynamicCache(), [gen.adapter])
            cache, logits = out.past_key_values, out.logits[:, -1, :].float()
            if self.prefix_cache:
                layers = [(layer.keys, layer.values) for layer in cache.layers]
                # A copy: the slice is a view that would keep every position's logits.
                kept = logits.clone()
                self._last = _Prefill(list(gen.prompt_ids), gen.adapter, layers, kept)
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
        self._merge(cache, mask, rows)
        self._emit(rows, logits)
        self._compact()

    def _step(self) -> None:
        device = self.loaded.device
        rows = self._rows
        ids = torch.tensor([[r.token_ids[-1]] for r in rows], device=device)
        positions = torch.tensor([[r.position] for r in rows], device=device)
        mask = torch.cat([self._mask, torch.ones(len(rows), 1, dtype=torch.bool, device=device)], 1)
        out = self.loaded.forward(
            ids, mask.long(), positions, self._cache, [r.gen.adapter for r in rows]
        )
        self._mask = mask
        for r in rows:
            r.position += 1
        self._emit(rows, out.logits[:, -1, :].float())
        self._compact()

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
        for gen in {r.gen for r in self._rows}:
            gen._post(error)
            gen.cancel()
        self._rows, self._cache, self._mask = [], None, None

    def _merge(self, cache, mask: torch.Tensor, rows: list[_Row]) -> None:
        """Add prefilled rows to the running batch, left-padding whichever side is shorter."""
        if not self._rows:
            self._cache, self._mask, self._rows = cache, mask, rows
            return
        old, new = self._mask.shape[1], mask.shape[1]
        _pad_left(self._cache, max(0, new - old))
        _pad_left(cache, max(0, old - new))
        self._mask = torch.cat(
            [F.pad(self._mask, (max(0, new - old), 0)), F.pad(mask, (max(0, old - new), 0))], 0
        )
        for mine, theirs in zip(self._cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([mine.keys, theirs.keys], 0)
            mine.values = torch.cat([mine.values, theirs.values], 0)
        self._rows = self._rows + rows

    def _compact(self) -> None:
        """Drop finished and cancelled rows, and cache columns that are padding for every row."""
        keep = [i for i, r in enumerate(self._rows) if not r.done and not r.gen.cancelled]
        if len(keep) == len(self._rows):
            return
        if not keep:
            self._rows, self._cache, self._mask = [], None, None
            return
        index = torch.tensor(keep, device=self._mask.device)
        self._rows = [self._rows[i] for i in keep]
        self._mask = self._mask[index]
        start = int(self._mask.any(0).nonzero()[0])
        self._mask = self._mask[:, start:]
        for layer in self._cache.layers:
            layer.keys = layer.keys[index, :, start:]
            layer.values = layer.values[index, :, start:]


def _pad_left(cache, n: int) -> None:
    if n:
        for layer in cache.layers:
            layer.keys = F.pad(layer.keys, (0, 0, n, 0))
            layer.values = F.pad(layer.values, (0, 0, n, 0))
