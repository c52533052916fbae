"""python -m cluster.local: the whole cluster on this machine, as real processes.

Starts a private Redis (redis-server on PATH, else the bundled Valkey), finds the policy folder
(--model-dir, else the run file's `[model] path`, else runs/<run-id>/model, where `[model] init =
"tiny-random"` builds the demo's tiny policy) and checks it, then starts the coordinator, reward
service, learner and N rollout workers; shows live progress; stops everything by PID when the
learner is done or on Ctrl-C; writes runs/<run-id>/report.json with plots, and points runs/latest
at it.

Each run makes its own Ed25519 key pair for weight manifests: the private half (RL_SIGNING_KEY) goes
to the learner's environment only, the public half (RL_WEIGHTS_PUBLIC_KEY) to every service.

While it runs, runs/<run-id>/cluster.env (mode 0600: it holds the admin token; never the signing key)
has the URLs and secrets another terminal needs: `python -m cluster.join` (make worker) adds a worker
to the newest cluster, `python -m cluster.drain <name>` (make drain) drains one. Every service
serves Prometheus metrics (RL_METRICS_PORT: a free port each), listed when the cluster is up.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cluster.processes import ServiceProcess, start_service
from cluster.redis_server import RedisServer, free_port
from shared.api import StatusResponse, WorkerState
from shared.config import RunConfig, load_run_config, resolve_model_dir
from shared.signing import PUBLIC_KEY_ENV, SIGNING_KEY_ENV, KeyPair, generate_key_pair
from shared.tokenization import ModelFolderError, check_model_folder

log = logging.getLogger("cluster")

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ClusterOptions:
    config_path: Path
    num_workers: int = 3
    runs_dir: Path = REPO_ROOT / "runs"
    run_id: str | None = None
    model_dir: Path | None = None  # the policy folder; None: the run file's [model] path, else <run_dir>/model
    progress_interval_s: float = 2.0
    startup_timeout_s: float = 120.0


@dataclass
class LocalCluster:
    options: ClusterOptions
    run: RunConfig = field(init=False)
    run_dir: Path = field(init=False)
    model_dir: Path = field(init=False)  # every service's RL_MODEL_DIR
    redis: RedisServer | None = None
    services: dict[str, ServiceProcess] = field(default_factory=dict)
    coordinator_url: str = ""
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    weights_keys: KeyPair = field(default_factory=generate_key_pair)  # signing half: the learner's env only
    join_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))  # workers register with it
    metrics_urls: dict[str, str] = field(default_factory=dict)  # service name -> its Prometheus /metrics

    def __post_init__(self) -> None:
        base = load_run_config(self.options.config_path)
        run_id = self.options.run_id or f"{base.run_id}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.run = base.model_copy(update={"run_id": run_id})
        self.run_dir = (self.options.runs_dir / run_id).resolve()
        self.model_dir = resolve_model_dir(self.options.model_dir, self.run.model, self.run_dir).resolve()

    # the table of contents
    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        point_latest_at(self.run_dir)
        self.start_redis()
        self.build_initial_policy()
        self.start_coordinator()
        self.write_cluster_env()
        self.start_reward()
        self.start_learner()
        for index in range(self.options.num_workers):
            self.start_worker(index)

    def wait_until_done(
        self,
        on_progress: Callable[[StatusResponse], None] | None = None,
        ignore_dead: frozenset[str] | set[str] = frozenset(),
    ) -> StatusResponse | None:
        """Block until the learner finishes (or dies); returns the last status seen (None: none yet). A
        service other than the learner that dies is an error, unless named in `ignore_dead` (fault runs)."""
        deadline = time.monotonic() + self.run.schedule.max_wall_s + self.options.startup_timeout_s
        status: StatusResponse | None = None
        with httpx.Client(base_url=self.coordinator_url, timeout=5.0) as client:
            while time.monotonic() < deadline:
                status = self.fetch_status(client) or status
                self.save_broadcast_times(client)  # T_bcast per version, for the report's broadcast section
                if on_progress is not None and status is not None:
                    on_progress(status)
                learner = self.services["learner"]
                if not learner.alive():
                    if learner.popen.returncode != 0:
                        raise RuntimeError(f"learner exited with {learner.popen.returncode}:\n{learner.log_tail()}")
                    return status
                self.check_services_alive(ignore_dead)
                time.sleep(self.options.progress_interval_s)
        raise TimeoutError(f"the learner did not finish within {self.run.schedule.max_wall_s}s + startup")

    def stop(self) -> None:
        """Stop every child by PID: workers, reward, coordinator, learner, then Redis."""
        order = [name for name in self.services if name.startswith("worker")] + ["reward", "coordinator", "learner"]
        for name in order:
            process = self.services.get(name)
            if process is not None:
                code = process.stop()
                log.info("stopped %s (pid %d, exit %s)", name, process.pid, code)
        if self.redis is not None:
            self.redis.stop()
            log.info("stopped redis (pid %d)", self.redis.process.pid if self.redis.process else -1)

    # steps
    def start_redis(self) -> None:
        self.redis = RedisServer(self.run_dir / "redis").start()
        log.info("redis on %s", self.redis.url)

    def build_initial_policy(self) -> None:
        """Build the tiny-random policy if the run file asks and it is not there yet; then check the
        folder, so a wrong path fails here in one line rather than in every service's log."""
        model_dir = self.model_dir
        if self.run.model.init == "tiny-random" and not (model_dir / "config.json").exists():
            self.build_tiny_random_policy()
        check_model_folder(model_dir)
        log.info("policy folder %s", model_dir)

    def build_tiny_random_policy(self) -> None:
        model_dir = self.model_dir
        subprocess.run(
            [
                sys.executable,
                "-m",
                "services.learner.model_init",
                "--config",
                str(self.config_file()),
                "--out",
                str(model_dir),
            ],
            check=True,
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
        )

    def start_coordinator(self) -> None:
        port = free_port()
        self.coordinator_url = f"http://127.0.0.1:{port}"
        self.launch("coordinator", "services.coordinator", {"RL_COORDINATOR_PORT": str(port)})
        self.wait_healthy(self.coordinator_url + "/healthz", self.services["coordinator"])

    def start_reward(self) -> None:
        self.launch("reward", "services.reward", {})

    def start_learner(self) -> None:
        port = free_port()
        self.launch(
            "learner",
            "services.learner",
            {
                "RL_LEARNER_PORT": str(port),
                "RL_LEARNER_HOST": "127.0.0.1",
                SIGNING_KEY_ENV: self.weights_keys.signing_key_hex,
            },
        )

    def start_worker(self, index: int) -> None:
        self.launch(f"worker-{index}", "services.rollout", {"RL_WORKER_NAME": f"worker-{index}", "RL_WORKER_PORT": "0"})

    # helpers
    def config_file(self) -> Path:
        """The run file every service reads: the options' file with this run's id."""
        path = self.run_dir / "run.toml"
        if not path.exists():
            text = self.options.config_path.read_text()
            path.write_text(text)
        return path

    def common_env(self) -> dict[str, str]:
        assert self.redis is not None
        return {
            "RL_REDIS_URL": self.redis.url,
            "RL_RUN_CONFIG": str(self.config_file()),
            "RL_RUN_ID": self.run.run_id,
            "RL_RUN_DIR": str(self.run_dir),
            "RL_MODEL_DIR": str(self.model_dir),
            "RL_COORDINATOR_URL": self.coordinator_url,
            "RL_ADMIN_TOKEN": self.admin_token,
            PUBLIC_KEY_ENV: self.weights_keys.public_key_hex,
            "RL_JOIN_TOKEN": self.join_token,
        }

    def write_cluster_env(self) -> Path:
        """runs/<run-id>/cluster.env: what `python -m cluster.join` / `cluster.drain` need (0600: secrets)."""
        path = self.run_dir / "cluster.env"
        lines = [f"{name}={value}" for name, value in self.common_env().items()]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("# written by python -m cluster.local; secrets: keep private\n" + "\n".join(lines) + "\n")
        os.chmod(path, 0o600)
        return path

    def launch(self, name: str, module: str, env: dict[str, str]) -> None:
        if name != "coordinator":  # the coordinator serves /metrics on its own port
            port = free_port()
            env = {"RL_METRICS_PORT": str(port), **env}
            self.metrics_urls[name] = f"http://127.0.0.1:{port}/metrics"
        process = start_service(name, module, {**self.common_env(), **env}, self.run_dir / "logs", REPO_ROOT)
        self.services[name] = process
        log.info("started %s (pid %d), log %s", name, process.pid, process.log_path)

    def wait_healthy(self, url: str, process: ServiceProcess) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        while time.monotonic() < deadline:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited with {process.popen.returncode}:\n{process.log_tail()}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{process.name} not healthy at {url} after {self.options.startup_timeout_s}s")

    def save_broadcast_times(self, client: httpx.Client) -> None:
        """The coordinator's measured T_bcast per version into <run_dir>/broadcast_times.json (best effort)."""
        try:
            response = client.get("/v1/broadcast/times")
        except httpx.HTTPError:
            return
        if response.status_code == 200:
            (self.run_dir / "broadcast_times.json").write_text(response.text)

    def fetch_status(self, client: httpx.Client) -> StatusResponse | None:
        try:
            response = client.get("/v1/status")
        except httpx.HTTPError as exc:
            log.warning("status unavailable: %s", exc)
            return None
        return StatusResponse.model_validate_json(response.content) if response.status_code == 200 else None

    def check_services_alive(self, ignore_dead: frozenset[str] | set[str] = frozenset()) -> None:
        for name, process in self.services.items():
            if name != "learner" and name not in ignore_dead and not process.alive():
                raise RuntimeError(f"{name} died with exit code {process.popen.returncode}:\n{process.log_tail()}")


