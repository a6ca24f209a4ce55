"""The root of every error onjob raises on purpose.

Each package keeps one tree of its own under `OnjobError` (`collector.errors`,
`deploy.errors`, `judge.errors`, `trainer.errors`, `client.errors`, the HTTP errors of the
proxy and the engine under `openai_errors.OpenAIError`, `bucket.BucketError`, the CLI's
`cli.exits.CliError`), and translates the foreign errors it meets (botocore's, DuckDB's,
httpx's) into it in one place. A caller that wants "anything onjob refused" catches
`OnjobError`; a bug (a `TypeError`, a `KeyError`) is never one. Where an error also means
what a standard one means (a bad value, a port taken), it subclasses that too, so callers
that catch the standard one keep working. The one exception left outside is
`cli.stopping.Interrupted`, a signal's control flow, not an error.
"""

from __future__ import annotations


class OnjobError(Exception):
    """Something onjob refused or could not do, said in words meant for its user."""
