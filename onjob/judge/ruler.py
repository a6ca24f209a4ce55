"""RULER: an LLM judge, called through litellm, scores a group's members against each other.

Every call shows the members in a fresh random order and records it: judges
favour positions, and shuffling turns that bias into noise the paired
comparisons average out. Answers are parsed tolerantly (JSON in prose, fenced
blocks) and validated (one score in [0, 1] per candidate id); a call that fails
or answers garbage is retried with backoff, and a group that still cannot be
scored comes back `failed` with the reason, never with made-up scores.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import rubric as prompts
from .errors import InvalidAnswer, JudgeError, JudgeRefused, from_litellm
from .rollouts import Rollout, common_prefix, content_hash
from .settings import JudgeSettings

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


@dataclass
class Judgement:
    judge: str
    cache_key: str
    status: str = "failed"  # ok | failed | cached
    scores: Mapping[str, tuple[float, str]] = field(default_factory=dict)  # member id -> score
    order: list[str] = field(default_factory=list)  # member ids as the judge saw them
    error: str | None = None
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    latency_ms: float = 0.0
    answer: str | None = None


def cache_key(judge: str, rubric: str, rollouts: list[Rollout], orders: int = 1) -> str:
    """Same judge, same rubric, same prefix, the same set of answers and as many orders
    read: same judgement."""
    n = common_prefix(rollouts)
    context = content_hash(rollouts[0].messages[:n]) if rollouts else ""
    members = sorted(content_hash(r.messages[n:]) for r in rollouts)
    tools = content_hash(rollouts[0].tools or []) if rollouts else ""
    parts = [judge, rubric, context, tools, members] + ([orders] if orders > 1 else [])
    blob = json.dumps(parts)
    return hashlib.sha256(blob.encode()).hexdigest()


def result_by_content(
    judgement: Judgement, rollouts: list[Rollout]
) -> Mapping[str, tuple[float, str]]:
    """What the cache keeps: scores keyed by member content, so they map onto any group
    with the same answers."""
    n = common_prefix(rollouts)
    return {
        content_hash(r.messages[n:]): judgement.scores[r.member_id]
        for r in rollouts
        if r.member_id in judgement.scores
    }


def from_cache(
    result: Mapping[str, tuple[float, str]], rollouts: list[Rollout]
) -> Mapping[str, tuple[float, str]]:
    """The cached scores (`result_by_content`) on this group's members."""
    n = common_prefix(rollouts)
    return {r.member_id: result[content_hash(r.messages[n:])] for r in rollouts}


async def judge(
    settings: JudgeSettings, rollouts: list[Rollout], *, rng: random.Random | None = None
) -> Judgement:
    """Score one group; never raises for the judge's failures (they are in the result).
    With `settings.ruler_orders` above 1 the group is judged that many times, the second
    in the first's order reversed (the rest shuffled afresh), and each member's score is
    the mean: a judge's pull toward a position moves an answer one way in one order and
    the other way in the reverse, and cancels."""
    rng = rng or random.Random()
    rubric = settings.rubric_for(rollouts[0].scenario)
    orders = settings.ruler_orders
    key = cache_key(settings.model, rubric, rollouts, orders)
    result = Judgement(f"ruler:{settings.model}", key)
    n = common_prefix(rollouts)
    await _litellm()  # its import takes seconds: not the judge's latency
    started = time.perf_counter()
    readings: list[Mapping[str, tuple[float, str]]] = []
    for k in range(orders):
        fixed = list(reversed(result.order)) if k == 1 else None
        read = await _judged_in_order(settings, rollouts, rubric, n, result, rng, fixed)
        if read is None:
            break
        scores, order = read
        if k == 0:
            result.order = order  # the order the first reading saw (the second reverses it)
        readings.append(scores)
    if len(readings) == orders:
        result.scores = {
            m: (sum(r[m][0] for r in readings) / orders, readings[0][m][1]) for m in readings[0]
        }
        result.status, result.error = "ok", None
    result.latency_ms = (time.perf_counter() - started) * 1000
    if result.status != "ok":
        result.error = f"{result.error} (after {result.attempts} attempts)"
    return result


async def _judged_in_order(
    settings: JudgeSettings,
    rollouts: list[Rollout],
    rubric: str,
    n: int,
    result: Judgement,
    rng: random.Random,
    order_ids: list[str] | None,
) -> tuple[Mapping[str, tuple[float, str]], list[str]] | None:
    """One reading of the group, its scores and the order it was shown in: `order_ids`,
    or a fresh shuffle at each attempt (None), tried up to `settings.attempts` times.
    None when every attempt failed or the judge refused (the error is in `result`)."""
    by_id = {r.member_id: r for r in rollouts}
    delay = settings.backoff_s
    for attempt in range(1, settings.attempts + 1):
        result.attempts += 1
        if order_ids is None:
            order = list(rollouts)
            rng.shuffle(order)
        else:
            order = [by_id[m] for m in order_ids]
        messages = prompts.prompt(
            rubric, rollouts[0].messages[:n], rollouts[0].tools, [r.messages[n:] for r in order]
        )
        try:
            text = await _call(settings, messages, result)
            result.answer = text
            by_position = parse(text, len(order))
            scores = {order[i - 1].member_id: by_position[i] for i in by_position}
            return _same_answer_same_score(scores, rollouts, n), [r.member_id for r in order]
        except JudgeRefused as exc:
            result.error = str(exc)
            return None
        except JudgeError as exc:
            result.error = str(exc)
        if attempt < settings.attempts:
            await asyncio.sleep(delay)
            delay *= 2
    return None