def point_latest_at(run_dir: Path) -> None:
    latest = run_dir.parent / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(run_dir.name)


def print_progress(status: StatusResponse) -> None:
    learner = status.learner
    if learner is None:
        print("waiting for the learner to publish version 0 ...", flush=True)
        return
    versions = ",".join(str(w.policy_version) for w in status.workers if w.state != WorkerState.DEAD) or "-"
    depths = status.stream_depths  # a stream nobody has written to yet is absent
    print(
        f"step {learner.learner_version:>4}/{learner.num_steps_target}"
        f" | reward {learner.last_reward_mean:.2f}"
        f" | busy {100 * learner.busy_fraction:3.0f}%"
        f" | dropped {sum(learner.num_dropped.values())}"
        f" | worker versions {versions}"
        f" | tasks {depths.get('tasks', 0)} rollouts {depths.get('rollouts', 0)} scored {depths.get('scored', 0)}"
        f" | dead letters {status.num_dead_letters}"
        f" | cost ${status.cost_usd:.4f}",
        flush=True,
    )


def raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.local", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "demo.toml", help="run TOML file")
    parser.add_argument("--workers", type=int, default=3, help="number of rollout workers")
    parser.add_argument("--run-id", default=None, help="default: <config run_id>-<timestamp>")
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="local HF causal-LM folder to train (overrides [model] path); default: the run file's [model]",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per status poll otherwise
    from cluster.report import write_report

    cluster = LocalCluster(
        ClusterOptions(config_path=args.config, num_workers=args.workers, run_id=args.run_id, model_dir=args.model_dir)
    )
    # Explicit handlers: a runner started in the background inherits SIGINT ignored, and `kill <pid>`
    # (SIGTERM) must stop the cluster like Ctrl-C does.
    signal.signal(signal.SIGINT, raise_keyboard_interrupt)
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    started_s = time.monotonic()
    final_status: StatusResponse | None = None
    failure: Exception | None = None
    try:
        cluster.start()
        print(
            f"run {cluster.run.run_id}: dashboard/API at {cluster.coordinator_url}/docs, logs in {cluster.run_dir}/logs",
            flush=True,
        )
        print(
            f"dashboard: {cluster.coordinator_url}/dashboard | add a worker from another terminal: make worker"
            f" (python -m cluster.join --name my-worker --price 0.5) | drain it: make drain WORKER=my-worker",
            flush=True,
        )
        print(
            "prometheus: "
            + " ".join(f"{name}={url}" for name, url in cluster.metrics_urls.items())
            + f" coordinator={cluster.coordinator_url}/metrics",
            flush=True,
        )
        final_status = cluster.wait_until_done(print_progress)
    except KeyboardInterrupt:
        print("interrupted: stopping the cluster", flush=True)
    # a service died or never came up, or the model folder is unusable: stop the rest, report, fail
    except (RuntimeError, TimeoutError, ModelFolderError) as exc:
        failure = exc
    finally:
        cluster.stop()
    report = write_report(cluster.run_dir, cluster.run, final_status, wall_s=time.monotonic() - started_s)
    if failure is not None:
        sys.exit(f"cluster failed: {failure}")
    print(f"report: {cluster.run_dir / 'report.json'}")
    for key in (
        "num_steps",
        "reward_mean_first10",
        "reward_mean_last10",
        "eval_accuracy_before",
        "eval_accuracy_after",
        "learner_busy_fraction",
        "max_trained_staleness",
        "num_dropped_stale",
        "wall_s",
    ):
        print(f"  {key}: {report[key]}")


if __name__ == "__main__":
    main()
