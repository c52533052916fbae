"""The relay plan as the coordinator serves it: who fetches the next weight version from whom.

The plan is computed on every read from the registry (alive workers, their reported bandwidth, whether the
coordinator's probe reached their chunk server: services/coordinator/reachability.py) and what relay
children observed of their parents (`RelayKeys`: each child's latest observation, each parent's misses),
so it follows joins, drains, deaths, workers behind NAT and parents that do not deliver with no state of
its own (shared/weight_channel/relay_plan.py holds the rule). Serving a worker its parent records that
assignment: the heartbeat script keeps a child's observation only of the parent it was assigned. Swap
reports arrive with heartbeats and become T_bcast in services/coordinator/broadcast_times.py. Served by
services/coordinator/routers/broadcast.py.
"""

from __future__ import annotations

import logging

from services.coordinator.broadcast_times import BroadcastTimes, RelayKeys
from services.coordinator.deps import Coordinator
from services.coordinator.measurements import BAD_MEASUREMENTS, bounded_float, bounded_int
from services.coordinator.worker_registry import WorkerDeadError
from shared.api import (
    MAX_BYTES,
    MAX_DURATION_S,
    MAX_VERSION,
    ParentResponse,
    RelayAssignmentInfo,
    RelayPlanResponse,
    WorkerInfo,
    WorkerState,
)
from shared.bus import redis_text
from shared.messages import MessageDecodeError
from shared.streams import WEIGHTS
from shared.weight_channel import (
    LEARNER,
    Delivery,
    ParentObservation,
    RelayCandidate,
    RelayPlan,
    WeightsError,
    announced_source,
    deliveries,
    plan_relay,
)

log = logging.getLogger(__name__)

# who is in the plan (fetches from it and relays): active workers and standbys, which keep their
# weights fresh anyway; a draining worker is leaving and a dead one is gone
RELAY_STATES = (WorkerState.ACTIVE, WorkerState.STANDBY)


def relay_plan_response(coordinator: Coordinator) -> RelayPlanResponse:
    """The whole plan, each assignment with the bandwidth it was ranked by (reported and measured)."""
    workers = coordinator.registry.list_live()
    measured = BroadcastTimes(coordinator.redis, coordinator.keys).measured_mbps()
    learner_url, current_version = read_learner_url(coordinator), read_current_version(coordinator)
    plan = compute_plan(coordinator, workers, measured, current_version)
    by_id = {w.worker_id: w for w in workers}
    return RelayPlanResponse(
        learner_url=learner_url,
        num_seeds=coordinator.run.broadcast.relay_num_seeds,
        fanout=coordinator.run.broadcast.relay_fanout,
        max_depth=plan.max_depth,
        assignments=[
            RelayAssignmentInfo(
                worker_id=a.worker_id,
                name=by_id[a.worker_id].name,
                parent_id=a.parent_id,
                parent_url=a.parent_url or learner_url,
                depth=a.depth,
                reported_mbps=by_id[a.worker_id].bandwidth_mbps,
                measured_mbps=measured.get(a.worker_id),
                fallback_urls=list(a.fallback_urls),
                inbound_reachable=by_id[a.worker_id].inbound_reachable,
            )
            for a in plan.assignments.values()
        ],
    )


def parent_response(coordinator: Coordinator, worker_id: str) -> ParentResponse:
    """`worker_id`'s place in the plan; the learner, with the relayers as fallbacks, for a worker alive
    but outside it. Raises UnknownWorkerError, or WorkerDeadError for a dead worker."""
    worker = coordinator.registry.get(worker_id)
    if worker.state == WorkerState.DEAD:
        raise WorkerDeadError(f"worker {worker_id} is dead (its lease expired); register again")
    workers = coordinator.registry.list_live()
    measured = BroadcastTimes(coordinator.redis, coordinator.keys).measured_mbps()
    learner_url, current_version = read_learner_url(coordinator), read_current_version(coordinator)
    plan = compute_plan(coordinator, workers, measured, current_version)
    assignment = plan.parent_of(worker_id)
    record_assignment(coordinator, worker_id, assignment.parent_url if assignment is not None else "")
    if assignment is None:
        url_of = {w.worker_id: w.endpoint_url for w in workers}
        fallbacks = [url_of[worker_id] for worker_id in plan.relayer_ids]  # shallowest first
        return ParentResponse(
            worker_id=worker_id,
            parent_id=LEARNER,
            parent_url="",
            depth=1,
            fallback_urls=fallbacks[:8],
            learner_url=learner_url,
        )
    return ParentResponse(
        worker_id=worker_id,
        parent_id=assignment.parent_id,
        parent_url=assignment.parent_url,
        depth=assignment.depth,
        fallback_urls=list(assignment.fallback_urls),
        learner_url=learner_url,
    )


