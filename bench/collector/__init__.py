"""The collector: ingest rate, the loader's memory and statements, fsync policies, ids, and
the dashboard on a large database."""
