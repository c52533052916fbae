"""Quarantine end to end with real parts (docs/trust.md): real Redis, the real coordinator app under uvicorn,
the learner's real BatchCollector and TrustMonitor. The learner state reports a worker as suspect -> the
control loop quarantines it (heartbeat answer, /metrics, the QUARANTINE key) -> the learner drops its groups
with reason `quarantined` and trains the others -> an admin releases it -> not re-quarantined on the old
score, quarantined again once a post-release score is suspect."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from services.learner.batch import BatchCollector
from services.learner.trust_monitor import TrustMonitor
from shared.api import HeartbeatResponse, ReleaseResponse, WorkerState
from shared.bus import StreamBus
from shared.config import RunConfig, TrustConfig
from shared.keys import RunKeys
from shared.messages import LearnerState, WorkerTrust
from shared.streams import LEARNER_STATE, QUARANTINE, SCORED
from tests.coordinator_rest import ADMIN_TOKEN, ServeCoordinator, bearer, register
from tests.integration.test_learner_admission import scored
from tests.polling import wait_for

pytestmark = pytest.mark.integration


def trust(*, suspect: bool, num_releases_seen: int = 0) -> WorkerTrust:
    return WorkerTrust(
        score=12.0 if suspect else 0.0,
        suspect=suspect,
        num_groups=20,
        num_suspicious=12 if suspect else 0,
        num_audits=5,
        num_audit_failures=2 if suspect else 0,
        num_releases_seen=num_releases_seen,
        last_statistic_nats=0.5,
    )


def learner_state(run_id: str, by_worker: dict[str, WorkerTrust]) -> LearnerState:
    return LearnerState(
        run_id=run_id,
        status="training",
        learner_version=3,
        published_version=3,
        staleness_bound=2,
        num_steps_target=100,
        trust_by_worker=by_worker,
    )


def state_of(api: httpx.Client, worker_id: str) -> WorkerState:
    return WorkerState(api.get(f"/v1/workers/{worker_id}").json()["state"])


def test_a_suspect_worker_is_quarantined_its_groups_dropped_and_an_admin_releases_it(
    run_id: str, bus: StreamBus, keys: RunKeys, serve_coordinator: ServeCoordinator, tmp_path: Path
) -> None:
    served = serve_coordinator(RunConfig(run_id=run_id))
    api = served.client
    liar, honest = register(api, "liar"), register(api, "honest")
    bus.put_state(
        LEARNER_STATE,
        learner_state(run_id, {liar.worker_id: trust(suspect=True), honest.worker_id: trust(suspect=False)}),
    )

    wait_for(lambda: state_of(api, liar.worker_id) == WorkerState.QUARANTINED, "the liar quarantined")
    assert state_of(api, honest.worker_id) == WorkerState.ACTIVE
    beat = api.post(f"/v1/workers/{liar.worker_id}/heartbeat", json={"policy_version": 3}, headers=bearer(liar.token))
    assert HeartbeatResponse.model_validate(beat.json()).state == WorkerState.QUARANTINED
    metrics = api.get("/metrics").text
    assert 'relayrl_fleet_workers{state="quarantined"} 1.0' in metrics
    assert f'relayrl_fleet_worker_trust_suspect{{worker="{liar.worker_id}"}} 1.0' in metrics
    assert liar.worker_id not in {a["worker_id"] for a in api.get("/v1/broadcast/plan").json()["assignments"]}
    quarantine = bus.get_state(QUARANTINE)
    assert quarantine is not None and quarantine.worker_ids == [liar.worker_id]

    # the learner: the liar's queued groups are dropped with reason `quarantined`, the honest one's trained
    collector = BatchCollector(
        bus, keys, staleness_bound=2, groups_per_step=2, vocab_size=16, max_positions=32, scored_block_ms=50
    )
    collector.ensure_group()
    monitor = TrustMonitor(TrustConfig(), torch.nn.Linear(1, 1), bus, tmp_path / "trust.jsonl")
    for worker_id in (liar.worker_id, honest.worker_id, liar.worker_id, honest.worker_id):
        group = scored(run_id, 3)
        bus.publish(
            SCORED, group.model_copy(update={"rollout": group.rollout.model_copy(update={"worker_id": worker_id})})
        )
    monitor.refresh_quarantine(collector)
    batch = collector.collect(3, should_stop=lambda: False)
    assert batch is not None
    assert {a.group.rollout.worker_id for a in batch.groups} == {honest.worker_id}
    assert collector.num_dropped == {"quarantined": 2}

    # release: the admin token only; back to active, out of the key, its release counted
    assert api.post(f"/v1/workers/{liar.worker_id}/release", headers=bearer(liar.token)).status_code == 403
    response = api.post(f"/v1/workers/{liar.worker_id}/release", headers=bearer(ADMIN_TOKEN))
    assert response.status_code == 200, response.text
    released = ReleaseResponse.model_validate(response.json())
    assert released.state == WorkerState.ACTIVE and released.num_releases == 1
    assert api.post(f"/v1/workers/{liar.worker_id}/release", headers=bearer(ADMIN_TOKEN)).status_code == 409
    quarantine = bus.get_state(QUARANTINE)
    assert quarantine is not None and quarantine.worker_ids == [] and quarantine.num_releases == {liar.worker_id: 1}
    monitor.refresh_quarantine(collector)
    assert collector.quarantined == frozenset()

    # the learner's pre-release score (suspect, 0 releases seen) is not acted on again ...
    served.app.state.control.run_once()
    assert state_of(api, liar.worker_id) == WorkerState.ACTIVE
    # ... a post-release one is
    bus.put_state(LEARNER_STATE, learner_state(run_id, {liar.worker_id: trust(suspect=True, num_releases_seen=1)}))
    wait_for(lambda: state_of(api, liar.worker_id) == WorkerState.QUARANTINED, "the liar quarantined again")
