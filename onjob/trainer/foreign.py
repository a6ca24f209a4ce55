"""Foreign errors met during a training run, as the trainer's own (`errors.py`): the one
place they are translated. Imports torch, so only the run's side (`loop.py`) uses it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow
import torch

from .errors import IOFailed, OutOfMemory


@contextmanager
def translated() -> Iterator[None]:
    """Foreign errors met during a run, as the trainer's: the one place they are
    translated. Anything else (a bug) passes untouched, with its traceback."""
    try:
        yield
    except torch.OutOfMemoryError as exc:
        raise OutOfMemory(f"out of memory: lower trainer.max_batch_tokens ({exc})") from exc
    except (OSError, pyarrow.ArrowException) as exc:
        raise IOFailed(str(exc)) from exc
