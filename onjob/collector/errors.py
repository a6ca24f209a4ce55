"""The collector's exception tree; DuckDB's errors are translated here and in `store`."""


class CollectorError(Exception):
    pass


class StorageError(CollectorError):
    """The database cannot be opened or written."""
