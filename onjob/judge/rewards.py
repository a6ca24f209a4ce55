"""User reward functions: `module:function` callables that score one `Rollout`.

A function takes the rollout and returns a number or a bool (plain or async). Modules are
looked up from the current directory too, as `uvicorn app:app` does, so a
`rewards.py` beside `onjob.toml` works as it is.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable, Mapping

from .errors import ConfigError, RewardFnFailed
from .rollouts import Rollout
from .settings import RewardFn


def load(rewards: Mapping[str, RewardFn]) -> Mapping[str, Callable]:
    if rewards and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    loaded = {}
    for name, spec in rewards.items():
        module_name, _, attr = spec.fn.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except ImportError as exc:
            raise ConfigError(
                f"reward function {name} = {spec.fn!r}: {exc} (a module is imported from "
                f"beside onjob.toml, from the directory onjob runs in, {os.getcwd()}, or "
                "from PYTHONPATH)"
            ) from exc
        except AttributeError as exc:
            raise ConfigError(f"reward function {name} = {spec.fn!r}: {exc}") from exc
        if not callable(fn):
            raise ConfigError(f"reward function {name} = {spec.fn!r} is not callable")
        loaded[name] = fn
    return loaded


async def score(name: str, fn: Callable, rollout: Rollout) -> float:
    """Run `fn` (a plain function in a worker thread: it may be slow) and check its answer."""
    try:
        if inspect.iscoroutinefunction(fn):
            value = await fn(rollout)
        else:
            value = await asyncio.to_thread(fn, rollout)
    except Exception as exc:
        raise RewardFnFailed(f"fn:{name} raised {type(exc).__name__}: {exc}") from exc
    if isinstance(value, bool):  # a success check: True scores 1
        value = float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise RewardFnFailed(f"fn:{name} returned {value!r:.80}, not a finite number")
    return float(value)
