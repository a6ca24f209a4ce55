"""Tenants and their release lineages: whose adapter answers a key, whose traffic trains it.

A tenant is a named group of API keys (`proxy.tenants`; a tenant of one key names that
key). Each alias has one lineage per tenant (its own live and canary adapters, candidates,
tests and decisions, learnt from its own keys' traffic alone) besides the shared lineage,
which serves and learns from every key no tenant holds. A lineage's name is its key in
the routing and the `deployments` log: the alias for the shared one (so a server with no
tenants is as it was), `alias@tenant` for a tenant's. A tenant's lineage starts from the
alias's configured live checkpoint (the base model by default), never from the shared
lineage's adapters: no other key's traffic reaches its answers through shared weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..collector.scope import SEPARATOR, KeyScope, TenantRows, lineage_name
from ..errors import OnjobError


class UnknownTenant(OnjobError, ValueError):
    """A tenant the settings do not name."""


@dataclass(frozen=True)
class Lineage:
    """One alias's lineage for one tenant (None: the shared lineage), and the keys whose
    traffic is its own (`scope`)."""

    alias: str
    tenant: str | None = None
    scope: KeyScope = field(default_factory=KeyScope)

    @property
    def name(self) -> str:
        """Its key in the routing and the `deployments` log."""
        return lineage_name(self.alias, self.tenant)

    def __str__(self) -> str:
        return self.name

    @property
    def of(self) -> str:
        """How a line of the log names it after what it did: nothing for the shared
        lineage, " of alias@tenant" for a tenant's."""
        return "" if self.tenant is None else f" of {self.name}"


@dataclass(frozen=True)
class Tenants:
    """`proxy.tenants` read once: which tenant holds a key, and each lineage's scope."""

    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # tenant -> its key ids
    untrained: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings) -> Tenants:
        """From `ProxySettings`."""
        return cls(
            {name: tuple(keys) for name, keys in settings.tenants.items()},
            tuple(settings.untrained_keys),
        )

    def tenant_of(self, api_key_id: str | None) -> str | None:
        """The tenant holding the key (None: no tenant does; the shared lineage's)."""
        if api_key_id is None:
            return None
        return next((t for t, keys in self.keys.items() if api_key_id in keys), None)

    def lineage(self, alias: str, tenant: str | None = None) -> Lineage:
        """The alias's lineage for `tenant` (None: the shared one). Unknown tenant: KeyError."""
        if tenant is None:
            held = tuple(k for keys in self.keys.values() for k in keys)
            return Lineage(alias, None, KeyScope(None, self.untrained + held))
        return Lineage(alias, tenant, KeyScope(self.keys[tenant], self.untrained))

    def lineages(self, alias: str) -> list[Lineage]:
        """The alias's shared lineage, then each tenant's, in the settings' order."""
        return [self.lineage(alias), *(self.lineage(alias, t) for t in self.keys)]

    def routed(self, name: str, tenant: str | None) -> str:
        """The name of `name`'s lineage for `tenant` as a person gives them (an admin verb's
        `--tenant`); a tenant the settings do not hold is refused by name."""
        if tenant is not None:
            self._known(tenant)
        return lineage_name(name, tenant)

    def _known(self, tenant: str) -> tuple[str, ...]:
        """The tenant's keys; a tenant the settings do not hold is refused by name."""
        if tenant not in self.keys:
            known = ", ".join(self.keys) or "none: proxy.tenants is empty"
            raise UnknownTenant(f"no tenant {tenant[:64]!r} (tenants: {known})")
        return self.keys[tenant]

    def defaults(self, aliases: Mapping[str, str | None]) -> Mapping[str, str | None]:
        """Every lineage's name -> its live checkpoint before any decision (its alias's)."""
        return {
            lineage.name: live
            for alias, live in aliases.items()
            for lineage in self.lineages(alias)
        }

    def rows(self, tenant: str, aliases: Iterable[str]) -> TenantRows:
        """What `onjob export --tenant` takes of `tenant`: its keys' rows and its lineages of
        `aliases`; a tenant the settings do not hold is refused by name."""
        names = tuple(self.routed(alias, tenant) for alias in aliases)
        return TenantRows(tenant, self._known(tenant), names)

    def named(self, name: str) -> Lineage:
        """The lineage whose routing key is `name` (`alias` or `alias@tenant`); an `@` that
        names no tenant is part of the alias."""
        alias, sep, tenant = name.rpartition(SEPARATOR)
        if sep and tenant in self.keys:
            return self.lineage(alias, tenant)
        return self.lineage(name)
