"""Quarantine: the coordinator acts on the learner's trust scores (docs/trust.md), and by policy on the work
accounting's completion flag ([work] quarantine_incomplete; services/coordinator/work_flags.py).

Every control pass (`Quarantine.apply`): a worker the learner reports as suspect (LearnerState.trust_by_worker,
`suspect`), or one flagged for answering under half the fleet's median share of its leases (with at least
[work] quarantine_min_ended_leases of them ended since its last release), that is active, standby or
draining becomes QUARANTINED: its heartbeat answers say so (it takes no
tasks and keeps heartbeating), it drops out of the relay plan, activation and billing (they consider other
states only), and its rollout key is revoked (services/coordinator/redis_access.py). The QUARANTINE key tells the learner
whose groups to drop (reason `quarantined`); an id stays in it until an admin releases the worker, even
after the worker's lease expires, so nothing it queued is ever trained on.

Quarantine sticks to the worker's join credential (services/coordinator/operators.py): every worker id in
the key that registered with an admin-issued credential is held in that credential's quarantine set, and
a credential holding one registers nobody, so the worker cannot come back under a new id with a clean
score. A credential is also quarantined for its own record (all its identities together flagged for their
completion, services/coordinator/credential_record.py, once [work] quarantine_min_ended_leases of its leases
are judged). A quarantined credential stops every live identity it holds: the lease script refuses them at
once (work_scripts.py), and each pass quarantines them here, its siblings of a quarantined worker included.
(Workers of the cluster's shared join token are one identity: nothing to hold, see join.py.)

Release (`POST /v1/workers/{id}/release`, admin token): back to ACTIVE when still leased, out of the key,
out of its credential's quarantine set, and its release count + 1; the learner resets the worker's score
when it sees the count grow, and until it has (`WorkerTrust.num_releases_seen`) the old suspect flag is
not acted on again; its completion is judged on the leases that end after the release (a baseline of its
counters, services/coordinator/work_accounting.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from services.coordinator.operators import OperatorCredentials, UnknownOperatorError
from services.coordinator.redis_access import RedisAccess
from services.coordinator.work_accounting import WorkBooks
from services.coordinator.worker_registry import UnknownWorkerError, WorkerRegistry
from shared.api import OperatorInfo, OperatorState, WorkerInfo, WorkerState
from shared.bus import StreamBus
from shared.messages import LearnerState, QuarantinedWorkers
from shared.streams import QUARANTINE

if TYPE_CHECKING:  # credential_record imports work_leases, which the app builds before this
    from services.coordinator.credential_record import CredentialBooks

log = logging.getLogger(__name__)

QUARANTINABLE_STATES = (WorkerState.ACTIVE, WorkerState.STANDBY, WorkerState.DRAINING)


class NotQuarantinedError(Exception):
    """A release of a worker that is not quarantined."""


class Quarantine:
    """`books`: the work accounting, whose completion baseline a release resets (None: no completion policy).
    `min_ended_leases`: a worker flagged for its completion is quarantined only with this many leases ended
    since its last release ([work] quarantine_min_ended_leases)."""

    def __init__(
        self,
        bus: StreamBus,
        registry: WorkerRegistry,
        access: RedisAccess,
        run_id: str,
        *,
        books: WorkBooks | None = None,
        credential_books: CredentialBooks | None = None,
        min_ended_leases: int = 0,
    ) -> None:
        self.bus = bus
        self.access = access
        self.registry = registry
        self.operators = OperatorCredentials(registry.redis, registry.keys)  # the identities quarantine sticks to
        self.run_id = run_id
        self.books = books
        self.credential_books = credential_books
        self.min_ended_leases = min_ended_leases
        self._lock = threading.Lock()  # the key is read, changed and written by passes and releases

    def current(self) -> QuarantinedWorkers:
        return self.bus.get_state(QUARANTINE) or QuarantinedWorkers(run_id=self.run_id)

    def apply(
        self,
        learner: LearnerState | None,
        workers: list[WorkerInfo],
        incomplete: Mapping[str, str] | None = None,
        incomplete_credentials: Mapping[str, str] | None = None,
    ) -> list[WorkerInfo]:
        """Quarantine every worker the learner reports as suspect, every one in `incomplete` (worker id -> why:
        flagged for its completion ratio, services/coordinator/work_flags.py), every credential in
        `incomplete_credentials` (credential id -> why: its record flagged), and every live identity of a
        quarantined credential; returns the workers as they are now."""
        incomplete = incomplete or {}
        with self._lock:
            before = self.current()
            incomplete = self.still_incomplete(incomplete)
            self.quarantine_credentials(incomplete_credentials or {})
            held = self.held_credentials(w.operator_id for w in workers)
            reasons = {
                w.worker_id: why
                for w in workers
                if w.state in QUARANTINABLE_STATES
                and (why := self.suspicion(learner, w.worker_id, before, incomplete) or held.get(w.operator_id))
            }
            after = self.registry.set_states({wid: (WorkerState.QUARANTINED, QUARANTINABLE_STATES) for wid in reasons})
            for worker_id, state in sorted(after.items()):
                if state == WorkerState.QUARANTINED:
                    log.warning("quarantined worker %s: %s", worker_id, reasons[worker_id])
                    self.access.revoke(worker_id)
            quarantined = set(before.worker_ids) | self.confirmed_quarantined(workers, before)
            quarantined |= {wid for wid, state in after.items() if state == WorkerState.QUARANTINED}
            if quarantined != set(before.worker_ids):
                self.write(sorted(quarantined), before.num_releases)
            # each pass, idempotent: a credential is held even when a pass stopped between the two writes
            self.operators.hold((w.worker_id, w.operator_id) for w in workers if w.worker_id in quarantined)
        return [w.model_copy(update={"state": after[w.worker_id]}) if after.get(w.worker_id) else w for w in workers]

    def quarantine_credentials(self, flagged: Mapping[str, str]) -> None:
        """Quarantine each issued credential of `flagged` with at least `min_ended_leases` of its leases judged
        since its last release (read now, under the lock, as for workers)."""
        issued = [credential_id for credential_id in flagged if credential_id]
        if not issued or self.credential_books is None:
            return
        judged = self.credential_books.counts_since_release(issued)
        for credential_id in issued:
            if judged[credential_id].num_judged >= self.min_ended_leases:
                reason = f"its identities together: {flagged[credential_id]}"
                if self.operators.quarantine(credential_id, reason):
                    log.warning("quarantined join credential %s: %s", credential_id, reason)

    def held_credentials(self, credential_ids: Iterable[str]) -> dict[str, str]:
        """The quarantined ones among these credentials: credential id -> why its identities are quarantined."""
        held: dict[str, str] = {}
        for credential_id in sorted({c for c in credential_ids if c}):
            try:
                info = self.operators.get(credential_id)
            except UnknownOperatorError:
                continue
            if info.state == OperatorState.QUARANTINED:
                held[credential_id] = f"its join credential {credential_id} is quarantined ({_why(info)})"
        return held

    def release_credential(self, credential_id: str) -> OperatorInfo:
        """An admin's release of a quarantined credential: its record is judged afresh, its reason cleared and
        each worker it holds in quarantine released. Raises UnknownOperatorError, or NotQuarantinedError."""
        with self._lock:
            info = self.operators.get(credential_id)
            if info.state != OperatorState.QUARANTINED:
                raise NotQuarantinedError(f"join credential {credential_id} is {info.state.value}, not quarantined")
            if self.credential_books is not None:
                self.credential_books.mark_released(credential_id)
            self.operators.clear_reason(credential_id)
        for worker_id in info.quarantined_worker_ids:
            with contextlib.suppress(UnknownWorkerError, NotQuarantinedError):
                self.release(worker_id)
            self.operators.release(worker_id)  # a worker pruned meanwhile leaves the set too
        log.info("join credential %s released by an admin", credential_id)
        return self.operators.get(credential_id)

    def still_incomplete(self, incomplete: Mapping[str, str]) -> Mapping[str, str]:
        """Those of `incomplete` with at least `min_ended_leases` ended since their last release, read now under
        the lock: the flags were computed before it, and an admin's release since then starts a worker afresh."""
        if not incomplete or self.books is None:
            return incomplete
        ended = self.books.counts_since_release(incomplete)
        return {wid: why for wid, why in incomplete.items() if ended[wid].num_judged >= self.min_ended_leases}

    @staticmethod
    def suspicion(
        learner: LearnerState | None, worker_id: str, before: QuarantinedWorkers, incomplete: Mapping[str, str]
    ) -> str | None:
        """Why the worker is to be quarantined (None: it is not): its trust score, or its completion."""
        trust = learner.trust_by_worker.get(worker_id) if learner is not None else None
        # a score the learner computed before the worker's latest release is not acted on again
        if trust is not None and trust.suspect and trust.num_releases_seen >= before.num_releases.get(worker_id, 0):
            return (
                f"trust score {trust.score:.1f} ({trust.num_suspicious} of {trust.num_groups} groups suspicious, "
                f"{trust.num_audit_failures} of {trust.num_audits} audits failed)"
            )
        return incomplete.get(worker_id)

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
            if self.books is not None:  # its completion is judged afresh (before it may lease again)
                self.books.mark_released(worker_id)
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


def _why(info: OperatorInfo) -> str:
    if info.quarantine_reason:
        return info.quarantine_reason
    return f"with its worker {', '.join(info.quarantined_worker_ids)}"
