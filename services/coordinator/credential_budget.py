"""What one join credential may hold and do: its budget.

    max_workers            live identities at once: a registration (or a rejoin) past it is refused with 429
                           until one of them leaves or dies (the check and the registration are one script:
                           services/coordinator/worker_registry.py)
    max_leases             task leases all its identities may hold together (the lease script reads it:
                           services/coordinator/work_scripts.py), beside what the credential has earned
    registrations_per_min  its registration bucket (services/coordinator/registration_limit.py), in bursts of
                           2 x max_workers (every worker rejoining at once after an outage, and as many retries)

The run file's [credentials] section is every credential's default; an admin sets a credential's own at its
issue (`relay-rl operators issue NAME --max-workers N ...`) or later (`relay-rl operators budget ID ...`,
PATCH /v1/operators/{id}), stored in the credential's record (RunKeys.operator: the fields below, absent ones
take the default). The cluster's shared join token (credential id "") always has the defaults: it is for a
local cluster, where the run file says what it gets.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.typing import EncodableT

from services.coordinator.registration_limit import Rate
from shared.api import CredentialBudget, CredentialBudgetUpdate
from shared.bus import redis_text
from shared.config import CredentialConfig
from shared.keys import RunKeys

BUDGET_FIELDS = ("max_workers", "max_leases", "registrations_per_min")


@dataclass(frozen=True)
class Budgets:
    redis: redis.Redis
    keys: RunKeys
    defaults: CredentialConfig

    def of(self, credential_id: str) -> CredentialBudget:
        """The credential's budget: its own fields where an admin set them, the run's defaults elsewhere."""
        own = {}
        if credential_id:
            values = self.redis.hmget(self.keys.operator(credential_id), list(BUDGET_FIELDS))
            own = {name: redis_text(value) for name, value in zip(BUDGET_FIELDS, values, strict=True) if value}
        return CredentialBudget.model_validate(
            {name: own.get(name, getattr(self.defaults, name)) for name in BUDGET_FIELDS}
        )

    def set(self, credential_id: str, update: CredentialBudgetUpdate) -> CredentialBudget:
        """Store an admin's fields for an issued credential (the caller checked it exists); returns the budget now."""
        if not credential_id:
            raise ValueError("the shared join token's budget is the run file's [credentials] section")
        fields: dict[EncodableT, EncodableT] = {
            name: repr(value) if isinstance(value, float) else str(value)
            for name, value in update.model_dump(exclude_none=True).items()
        }
        if fields:
            self.redis.hset(self.keys.operator(credential_id), mapping=fields)
        return self.of(credential_id)


BURST_PER_WORKER = 2  # a credential's bucket holds this many registrations per worker of its cap


def registration_rate(budget: CredentialBudget) -> Rate:
    """A credential's registration bucket: its rate, in bursts of twice its worker cap."""
    return Rate(per_min=budget.registrations_per_min, burst=BURST_PER_WORKER * budget.max_workers)


def address_rate(defaults: CredentialConfig) -> Rate:
    """The unauthenticated path's bucket per source address: as a default credential's."""
    return Rate(per_min=defaults.registrations_per_min_per_address, burst=BURST_PER_WORKER * defaults.max_workers)