def compute_plan(
    coordinator: Coordinator,
    workers: list[WorkerInfo],
    measured_mbps: dict[str, float],
    current_version: int | None = None,
) -> RelayPlan:
    config = coordinator.run.broadcast
    by_url = read_deliveries(coordinator, {w.worker_id for w in workers if w.state in RELAY_STATES})
    candidates = [
        RelayCandidate(
            worker_id=w.worker_id,
            endpoint_url=w.endpoint_url,
            reported_mbps=w.bandwidth_mbps,
            measured_mbps=measured_mbps.get(w.worker_id),
            alive=w.state in RELAY_STATES,
            delivery=by_url.get(w.endpoint_url, Delivery()) if w.endpoint_url else Delivery(),
            # probing off ([broadcast] probe_inbound): every chunk server is taken as reachable
            inbound_reachable=w.inbound_reachable if config.probe_inbound else True,
        )
        for w in workers
    ]
    return plan_relay(
        candidates, num_seeds=config.relay_num_seeds, fanout=config.relay_fanout, current_version=current_version
    )


def record_assignment(coordinator: Coordinator, worker_id: str, parent_url: str) -> None:
    """Remember the parent served to `worker_id` ('' for the learner): its next swap report may speak of
    that parent only (services/coordinator/heartbeat_batch.py)."""
    relay = RelayKeys.of(coordinator.keys)
    if parent_url:
        coordinator.redis.hset(relay.assigned, worker_id, parent_url)
    else:
        coordinator.redis.hdel(relay.assigned, worker_id)


def read_deliveries(coordinator: Coordinator, alive_ids: set[str]) -> dict[str, Delivery]:
    """By parent URL: what the alive children's latest reports and the recorded misses say of it
    (shared/weight_channel/relay_plan.py `deliveries`); a bad stored entry is dropped and counted."""
    relay = RelayKeys.of(coordinator.keys)
    stored = coordinator.redis.hgetall(relay.observed).items()
    parsed = (parse_observation(redis_text(c, errors="replace"), redis_text(v, errors="replace")) for c, v in stored)
    observations = [o for o in parsed if o is not None and o.child_id in alive_ids]
    misses: dict[str, tuple[int, int]] = {}
    for url, value in coordinator.redis.hgetall(relay.misses).items():
        version_text, _, count_text = redis_text(value, errors="replace").partition(" ")
        version = bounded_int(version_text, "relay.misses", 0, MAX_VERSION)
        count = bounded_int(count_text, "relay.misses", 1, MAX_VERSION)
        if version is not None and count is not None:
            misses[redis_text(url, errors="replace")] = (version, count)
    return deliveries(observations, misses)


def parse_observation(child_id: str, value: str) -> ParentObservation | None:
    """ "<version> <parent_bytes> <num_bytes> <seconds> <parent_url>" as the heartbeat script stores it."""
    parts = value.split(" ", 4)
    if len(parts) != 5:
        BAD_MEASUREMENTS.count("relay.observed", value)
        return None
    version = bounded_int(parts[0], "relay.observed", 0, MAX_VERSION)
    parent_bytes = bounded_int(parts[1], "relay.observed", 0, MAX_BYTES)
    num_bytes = bounded_int(parts[2], "relay.observed", 1, MAX_BYTES)
    seconds = bounded_float(parts[3], "relay.observed", -MAX_DURATION_S, MAX_DURATION_S)
    if version is None or parent_bytes is None or num_bytes is None or seconds is None:
        return None
    return ParentObservation(child_id, version, parts[4], min(parent_bytes, num_bytes), num_bytes, seconds)


def read_current_version(coordinator: Coordinator) -> int | None:
    """The newest announced version (it ends probations), None before any (or if unreadable)."""
    try:
        announcement = coordinator.bus.latest(WEIGHTS)
    except MessageDecodeError as exc:
        log.warning("newest weights announcement is unusable: %s", exc)
        return None
    return None if announcement is None else announcement.policy_version


def read_learner_url(coordinator: Coordinator) -> str:
    """The learner's chunk server as the newest announcement names it; '' before any (or if unreadable)."""
    try:
        announcement = coordinator.bus.latest(WEIGHTS)
        if announcement is None:
            return ""
        base_url, _ = announced_source(announcement)
    except (MessageDecodeError, WeightsError) as exc:
        log.warning("newest weights announcement is unusable: %s", exc)
        return ""
    return base_url
