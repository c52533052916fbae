"""Quarantine: the coordinator acts on the learner's trust scores (docs/trust.md).

Every control pass (`Quarantine.apply`): a worker the learner reports as suspect (LearnerState.trust_by_worker,
`suspect`) that is active, standby or draining becomes QUARANTINED: its heartbeat answers say so (it takes no
tasks and keeps heartbeating), it drops out of the relay plan, activation and billing (they consider other
states only), and its rollout key is revoked (services/coordinator/redis_access.py). The QUARANTINE key tells the learner
whose groups to drop (reason `quarantined`); an id stays in it until an admin releases the worker, even
after the worker's lease expires, so nothing it queued is ever trained on.

Quarantine sticks to the worker's join credential (services/coordinator/operators.py): every worker id in
the key that registered with an admin-issued credential is held in that credential's quarantine set, and
a credential holding one registers nobody, so the worker cannot come back under a new id with a clean
score. (Workers of the cluster's shared join token are one identity: nothing to hold, see join.py.)

Release (`POST /v1/workers/{id}/release`, admin token): back to ACTIVE when still leased, out of the key,
out of its credential's quarantine set, and its release count + 1; the learner resets the worker's score
when it sees the count grow, and until it has (`WorkerTrust.num_releases_seen`) the old suspect flag is
not acted on again.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from services.coordinator.operators import OperatorCredentials
from services.coordinator.redis_access import RedisAccess
from services.coordinator.worker_registry import UnknownWorkerError, WorkerRegistry
from shared.api import WorkerInfo, WorkerState
from shared.bus import StreamBus
from shared.messages import LearnerState, QuarantinedWorkers
from shared.streams import QUARANTINE

log = logging.getLogger(__name__)

QUARANTINABLE_STATES = (WorkerState.ACTIVE, WorkerState.STANDBY, WorkerState.DRAINING)


class NotQuarantinedError(Exception):
    """A release of a worker that is not quarantined."""


class Quarantine:
    def __init__(self, bus: StreamBus, registry: WorkerRegistry, access: RedisAccess, run_id: str) -> None:
        self.bus = bus
        self.access = access
        self.registry = registry
        self.operators = OperatorCredentials(registry.redis, registry.keys)  # the identities quarantine sticks to
        self.run_id = run_id
        self._lock = threading.Lock()  # the key is read, changed and written by passes and releases

    def current(self) -> QuarantinedWorkers:
        return self.bus.get_state(QUARANTINE) or QuarantinedWorkers(run_id=self.run_id)

    def apply(self, learner: LearnerState | None, workers: list[WorkerInfo]) -> list[WorkerInfo]:
        """Quarantine every worker the learner reports as suspect; returns the workers as they are now."""
        if learner is None:
            return workers
        with self._lock:
            before = self.current()
            suspects = {
                w.worker_id
                for w in workers
                if w.state in QUARANTINABLE_STATES
                and (trust := learner.trust_by_worker.get(w.worker_id)) is not None
                and trust.suspect
                and trust.num_releases_seen >= before.num_releases.get(w.worker_id, 0)  # not a pre-release score
            }
            after = self.registry.set_states({wid: (WorkerState.QUARANTINED, QUARANTINABLE_STATES) for wid in suspects})
            for worker_id, state in sorted(after.items()):
                if state == WorkerState.QUARANTINED:
                    trust = learner.trust_by_worker[worker_id]
                    log.warning(
                        "quarantined worker %s: trust score %.1f (%d of %d groups suspicious, %d of %d audits failed)",
                        worker_id,
                        trust.score,
                        trust.num_suspicious,
                        trust.num_groups,
                        trust.num_audit_failures,
                        trust.num_audits,
                    )
                    self.access.revoke(worker_id)
            quarantined = set(before.worker_ids) | self.confirmed_quarantined(workers, before)
            quarantined |= {wid for wid, state in after.items() if state == WorkerState.QUARANTINED}
            if quarantined != set(before.worker_ids):
                self.write(sorted(quarantined), before.num_releases)
            # each pass, idempotent: a credential is held even when a pass stopped between the two writes
            self.operators.hold((w.worker_id, w.operator_id) for w in workers if w.worker_id in quarantined)
        return [w.model_copy(update={"state": after[w.worker_id]}) if after.get(w.worker_id) else w for w in workers]

    def confirmed_quarantined(self, workers: list[WorkerInfo], before: QuarantinedWorkers) -> set[str]:
        """Workers quarantined in the registry but missing from the key (a pass stopped between its two
        writes), their state read again: `workers` was read before the lock, and an admin's release since
        then must not put a worker back in the key."""
        missing = [w.worker_id for w in workers if w.state == WorkerState.QUARANTINED]
        missing = [worker_id for worker_id in missing if worker_id not in before.worker_ids]
        confirmed = set()
        for worker_id in missing:
            with contextlib.suppress(UnknownWorkerError):
                if self.registry.get(worker_id).state == WorkerState.QUARANTINED:
                    confirmed.add(worker_id)
        return confirmed

    def release(self, worker_id: str) -> QuarantinedWorkers:
        """An admin's release. Raises UnknownWorkerError, or NotQuarantinedError when it is not quarantined."""
        with self._lock:
            before = self.current()
            if worker_id not in before.worker_ids:
                state = self.registry.get(worker_id).state  # UnknownWorkerError for an unknown id
                if state != WorkerState.QUARANTINED:
                    raise NotQuarantinedError(f"worker {worker_id} is {state.value}, not quarantined")
            # back to work if it is still leased (a quarantined worker whose lease ran out stays dead)
            self.registry.set_states({worker_id: (WorkerState.ACTIVE, (WorkerState.QUARANTINED,))})
            num_releases = {**before.num_releases, worker_id: before.num_releases.get(worker_id, 0) + 1}
            released = self.write([wid for wid in before.worker_ids if wid != worker_id], num_releases)
            credentials = self.operators.release(worker_id)
        log.info(
            "worker %s released by an admin (release %d; join credential %s)",
            worker_id,
            num_releases[worker_id],
            ", ".join(credentials) or "shared",
        )
        return released

    def write(self, worker_ids: list[str], num_releases: dict[str, int]) -> QuarantinedWorkers:
        value = QuarantinedWorkers(run_id=self.run_id, worker_ids=worker_ids, num_releases=num_releases)
        self.bus.put_state(QUARANTINE, value)
        return value
