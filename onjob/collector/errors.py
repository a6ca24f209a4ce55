"""The collector's exception tree; DuckDB's errors are translated here and in `store`."""

from ..errors import OnjobError


class CollectorError(OnjobError):
    pass


class StorageError(CollectorError):
    """The database cannot be opened or written."""


class NotLeading(CollectorError):
    """A change only the leading server of a DuckLake makes (`collector.lake`), asked of
    one that does not lead."""


class CatalogUnreachable(StorageError):
    """A DuckLake's catalog (its Postgres) does not answer: answers are still served and
    wait in the spool, which loads once it answers again (`collector/outage.py`)."""
