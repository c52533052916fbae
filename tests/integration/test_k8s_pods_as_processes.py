"""The CPU demo chart, run here as processes (no cluster here; tests/k8s_pods.py says what is made local):
Redis from its init script's ACL file, then the coordinator, reward service, learner and one worker (its own
`relay-rl worker` command: the settings from the coordinator's bootstrap), each with its init containers,
command, environment and probes as rendered. Every probe passes and the learner
trains on the worker's rollouts: the chart's wiring (Service names, ports, Redis users and passwords, the
run file, the model folders) holds together."""

from __future__ import annotations

import ssl
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cluster.processes import ServiceProcess
from cluster.redis_server import RedisServer
from shared.api import StatusResponse
from shared.run_records import LearnerSummary
from tests.helm_chart import REPO_ROOT, VALUES, Container, containers, find, render, secret_values
from tests.k8s_pods import LocalPods
from tests.polling import wait_for

# slow: 23 s on 2 quiet cores, up to 53 s on busy ones (four processes import torch); `make k8s-validate` (CI) runs it
pytestmark = [pytest.mark.integration, pytest.mark.slow]
POD_ORDER = (("Deployment", "-reward"), ("Job", "-learner"), ("Deployment", "-worker"))


def pod_containers(objects: list[dict], kind: str, suffix: str) -> tuple[list[Container], Container]:
    """(init containers, the main container) of one rendered pod template."""
    found = list(containers([find(objects, kind, suffix)]))
    (main,) = [c for c in found if not c.init]
    return [c for c in found if c.init], main


@pytest.mark.parametrize("learner_processes", [1, 2])
def test_the_cpu_demo_chart_runs_as_processes_and_the_learner_trains(learner_processes: int, tmp_path: Path) -> None:
    """learner_processes 2: the learner pod's torchrun command (FSDP2 over 2 gloo ranks on CPU), as the GPU
    values run it over G GPUs."""
    objects = render(
        [VALUES / "cpu-demo.yaml", secret_values(tmp_path)],
        REPO_ROOT / "configs/demo.toml",
        ["--set=workers.replicas=1", f"--set=learner.processesPerNode={learner_processes}"],
    )
    pods = LocalPods(objects, tmp_path / "pods")
    (redis_init,), redis_main = pod_containers(objects, "StatefulSet", "-redis")
    pods.run(redis_init)
    data_dir = pods.volume_dir(redis_main, "data")
    server = RedisServer(
        data_dir,
        port=pods.local_port(redis_main.owner["metadata"]["name"], 6379),
        acl_file=data_dir / "users.acl",
        probe_user=("operator", pods.env(redis_main)["RL_REDIS_PASSWORD_OPERATOR"]),
    ).start()
    started: dict[str, tuple[Container, ServiceProcess]] = {}
    try:
        _, coordinator = pod_containers(objects, "Deployment", "-coordinator")
        started["coordinator"] = (coordinator, pods.start(coordinator))

        def start_pod(kind: str, suffix: str) -> None:
            """Its init containers in order (model-init: the tiny policy; wait-for-coordinator), then its main."""
            init_containers, main = pod_containers(objects, kind, suffix)
            for init in init_containers:
                pods.run(init)
            started[suffix] = (main, pods.start(main))

        # the three pods start side by side, as a cluster would start them
        with ThreadPoolExecutor(max_workers=3) as pool:
            pod_starts = [pool.submit(start_pod, *pod) for pod in POD_ORDER]
            for pod_start in pod_starts:
                pod_start.result()  # an init container that failed raises here
        for name, (container, process) in started.items():
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe in container.spec:
                    wait_for(
                        lambda c=container, p=probe, s=process: pods.probe_passes(c, p) or not s.alive(),
                        f"{name} {probe}",
                        timeout_s=180,
                        interval_s=0.5,
                    )
                    assert process.alive(), f"{name} exited:\n{process.log_tail()}"

        # https only, its certificate chaining to the run CA the workers verify it with
        base = f"https://127.0.0.1:{pods.env(coordinator)['RL_COORDINATOR_PORT']}"
        (ca_secret,) = [
            o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-coordinator-ca")
        ]
        ca = ssl.create_default_context(cadata=ca_secret["stringData"]["ca.crt"])

        def learner_version() -> int:
            status = StatusResponse.model_validate_json(httpx.get(f"{base}/v1/status", verify=ca).content)
            return status.learner.learner_version if status.learner is not None else 0

        wait_for(
            lambda: learner_version() >= 2,
            "two learner steps on the worker's rollouts",
            timeout_s=180,
            interval_s=0.5,
            explain=lambda: "\n".join(p.log_tail() for _, p in started.values()),
        )
        annotations = coordinator.owner["spec"]["template"]["metadata"]["annotations"]
        metrics = httpx.get(f"{base}{annotations['prometheus.io/path']}", verify=ca)
        assert metrics.status_code == 200 and "relayrl_learner_version" in metrics.text
    finally:
        exit_codes = {name: process.stop() for name, (_, process) in reversed(started.items())}
        server.stop()
    # SIGTERM: the step in hand finished, a checkpoint on the learner's claim, then exit 0; torchrun itself
    # exits 1 after its ranks stopped so (its SignalException, docs/distributed_learner.md)
    assert exit_codes["-learner"] == (0 if learner_processes == 1 else 1)
    learner, _ = started["-learner"]
    run_dir = Path(pods.env(learner)["RL_RUN_DIR"])
    summary = LearnerSummary.model_validate_json((run_dir / "learner_summary.json").read_text())
    assert summary.stop_reason == "signal" and summary.policy_version >= 2
    assert (run_dir / "checkpoints" / "latest.pt").is_file()