def _same_answer_same_score(
    scores: Mapping[str, tuple[float, str]], rollouts: list[Rollout], n: int
) -> Mapping[str, tuple[float, str]]:
    """Members with identical answers get the mean of what the judge gave them: a judge that
    scores the same text differently by position is showing its bias, not a difference."""
    by_content: dict[str, list[str]] = {}
    for r in rollouts:
        by_content.setdefault(content_hash(r.messages[n:]), []).append(r.member_id)
    out = dict(scores)
    for members in by_content.values():
        if len(members) > 1:
            mean = sum(scores[m][0] for m in members) / len(members)
            out.update({m: (mean, scores[m][1]) for m in members})
    return out


async def _call(settings: JudgeSettings, messages: list[dict], result: Judgement) -> str:
    litellm = await _litellm()
    kwargs = {
        "model": settings.model,
        "messages": messages,
        "temperature": settings.judge_temperature,
        "max_tokens": settings.judge_max_tokens,
        "timeout": settings.timeout_s,
        "num_retries": 0,
    }
    if settings.api_base:
        kwargs["api_base"] = settings.api_base
        # An OpenAI-compatible server of your own (vLLM, the local engine) may want no key,
        # but the OpenAI client insists on one.
        kwargs["api_key"] = settings.api_key.get_secret_value() if settings.api_key else "none"
    elif settings.api_key:
        kwargs["api_key"] = settings.api_key.get_secret_value()
    if settings.json_mode:
        kwargs["response_format"] = {"type": "json_object"}
    # litellm's custom pricing: it then reports a cost for a model its table lacks.
    if settings.input_cost_per_token is not None:
        kwargs["input_cost_per_token"] = settings.input_cost_per_token
    if settings.output_cost_per_token is not None:
        kwargs["output_cost_per_token"] = settings.output_cost_per_token
    try:
        response = await litellm.acompletion(**kwargs)
    except Exception as exc:
        raise from_litellm(exc) from exc
    usage = getattr(response, "usage", None)
    if usage is not None:
        result.prompt_tokens += usage.prompt_tokens or 0
        result.completion_tokens += usage.completion_tokens or 0
    cost = (getattr(response, "_hidden_params", None) or {}).get("response_cost")
    if cost is not None:
        result.cost_usd = (result.cost_usd or 0.0) + cost
    try:
        return response.choices[0].message.content or ""
    except (AttributeError, IndexError) as exc:
        raise InvalidAnswer("the judge's answer has no message") from exc


def parse(text: str, n: int) -> Mapping[int, tuple[float, str]]:
    """Candidate position (1..n) -> (score, explanation), or `InvalidAnswer` saying why."""
    entries = _find_scores(text)
    scores: dict[int, tuple[float, str]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise InvalidAnswer(f"a score entry is not an object: {entry!r:.80}")
        raw_id = next((entry[k] for k in ("id", "candidate", "trajectory_id") if k in entry), None)
        digits = re.fullmatch(r"\D*(\d+)\D*", str(raw_id)) if raw_id is not None else None
        if digits is None or not 1 <= int(digits.group(1)) <= n:
            raise InvalidAnswer(f"unknown candidate id {raw_id!r} (expected 1..{n})")
        position = int(digits.group(1))
        if position in scores:
            raise InvalidAnswer(f"candidate {position} scored twice")
        score = entry.get("score")
        if isinstance(score, str):
            try:
                score = float(score)
            except ValueError:
                score = None
        if (
            not isinstance(score, int | float)
            or isinstance(score, bool)
            or not math.isfinite(score)
            or not 0 <= score <= 1
        ):
            raise InvalidAnswer(f"candidate {position}: score {entry.get('score')!r} not in [0, 1]")
        scores[position] = (float(score), str(entry.get("explanation") or ""))
    if len(scores) != n:
        missing = sorted(set(range(1, n + 1)) - set(scores))
        raise InvalidAnswer(f"{len(scores)} scores for {n} candidates (missing {missing})")
    return scores


def _find_scores(text: str) -> list:
    """The first JSON value in `text` that holds the scores: an object with `scores`, or a
    list of score objects; whole, in a fenced block, or embedded in prose."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for chunk in candidates:
        for start in (i for i, c in enumerate(chunk) if c in "{["):
            try:
                value, _ = decoder.raw_decode(chunk, start)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict) and isinstance(value.get("scores"), list):
                return value["scores"]
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                return value
    raise InvalidAnswer(f"no JSON with scores in the judge's answer: {text[:120]!r}")


_module = None


async def _litellm():
    """litellm, imported once off the event loop (the import takes seconds) and kept offline:
    its price table comes from the package, not fetched from GitHub."""
    global _module
    if _module is None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

        def load():
            import litellm

            litellm.suppress_debug_info = True
            litellm.telemetry = False
            return litellm

        _module = await asyncio.to_thread(load)
    return _module
