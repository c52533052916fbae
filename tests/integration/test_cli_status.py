"""`relay-rl status` against the real coordinator app: the run, the learner, the workers by state; --json is
GET /v1/status as sent. Real redis, uvicorn."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.cli import main
from shared.api import StatusResponse
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import LearnerState
from shared.streams import LEARNER_STATE
from tests.coordinator_rest import ServeCoordinator, bearer, register

pytestmark = pytest.mark.integration


def test_status_shows_the_learner_step_reward_and_workers_by_state(
    serve_coordinator: ServeCoordinator,
    bus: StreamBus,
    keys: RunKeys,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    served = serve_coordinator(RunConfig(run_id=keys.run_id))
    register(served.client, "gpu-a")
    leaving = register(served.client, "gpu-b")
    assert (
        served.client.post(f"/v1/workers/{leaving.worker_id}/drain", headers=bearer(leaving.token)).status_code == 200
    )
    bus.put_state(
        LEARNER_STATE,
        LearnerState(
            run_id=keys.run_id,
            status="training",
            learner_version=42,
            published_version=42,
            staleness_bound=2,
            num_steps_target=200,
            num_steps_done=42,
            last_reward_mean=0.625,
        ),
    )
    no_cluster = str(tmp_path / "none")
    main(["status", "--coordinator", served.url, "--run-dir", no_cluster])
    shown = capsys.readouterr().out
    assert f"run {keys.run_id}" in shown
    assert "step 42/200" in shown and "reward 0.625" in shown
    assert "1 active" in shown and "1 draining" in shown
    assert "gpu-a" in shown and "gpu-b" in shown

    main(["status", "--coordinator", served.url, "--run-dir", no_cluster, "--json"])
    raw = StatusResponse.model_validate_json(capsys.readouterr().out)
    assert raw.learner is not None and raw.learner.learner_version == 42 and len(raw.workers) == 2


def test_status_without_a_coordinator_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["status", "--run-dir", str(tmp_path)])
    assert "cluster.env" in str(exit_info.value.code) and "make demo" in str(exit_info.value.code)
