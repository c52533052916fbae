"""`relay-rl worker` against the whole local cluster (Redis with ACLs, coordinator with RL_REDIS_ACL, reward,
learner): one worker joins with --coordinator and --token alone (it builds the tiny policy itself and gets
its Redis user at registration), one as `make worker` does (the local cluster's cluster.env); both train
the learner's batches; `relay-rl status` lists them; `relay-rl drain` and Ctrl-C each make one leave
with exit 0. Slow: a cluster start and two worker starts on 2 shared cores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cluster.local import ClusterOptions, LocalCluster
from shared.api import StatusResponse, WorkerState
from tests.polling import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUN_FILE = """run_id = "remote"
[model]
init = "tiny-random"
max_position_embeddings = 32
[task]
name = "arithmetic_mod10"
[grpo]
group_size = 8
groups_per_step = 16
max_new_tokens = 2
[schedule]
staleness_bound = 2
num_steps = 100000
max_wall_s = 900
"""


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cluster.cli", *args]


def status_of(url: str) -> StatusResponse:
    return StatusResponse.model_validate_json(httpx.get(url + "/v1/status", timeout=5.0).content)


def groups_of(url: str, name: str) -> int:
    return sum(w.num_groups_done for w in status_of(url).workers if w.name == name and w.state != WorkerState.DEAD)


def learner_version(url: str) -> int:
    learner = status_of(url).learner
    return -1 if learner is None else learner.learner_version


def wait_for_groups(url: str, name: str, log_path: Path) -> None:
    wait_for(
        lambda: groups_of(url, name) > 0,
        f"{name} publishes groups",
        timeout_s=240,
        interval_s=0.5,
        explain=lambda: log_path.read_text()[-3000:],
    )


def test_workers_join_a_local_cluster_by_url_and_token_and_by_cluster_env_then_leave(
    tmp_path: Path, repo_root: Path
) -> None:
    config = tmp_path / "remote.toml"
    config.write_text(RUN_FILE)
    cluster = LocalCluster(ClusterOptions(config_path=config, num_workers=0, runs_dir=tmp_path / "runs"))
    env = {name: value for name, value in os.environ.items() if not name.startswith("RL_")}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        cluster.start()
        url = cluster.coordinator_url
        by_token = cli("worker", "--coordinator", url, "--token", cluster.join_token, "--name", "by-token")
        by_token += ["--work-dir", str(tmp_path / "by-token"), "--run-dir", str(tmp_path / "none")]
        by_env = cli("worker", "--name", "by-env", "--run-dir", str(cluster.run_dir))  # its work folder: in there
        for name, command in (("by-token", by_token), ("by-env", by_env)):
            with (tmp_path / f"{name}.log").open("w") as log:
                processes[name] = subprocess.Popen(command, cwd=repo_root, env=env, stdout=log, stderr=log)
        for name in processes:
            wait_for_groups(url, name, tmp_path / f"{name}.log")
        wait_for(lambda: learner_version(url) >= 2, "the learner trains on their groups", timeout_s=120, interval_s=0.5)

        shown = subprocess.run(
            cli("status", "--run-dir", str(cluster.run_dir)), cwd=repo_root, env=env, capture_output=True, text=True
        )
        assert shown.returncode == 0 and "2 active" in shown.stdout, shown.stdout + shown.stderr
        assert "by-token" in shown.stdout and "by-env" in shown.stdout
        assert (cluster.run_dir / "joined" / "by-env" / "run.toml").read_text() == config.read_text()

        drained = subprocess.run(
            cli("drain", "by-token", "--run-dir", str(cluster.run_dir)), cwd=repo_root, env=env, capture_output=True
        )
        assert drained.returncode == 0, drained.stderr
        assert processes["by-token"].wait(timeout=60) == 0
        processes["by-env"].send_signal(signal.SIGINT)  # Ctrl-C
        assert processes["by-env"].wait(timeout=60) == 0
        assert all(w.state == WorkerState.DEAD or w.name not in processes for w in status_of(url).workers)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        cluster.stop()
