"""Owns the DuckDB database: exchanges stitched into trajectories and scenarios, and the
queries the other parts ask.

The proxy calls `Collector.place()` (which trajectory, turn and scenario a request
belongs to) and `Collector.log()` (a durable append to the spool); a background
task loads the spool into DuckDB in batches. `queries` holds the questions other
parts ask (`await collector.query(lambda store: queries.trajectory(store, trajectory_id))`).
"""

from . import budgets, queries, readonly
from .errors import CollectorError, StorageError
from .forget import Forget, ForgetError, Forgotten
from .linear import Lineage, rebuilt
from .records import ExchangeRecord, FeedbackRecord
from .settings import CollectorSettings
from .store import Store
from .trajectories import Placement, Stitcher
from .writer import Collector

__all__ = [
    "Collector",
    "CollectorError",
    "CollectorSettings",
    "ExchangeRecord",
    "FeedbackRecord",
    "Forget",
    "ForgetError",
    "Forgotten",
    "Lineage",
    "Placement",
    "Stitcher",
    "StorageError",
    "Store",
    "budgets",
    "queries",
    "readonly",
    "rebuilt",
]
