"""This worker's membership in the cluster: register, heartbeat from a thread, re-register, leave.

Policies at this boundary:
- CoordinatorUnavailableError: retry with exponential backoff (registration blocks until it succeeds or
  the worker is stopping; heartbeats keep the interval and back off in between).
- RegistrationThrottledError (429): registrations come too fast; wait at least its Retry-After (plus
  jitter, so a fleet coming back after an outage spreads out), then try again.
- WorkerExpiredError (410, or 404 on a heartbeat): the coordinator declared us dead (e.g. we were
  partitioned longer than the lease) or lost our record; register again as ourselves (the previous id
  and token: the coordinator revives our record, same id and totals). If it no longer knows the id it
  gives a new one; if it refuses the token (403), we register as a new worker.
- Anything else (CoordinatorRejectedError: bad token, bad body): a bug or misconfiguration; the heartbeat
  thread stops and `raise_if_failed` re-raises it in the main loop.

The state in every registration and heartbeat answer is obeyed: ACTIVE takes tasks; STANDBY takes none
but keeps heartbeating and keeps its weights fresh (`on_standby`, checked by the worker loop);
QUARANTINED (the coordinator caught it lying, docs/trust.md) is obeyed like STANDBY: no tasks, heartbeats
go on, so an admin's release (back to ACTIVE) reaches it; DRAINING sets the worker's stop flag, so it finishes the batch in hand (published and acked),
deregisters and exits, exactly as on SIGTERM.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from services.rollout.coordinator_client import (
    CoordinatorClient,
    CoordinatorError,
    CoordinatorUnavailableError,
    IdentityRejectedError,
    RegistrationThrottledError,
    WorkerExpiredError,
)
from shared.api import (
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterWorkerRequest,
    RegisterWorkerResponse,
    WorkerState,
)
from shared.retry import Backoff

log = logging.getLogger(__name__)

COORDINATOR_MAX_BACKOFF_S = 2.0  # registration and heartbeats: no more often than heartbeats in an outage, and a
# worker back from a partition (docs/wan.md) is back within 2 s of the link healing


class NotRegisteredError(RuntimeError):
    """The worker stopped before the coordinator accepted its registration."""


class Membership:
    def __init__(
        self,
        client: CoordinatorClient,
        request: RegisterWorkerRequest,
        report: Callable[[], HeartbeatRequest],
        stopping: threading.Event,
    ) -> None:
        self.client = client
        self.request = request
        self.report = report  # called from the heartbeat thread: what to tell the coordinator now
        self.stopping = stopping  # the worker's stop flag: abandons registration retries
        self.last_heartbeat: HeartbeatResponse | None = None
        self.num_registrations = 0
        self.state = WorkerState.ACTIVE  # as the coordinator last said
        self._registration: RegisterWorkerResponse | None = None
        self._lock = threading.Lock()
        self._stop_heartbeats = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    @property
    def registration(self) -> RegisterWorkerResponse:
        with self._lock:
            if self._registration is None:
                raise NotRegisteredError("not registered with the coordinator")
            return self._registration

    @property
    def worker_id(self) -> str:
        return self.registration.worker_id

    @property
    def on_standby(self) -> bool:
        """Take no tasks: standby, or quarantined until an admin releases the worker."""
        return self.state in (WorkerState.STANDBY, WorkerState.QUARANTINED)

    def register(self) -> RegisterWorkerResponse:
        """Register (as the worker we were, if we were registered before), retrying while the coordinator
        is unavailable or throttling; raises NotRegisteredError if stopped first."""
        backoff = Backoff(max_s=COORDINATOR_MAX_BACKOFF_S)
        with self._lock:
            previous = self._registration
        while not self.stopping.is_set():
            request, previous_token = self.request, None
            if previous is not None:
                request = self.request.model_copy(update={"previous_worker_id": previous.worker_id})
                previous_token = previous.token
            try:
                registration = self.client.register(request, previous_token=previous_token)
            except RegistrationThrottledError as exc:
                delay_s = max(exc.retry_after_s, backoff.next_delay_s()) * random.uniform(1.0, 1.5)
                log.info("registration throttled (%s); retrying in %.1fs", exc, delay_s)
                self.stopping.wait(delay_s)
                continue
            except CoordinatorUnavailableError as exc:
                backoff.wait(self.stopping, exc, "registration with the coordinator")
                continue
            except IdentityRejectedError as exc:
                log.warning("%s; registering as a new worker", exc)
                previous = None
                continue
            with self._lock:
                self._registration = registration
                self.num_registrations += 1
            self.obey(registration.state)
            log.info(
                "%s %s (lease %.1fs, heartbeat every %.1fs, staleness bound %d)",
                "rejoined as" if registration.rejoined else "registered as",
                registration.worker_id,
                registration.lease_s,
                registration.heartbeat_interval_s,
                registration.staleness_bound,
            )
            return registration
        raise NotRegisteredError("stopped before the coordinator accepted the registration")

    def start_heartbeats(self) -> None:
        self._thread = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self._thread.start()

    def raise_if_failed(self) -> None:
        """Re-raise in the caller's thread an error that stopped the heartbeat thread."""
        if self._failure is not None:
            raise RuntimeError("the heartbeat thread failed") from self._failure

    def leave(self) -> None:
        """Stop heartbeating and deregister (best effort: the lease runs out anyway)."""
        self._stop_heartbeats.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        with self._lock:
            registration, self._registration = self._registration, None
        if registration is None:
            return
        try:
            self.client.deregister(registration.worker_id, registration.token)
            log.info("deregistered %s", registration.worker_id)
        except CoordinatorError as exc:
            log.warning("could not deregister %s (%s); its lease will expire", registration.worker_id, exc)

    def _heartbeat_loop(self) -> None:
        backoff = Backoff(max_s=COORDINATOR_MAX_BACKOFF_S)
        try:
            while not self._stop_heartbeats.wait(self.registration.heartbeat_interval_s):
                try:
                    self._send_heartbeat()
                    backoff.reset()
                except CoordinatorUnavailableError as exc:
                    backoff.wait(self._stop_heartbeats, exc, "heartbeat")
                except WorkerExpiredError as exc:
                    log.warning("%s; registering again", exc)
                    self.register()
        except NotRegisteredError:
            pass  # stopping while re-registering
        except BaseException as exc:  # noqa: B036 (handed to the main thread, see raise_if_failed)
            log.exception("heartbeat thread stopped")
            self._failure = exc

    def _send_heartbeat(self) -> None:
        registration = self.registration
        self.last_heartbeat = self.client.heartbeat(registration.worker_id, registration.token, self.report())
        self.obey(self.last_heartbeat.state)

    def obey(self, state: WorkerState) -> None:
        """Follow the state the coordinator decided (see the module doc)."""
        if state != self.state:
            log.info("coordinator says %s (was %s)", state.value, self.state.value)
        self.state = state
        if state == WorkerState.DRAINING and not self.stopping.is_set():
            log.info("draining: finishing the current batch, then leaving")
            self.stopping.set()
