"""Which API keys' traffic a query may read: a release lineage's own keys, and never an
untrained key's.

A tenant's lineage learns and is judged only from its tenant's keys (`only`); the shared
lineage from every key no tenant holds; neither from `proxy.untrained_keys` (`never`). The
scope is one SQL condition on an `api_key_id` column, so the snapshot, the test prompts
and the canary's guards read the same keys.

A lineage is named `alias` (the shared one) or `alias@tenant` wherever it is stored (the
routing, `deployments`, `candidates`, a train run's config), so the names are spelt here,
below every package that reads them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KeyScope:
    """`only`: the keys whose rows count (None: any key, and rows of no key); `never`: keys
    whose rows never count, whatever `only` says."""

    only: tuple[str, ...] | None = None
    never: tuple[str, ...] = ()

    def allows(self, api_key_id: str | None) -> bool:
        if api_key_id is not None and api_key_id in self.never:
            return False
        return self.only is None or api_key_id in self.only

    def sql(self, column: str) -> tuple[str, list]:
        """The condition on `column` (an `api_key_id` of a table the query reads; a name in
        our SQL, never a client's bytes) and its three parameters, in order."""
        condition = (
            f"(NOT ?::BOOLEAN OR coalesce(list_contains(?::VARCHAR[], {column}), false)) "
            f"AND NOT coalesce(list_contains(?::VARCHAR[], {column}), false)"
        )
        return condition, [self.only is not None, list(self.only or ()), list(self.never)]


EVERY_KEY = KeyScope()

SEPARATOR = "@"


def lineage_name(alias: str, tenant: str | None) -> str:
    """The name of `alias`'s lineage for `tenant` (None: the shared one)."""
    return alias if tenant is None else f"{alias}{SEPARATOR}{tenant}"


def lineage_flags(name: str) -> str:
    """How the command line names the lineage `name`: `alias`, or `alias --tenant T`."""
    alias, sep, tenant = name.rpartition(SEPARATOR)
    return f"{alias} --tenant {tenant}" if sep else name


@dataclass(frozen=True)
class TenantRows:
    """What belongs to one tenant, for `onjob export --tenant`: the rows of its `keys`'
    conversations and all derived from them (as `onjob forget --api-key` finds them), and
    the release rows of its `lineages` (`alias@tenant`: routings, candidates, reviews,
    train runs and their checkpoints)."""

    tenant: str
    keys: tuple[str, ...]
    lineages: tuple[str, ...]
