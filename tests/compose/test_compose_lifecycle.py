"""docker-compose.yml on a real Docker engine: the lifecycles a user goes through, in one run of the stack.

    up            every healthcheck passes, the learner trains
    kill -9       of worker-0, the coordinator, Redis and the learner (the process inside its container, from
                  the host: not `docker kill`, which disables the restart policy): each is restarted by its
                  policy and training goes on
    outside       a worker started with `relay-rl worker` on this machine, outside the compose network, with a
                  join credential the admin issued for it (POST /v1/operators: the compose workers' own is
                  theirs), joins through the published ports (the coordinator's https, verified with the run CA
                  `relay-rl keys --compose` made) and the advertised RL_PUBLIC_HOST addresses, gets a verified
                  version and has groups accepted; then it is drained (exit 0)
    stop + up     (what Ctrl-C then `up` does) resumes the run: the learner's version goes on from where it
                  was, the model folder is the same bytes
    down + up     containers removed, volumes kept: resumes again
    accounting    with every consumer stopped, every task issued is accounted for (cluster/accounting.py)
    down -v       removes containers, network and volumes

Needs a Docker engine with Compose v2, the image `relay-rl:latest` and the base image `redis:7.2-bookworm`
(`make test-compose` builds both; .ci/compose sets up the engine on a CI machine). Skips without them, fails
instead under RL_REQUIRE_DOCKER=1. RL_COMPOSE_REPORT=<file>: the timeline as JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from cluster.cli import COMPOSE_TLS_HOSTS
from cluster.secrets import ClusterSecrets, outbound_address, write_private
from cluster.tls import make_run_certificates
from shared.api import OPERATORS_PATH, IssuedOperator

pytestmark = [pytest.mark.compose, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE = "relay-rl:latest"
REDIS_IMAGE = "redis:7.2-bookworm"
PUBLISHED_PORTS = (8000, 8100, 8200, 8201, 8202)
COORDINATOR = "https://127.0.0.1:8000"  # the coordinator's certificate names 127.0.0.1 (COMPOSE_TLS_HOSTS)
KILLED = ("worker-0", "coordinator", "redis", "learner")
CONSUMERS = ("worker-0", "worker-1", "worker-2", "learner", "reward", "coordinator")
STEP_TIMEOUT_S = 240.0


def _missing_docker() -> str | None:
    if shutil.which("docker") is None:
        return "no docker command"
    checks = {
        "no Docker engine answers": ["docker", "info"],
        "no Compose v2 plugin": ["docker", "compose", "version"],
        f"no image {IMAGE} (make test-compose builds it)": ["docker", "image", "inspect", IMAGE],
        f"no image {REDIS_IMAGE}": ["docker", "image", "inspect", REDIS_IMAGE],
    }
    for reason, command in checks.items():
        if subprocess.run(command, capture_output=True, timeout=60).returncode != 0:
            return reason
    for port in PUBLISHED_PORTS:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return f"port {port} is taken on this machine (the compose file publishes it)"
    return None


@dataclass
class Stack:
    """One compose project of the repo's docker-compose.yml, with its own .env."""

    project: str
    env_file: Path
    env: dict[str, str]
    ca_file: Path  # the run CA: what this test (and the outside worker) verify the coordinator with
    timeline: dict[str, float] = field(default_factory=dict)

    def verify(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def compose(self, *args: str, timeout_s: float = 300.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = ["docker", "compose", "-p", self.project, "--env-file", str(self.env_file), *args]
        result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def container(self, service: str) -> str:
        (container_id,) = self.compose("ps", "-a", "-q", service).stdout.split()
        return container_id

    def inspect(self, service: str, template: str) -> str:
        out = subprocess.run(
            ["docker", "inspect", "-f", template, self.container(service)], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()

    def learner_version(self) -> int:
        try:
            status = httpx.get(f"{COORDINATOR}/v1/status", timeout=3.0, verify=self.verify())
        except httpx.HTTPError:
            return -1
        if status.status_code != 200 or status.json()["learner"] is None:
            return -1
        return int(status.json()["learner"]["learner_version"])

    def workers(self) -> list[dict[str, object]]:
        return list(httpx.get(f"{COORDINATOR}/v1/status", timeout=3.0, verify=self.verify()).json()["workers"])

    def model_digest(self) -> str:
        out = self.compose("exec", "-T", "learner", "sha256sum", "/data/runs/compose/model/model.safetensors")
        return out.stdout.split()[0]

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "60", check=False, timeout_s=60).stdout


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, stack: Stack | None = None) -> float:
    """Seconds until `predicate` held (polled every 0.5 s); AssertionError with the services' logs after `timeout_s`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            logs = stack.logs() if stack is not None else ""
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}\n{logs}")
        time.sleep(0.5)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    reason = _missing_docker()
    if reason is not None:
        if os.environ.get("RL_REQUIRE_DOCKER") == "1":
            pytest.fail(f"RL_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("compose")
    secrets = ClusterSecrets.generate()
    public_host = outbound_address()  # this machine's address: reachable from the containers and from here
    env_file = folder / ".env"
    tls = make_run_certificates(folder / "tls", COMPOSE_TLS_HOSTS)  # what `make keys` makes beside .env
    write_private(env_file, secrets.compose_env_text(folder / "tls") + f"RL_PUBLIC_HOST={public_host}\n")
    stack = Stack(
        project=f"relayrl-e2e-{os.getpid()}",
        env_file=env_file,
        env={**secrets.compose_env(folder / "tls"), "host": public_host},
        ca_file=tls.ca_file,
    )
    try:
        yield stack
    finally:
        stack.compose("down", "-v", "--remove-orphans", "--timeout", "20", check=False, timeout_s=180)
        report = os.environ.get("RL_COMPOSE_REPORT")
        if report:
            dated = {"command": "make test-compose", "date": time.strftime("%Y-%m-%d", time.gmtime()), **stack.timeline}
            Path(report).write_text(json.dumps(dated, indent=2) + "\n")
        print(json.dumps(stack.timeline, indent=2))


def test_a_compose_cluster_through_its_lifecycle(stack: Stack, tmp_path: Path) -> None:
    # up: every service healthy, the learner trains
    start = time.monotonic()
    stack.compose("up", "-d", "--pull", "never", "--wait", "--wait-timeout", "300", timeout_s=420)
    stack.timeline["up_to_healthy_s"] = time.monotonic() - start
    wait_until(lambda: stack.learner_version() >= 1, STEP_TIMEOUT_S, "the learner's first step", stack)
    stack.timeline["up_to_first_step_s"] = time.monotonic() - start
    model_digest = stack.model_digest()

    # kill -9 of each service's process inside its container: restarted by its policy, training goes on
    for service in KILLED:
        version = max(stack.learner_version(), 0)
        restarts = int(stack.inspect(service, "{{.RestartCount}}"))
        os.kill(int(stack.inspect(service, "{{.State.Pid}}")), signal.SIGKILL)
        killed_at = time.monotonic()

        def healthy(service: str = service, restarts: int = restarts) -> bool:
            state = stack.inspect(service, "{{.RestartCount}} {{.State.Status}} {{.State.Health.Status}}").split()
            return int(state[0]) > restarts and state[1:] == ["running", "healthy"]

        wait_until(healthy, STEP_TIMEOUT_S, f"{service} restarted and healthy after kill -9", stack)
        stack.timeline[f"kill_{service}_to_healthy_s"] = time.monotonic() - killed_at
        wait_until(lambda v=version: stack.learner_version() > v, STEP_TIMEOUT_S, f"training after {service}", stack)
        stack.timeline[f"kill_{service}_to_next_step_s"] = time.monotonic() - killed_at

    # a worker outside the compose network joins through the published ports
    outside_s = join_from_outside(stack, tmp_path)
    stack.timeline.update(outside_s)

    # stop + up (Ctrl-C, then up again), then down + up: the run resumes, the model folder is the same
    for how, stop in (("stop", ("stop", "--timeout", "20")), ("down", ("down", "--timeout", "20"))):
        before = stack.learner_version()
        stack.compose(*stop, timeout_s=180)
        start = time.monotonic()
        stack.compose("up", "-d", "--pull", "never", "--wait", "--wait-timeout", "300", timeout_s=420)
        wait_until(lambda b=before: stack.learner_version() > b, STEP_TIMEOUT_S, f"a step after {how} + up", stack)
        stack.timeline[f"{how}_up_to_next_step_s"] = time.monotonic() - start
        # resumed from its checkpoint, not started over from version 0
        resumed = re.findall(r"resumed at version (\d+)", stack.compose("logs", "--no-color", "learner").stdout)
        assert resumed and int(resumed[-1]) >= before, resumed  # SIGTERM: the learner checkpoints, then exits
        stack.timeline[f"{how}_up_resumed_at_version"] = float(resumed[-1])
        assert stack.model_digest() == model_digest, f"the model folder changed on {how} + up"

    # the accounting, with every consumer stopped (Redis stays up to be read)
    stack.compose("stop", "--timeout", "20", *CONSUMERS, timeout_s=180)
    operator_url = f"redis://operator:{stack.env['RL_REDIS_PASSWORD_OPERATOR']}@redis:6379/0"
    result = stack.compose(
        "run", "--rm", "--no-deps", "-e", f"RL_REDIS_URL={operator_url}", "init-model",
        "python", "-m", "cluster.accounting", "--run-id", "compose", check=False, timeout_s=180,
    )  # fmt: skip
    accounting = json.loads(result.stdout[result.stdout.index("{") :])
    stack.timeline["groups_issued"] = float(accounting["num_tasks_issued"])
    stack.timeline["groups_trained"] = float(accounting["num_trained"])
    stack.timeline["groups_unaccounted"] = float(accounting["num_unaccounted"])
    assert result.returncode == 0 and accounting["num_unaccounted"] == 0, result.stdout + result.stderr

    # down -v: nothing of the project is left
    start = time.monotonic()
    stack.compose("down", "-v", "--timeout", "20", timeout_s=180)
    stack.timeline["down_v_s"] = time.monotonic() - start
    left = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={stack.project}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    volumes = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={stack.project}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert left == [] and volumes == []


def issue_credential(stack: Stack, name: str) -> str:
    """What the admin does for a worker on another machine (docs/docker.md): a join credential of its own."""
    response = httpx.post(
        COORDINATOR + OPERATORS_PATH,
        json={"name": name},
        headers={"Authorization": f"Bearer {stack.env['RL_ADMIN_TOKEN']}"},
        timeout=10.0,
        verify=stack.verify(),
    )
    assert response.status_code == 201, response.text
    return IssuedOperator.model_validate_json(response.content).join_token


def join_from_outside(stack: Stack, tmp_path: Path) -> dict[str, float]:
    """`relay-rl worker` on this machine (not in the compose network), with a credential issued for it:
    registers through the published coordinator port, fetches verified weights from the advertised addresses,
    has groups accepted, drains."""
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable, "-m", "cluster.cli", "worker",
        "--coordinator", COORDINATOR, "--ca-file", str(stack.ca_file), f"--token={issue_credential(stack, 'outside')}",
        "--public-key", stack.env["RL_WEIGHTS_PUBLIC_KEY"], "--work-dir", str(tmp_path / "outside"),
        "--name", "outside", "--host", "0.0.0.0", "--port", str(port),
        "--public-url", f"http://{stack.env['host']}:{port}",
    ]  # fmt: skip
    log_path = tmp_path / "outside.log"
    start = time.monotonic()
    with log_path.open("w") as log:
        worker = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:

        def outside() -> dict[str, object] | None:
            return next((w for w in stack.workers() if w["name"] == "outside"), None)

        def accepted() -> bool:
            info = outside()
            return info is not None and int(str(info["num_groups_done"])) > 0 and int(str(info["policy_version"])) >= 0

        wait_until(accepted, STEP_TIMEOUT_S, f"the outside worker's groups accepted ({log_path.read_text()[-3000:]})")
        joined_s = time.monotonic() - start
        worker.send_signal(signal.SIGINT)  # drains: finish the batch, deregister, exit 0
        assert worker.wait(timeout=120) == 0, log_path.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    return {"outside_worker_start_to_groups_accepted_s": joined_s}
