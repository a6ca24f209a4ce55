"""Owns the DuckDB database: exchanges stitched into trajectories and scenarios, and the
queries the other parts ask.

The proxy computes a request's stitching keys (`trajectories.keys`) and calls
`Collector.log()` (a durable append to the spool); a background task in the one process
that owns the database loads the spool into DuckDB in batches, placing each exchange in
its trajectory and scenario as it goes. `queries` holds the questions other
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
