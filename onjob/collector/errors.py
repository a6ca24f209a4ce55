"""The collector's exception tree; DuckDB's errors are translated here and in `store`."""

from ..errors import OnjobError


class CollectorError(OnjobError):
    pass


class StorageError(CollectorError):
    """The database cannot be opened or written."""
