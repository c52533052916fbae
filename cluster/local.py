"""python -m cluster.local: the whole cluster on this machine, as real processes.

Starts a private Redis (redis-server on PATH, else the bundled Valkey), finds the policy folder
(--model-dir, else the run file's `[model] path`, else runs/<run-id>/model, where `[model] init =
"tiny-random"` builds the demo's tiny policy and a catalog model's name links its cached folder,
fetched and converted first where absent: docs/models.md) and checks it, then starts the coordinator, reward
service, learner and N rollout workers; shows live progress; stops everything by PID when the
learner is done or on Ctrl-C; writes runs/<run-id>/report.json with plots, and points runs/latest
at it.

Every child is supervised (cluster/supervisor.py, docs/operations.md): a crashed service is started
again with the same command, environment and ports after an exponential backoff; Redis on the same
port with its AOF. A dead worker never ends the run: it ends when the learner exits 0 with its run
complete, or on Ctrl-C / SIGTERM. A service that crashes more than --max-restarts times within
--restart-window-s is left down, and the runner says so.

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
import redis

from cluster.accounting import count_groups
from cluster.model_cache import link_catalog_model
from cluster.placement import Placement
from cluster.ports import free_port
from cluster.processes import EntryPoint, ServiceProcess, start_service
from cluster.redis_acl import OPERATOR, RedisUsers
from cluster.redis_server import RedisServer
from cluster.run_report import RunReport
from cluster.supervisor import RestartMode, RestartPolicy, ServiceState, SupervisionRecord, Supervisor
from cluster.tls import TlsFiles, make_run_certificates
from cluster.wan.profiles import LINKS_FILE, Fleet, load_fleet
from cluster.wan.testbed import CORE, HOST_ADDRESS, Testbed, worker_node
from shared.api import StatusResponse, WorkerState
from shared.config import RunConfig, load_run_config, resolve_model_dir
from shared.model_catalog import TINY_RANDOM
from shared.run_file import dump_run_file, read_run_file
from shared.run_records import LearnerSummary
from shared.signing import PUBLIC_KEY_ENV, SIGNING_KEY_ENV, KeyPair, generate_key_pair
from shared.tls import INSECURE_HTTP_ENV, CoordinatorTrust, Verify, is_loopback_host
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
    # supervision (cluster/supervisor.py): backoff base and cap, and the restart budget per service
    restart_base_delay_s: float = 0.5
    restart_max_delay_s: float = 30.0
    max_restarts: int = 5
    restart_window_s: float = 300.0
    # worker service name -> what it runs in place of services.rollout: tests and benchmarks pass their lying
    # workers' entry point here (cluster/processes.py EntryPoint); the runner starts no liar of its own
    worker_entry_points: dict[str, EntryPoint] = field(default_factory=dict)
    lora: bool = False  # --lora: the run file must enable [lora] (the demo's is configs/demo_lora.toml)
    # worker service name -> extra environment (e.g. RL_WORKER_BANDWIDTH_MBPS, to put it first in the relay plan)
    worker_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # processes of the learner: > 1 runs it sharded under torchrun (docs/distributed_learner.md)
    learner_procs: int = 1
    # --wan FLEET: every worker in a network namespace of its own behind its link profile, the trusted
    # services in another (cluster/wan/testbed.py, docs/wan.md); None: everything on loopback
    wan: Fleet | None = None
    # --tls: the coordinator serves https with a certificate of this run's own CA (cluster/tls.py, in
    # <run_dir>/tls); workers, tools and this runner verify it with the CA (RL_COORDINATOR_CA_FILE).
    # tls_hosts: names or addresses it covers besides 127.0.0.1, localhost and the services' address
    tls: bool = False
    tls_hosts: tuple[str, ...] = ()
    # --placement: the learner's cores and the workers' (taskset, thread counts to match: cluster/placement.py,
    # docs/placement.md); None: every process floats over every core
    placement: Placement | None = None

    def restart_policy(self, mode: RestartMode) -> RestartPolicy:
        return RestartPolicy(
            mode=mode,
            base_delay_s=self.restart_base_delay_s,
            max_delay_s=self.restart_max_delay_s,
            max_restarts=self.max_restarts,
            window_s=self.restart_window_s,
        )


@dataclass
class LocalCluster:
    options: ClusterOptions
    run: RunConfig = field(init=False)
    run_dir: Path = field(init=False)
    model_dir: Path = field(init=False)  # every service's RL_MODEL_DIR
    redis: RedisServer | None = None
    redis_users: RedisUsers = field(init=False)  # Redis ACL users of the trusted services (cluster/redis_acl.py)
    supervisor: Supervisor = field(default_factory=Supervisor)
    coordinator_url: str = ""
    admin_token: str = field(default_factory=lambda: secrets.token_hex(24))
    weights_keys: KeyPair = field(default_factory=generate_key_pair)  # signing half: the learner's env only
    # workers register with it; hex never begins with "-", which a --token flag would take for a flag
    join_token: str = field(default_factory=lambda: secrets.token_hex(24))
    metrics_urls: dict[str, str] = field(default_factory=dict)  # service name -> its Prometheus /metrics
    testbed: Testbed | None = None  # the emulated WAN the services run across (options.wan)
    learner_port: int = 0  # the learner's chunk server (workers fetch weights from it)
    tls: TlsFiles | None = None  # with options.tls: the run CA and the coordinator's certificate (tls_files())
    warned_plain_http: bool = False

    def __post_init__(self) -> None:
        base = load_run_config(self.options.config_path)
        if self.options.lora and not base.lora.enabled:
            raise ValueError(
                f"--lora: {self.options.config_path} does not enable [lora]; add `[lora] enabled = true` to it "
                "(configs/demo_lora.toml is the demo's)"
            )
        run_id = self.options.run_id or f"{base.run_id}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.run = base.model_copy(update={"run_id": run_id})
        self.run_dir = (self.options.runs_dir / run_id).resolve()
        self.model_dir = resolve_model_dir(self.options.model_dir, self.run.model, self.run_dir).resolve()
        self.redis_users = RedisUsers(run_id)

    # the table of contents
    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        point_latest_at(self.run_dir)
        self.start_testbed()
        self.start_redis()
        self.build_initial_policy()
        self.start_coordinator()
        self.write_cluster_env()
        self.start_reward()
        self.start_learner()
        for index in range(self.options.num_workers):
            self.start_worker(index)

    @property
    def services(self) -> dict[str, ServiceProcess]:
        """The services' current processes by name (a restart replaces one); Redis is `self.redis`."""
        return {
            name: child
            for name, supervised in self.supervisor.services.items()
            if isinstance(child := supervised.child, ServiceProcess)
        }

    def wait_until_done(self, on_progress: Callable[[StatusResponse], None] | None = None) -> StatusResponse | None:
        """Supervise the services until the learner exits 0 with its run complete; returns the last status
        seen (None: none yet). Raises RuntimeError if the supervisor gives up on the learner."""
        deadline = time.monotonic() + self.run.schedule.max_wall_s + self.options.startup_timeout_s
        status: StatusResponse | None = None
        with httpx.Client(base_url=self.coordinator_url, timeout=5.0, verify=self.coordinator_verify()) as client:
            while time.monotonic() < deadline:
                self.supervisor.poll()
                self.supervisor.write_summary(self.run_dir / "supervision.json")
                status = self.fetch_status(client) or status
                self.save_broadcast_times(client)  # T_bcast per version, for the report's broadcast section
                if on_progress is not None and status is not None:
                    on_progress(status)
                if self.learner_done():
                    return status
                time.sleep(self.options.progress_interval_s)
        raise TimeoutError(f"the learner did not finish within {self.run.schedule.max_wall_s}s + startup")

    def learner_done(self) -> bool:
        """True once the learner exited 0 with its run complete. Exit 0 short of that (a SIGTERM from
        someone else): started again at once, it resumes from its checkpoint."""
        state = self.supervisor.state("learner")
        if state == ServiceState.GAVE_UP:
            learner = self.services["learner"]
            raise RuntimeError(f"the learner kept crashing; gave up on it:\n{learner.log_tail()}")
        if state != ServiceState.EXITED:
            return False
        summary_path = self.run_dir / "learner_summary.json"
        if summary_path.exists() and LearnerSummary.model_validate_json(summary_path.read_text()).finished:
            return True
        log.warning("the learner exited 0 before its run was complete: starting it again")
        self.supervisor.restart_now("learner")
        return False

    def check_services_alive(self) -> None:
        """For runs that expect no crash (tests): raise if a service other than the learner has exited."""
        for name, process in self.services.items():
            if name != "learner" and not process.alive():
                raise RuntimeError(f"{name} died with exit code {process.popen.returncode}:\n{process.log_tail()}")

    def stop(self) -> None:
        """Stop every child by PID: workers, reward, coordinator, learner; count the groups; then Redis,
        whatever went wrong before it (Redis is never left running)."""
        try:
            order = [name for name in self.supervisor.services if name.startswith("worker")]
            self.supervisor.stop([*order, "reward", "coordinator", "learner"])
            if self.redis is not None and self.redis.process is not None and self.redis.exit_code() is None:
                self.write_group_accounting()  # every consumer is stopped: the counts hold still
        finally:
            self.supervisor.stop(["redis"])
            self.supervisor.write_summary(self.run_dir / "supervision.json")
            if self.testbed is not None:
                self.testbed.stop()

    def supervision(self) -> SupervisionRecord:
        return self.supervisor.summary()

    def write_group_accounting(self) -> None:
        """<run_dir>/accounting.json: every task issued, trained, dropped by reason, dead-lettered or
        pending (cluster/accounting.py; it decodes no stream entry, so garbage in a stream cannot stop it).
        Best effort: a Redis that is down, or answers what no counter should hold, leaves the report
        without it."""
        assert self.redis is not None
        try:
            accounting = count_groups(self.redis_url_for(OPERATOR), self.run.run_id)
        except (redis.RedisError, ValueError) as exc:  # outages included (redis.ConnectionError is one)
            log.warning("group accounting unavailable: %s: %s", type(exc).__name__, exc)
            return
        (self.run_dir / "accounting.json").write_text(accounting.model_dump_json(indent=2) + "\n")

    # steps
    def start_testbed(self) -> None:
        """With --wan: the namespaces, links and delay lines (the runner stays in the root namespace)."""
        if self.options.wan is None:
            return
        self.testbed = Testbed(self.options.wan, self.run_dir / "wan")
        self.testbed.start(self.options.num_workers)

    @property
    def services_host(self) -> str:
        """The address the trusted services bind and are reached at: the core node's on the testbed."""
        return self.testbed.address(CORE) if self.testbed is not None else "127.0.0.1"

    def node_of(self, service: str) -> str:
        """The testbed node a service runs on: worker-<i> on w<i>, the rest on the core."""
        return worker_node(int(service.removeprefix("worker-"))) if service.startswith("worker-") else CORE

    def command_prefix(self, service: str) -> list[str]:
        """What runs the service's command: its network namespace (--wan), then its cores (--placement)."""
        prefix = self.testbed.command(self.node_of(service), []) if self.testbed is not None else []
        placement = self.options.placement
        return prefix + (placement.command_prefix(service) if placement is not None else [])

    def start_redis(self) -> None:
        """Redis with ACLs on: the default user off, one user per trusted service (cluster/redis_acl.py).
        Supervised: a restart reuses the same port, AOF and ACL file."""
        acl_file = self.run_dir / "redis" / "users.acl"
        self.redis_users.write_acl_file(acl_file)
        probe_user = (OPERATOR, self.redis_users.passwords[OPERATOR])
        redis_server = RedisServer(
            self.run_dir / "redis",
            acl_file=acl_file,
            probe_user=probe_user,
            host=self.services_host,
            command_prefix=self.command_prefix("redis"),
        )
        self.redis = redis_server
        if self.testbed is not None:  # only the trusted services (and this runner) reach Redis
            self.testbed.block_port(CORE, redis_server.port, "redis", except_address=HOST_ADDRESS)
        self.supervisor.add("redis", redis_server.start, self.options.restart_policy(RestartMode.UNLESS_STOPPED))
        log.info("redis on %s (ACLs on: the default user is disabled)", redis_server.url)

    def redis_url_for(self, user: str) -> str:
        """The Redis URL with `user`'s credentials (a trusted service, or "operator" for tools)."""
        assert self.redis is not None
        return self.redis_users.url_for(user, self.redis.url)

    def build_initial_policy(self) -> None:
        """Where the run file asks (`[model] init`) and the folder is not there yet: build the tiny-random
        policy, or link the catalog model's cached folder (`relay-rl model get` fetches and converts it
        first where absent; every service reads it through the link). Then check the folder, so a wrong
        path fails here in one line rather than in every service's log."""
        model_dir = self.model_dir
        init = self.run.model.init
        if init is not None and not (model_dir / "config.json").exists():
            if init == TINY_RANDOM:
                self.build_tiny_random_policy()
            else:
                log.info("policy folder %s: linking catalog model %s (relay-rl model get)", model_dir, init)
                link_catalog_model(init, model_dir)
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
        self.coordinator_url = f"{self.coordinator_scheme}://{self.services_host}:{port}"
        env = {
            "RL_COORDINATOR_HOST": self.services_host,
            "RL_COORDINATOR_PORT": str(port),
            "RL_REDIS_URL": self.redis_url_for("coordinator"),
            "RL_ADMIN_TOKEN": self.admin_token,
            **self.coordinator_tls_env(),
        }
        self.launch("coordinator", "services.coordinator", env)
        self.wait_healthy(self.coordinator_url + "/healthz", self.services["coordinator"])

    def start_reward(self) -> None:
        self.launch("reward", "services.reward", {"RL_REDIS_URL": self.redis_url_for("reward")})

    def start_learner(self) -> None:
        port = free_port()
        self.learner_port = port
        env = {
            "RL_LEARNER_PORT": str(port),
            "RL_LEARNER_HOST": self.services_host,
            "RL_REDIS_URL": self.redis_url_for("learner"),
            SIGNING_KEY_ENV: self.weights_keys.signing_key_hex,
        }
        self.launch("learner", "services.learner", env, launcher=learner_launcher(self.options.learner_procs))

    def start_worker(self, index: int) -> None:
        name = f"worker-{index}"
        env = {"RL_WORKER_NAME": name, "RL_WORKER_PORT": "0", **self.options.worker_env.get(name, {})}
        if self.testbed is not None:  # its chunk server on its own node's address, where its children reach it;
            node = self.node_of(name)  # its uplink as the bandwidth it declares (the relay plan ranks parents by it)
            env = {
                "RL_WORKER_HOST": self.testbed.address(node),
                "RL_WORKER_BANDWIDTH_MBPS": str(self.testbed.profile(node).up_mbps),
                **env,
            }
        entry_point = self.options.worker_entry_points.get(name, EntryPoint("services.rollout"))
        self.launch(name, entry_point.module, {**env, **entry_point.env})

    # helpers
    def config_file(self) -> Path:
        """The run file every service reads: the options' file, its `extends` resolved (the copy sits in the run's
        folder, away from its base)."""
        path = self.run_dir / "run.toml"
        if not path.exists():
            path.write_text(dump_run_file(read_run_file(self.options.config_path)))
        return path

    def common_env(self) -> dict[str, str]:
        """What every process gets, workers included: no Redis URL (each trusted service is given its own
        with its own user; workers reach the run only through the coordinator) and no admin token (the
        coordinator's alone, and cluster.env's for the operator's tools)."""
        return {
            "RL_RUN_CONFIG": str(self.config_file()),
            "RL_RUN_ID": self.run.run_id,
            "RL_RUN_DIR": str(self.run_dir),
            "RL_MODEL_DIR": str(self.model_dir),
            "RL_COORDINATOR_URL": self.coordinator_url,
            PUBLIC_KEY_ENV: self.weights_keys.public_key_hex,
            "RL_JOIN_TOKEN": self.join_token,
            **self.coordinator_trust_env(),
        }

    def write_cluster_env(self) -> Path:
        """runs/<run-id>/cluster.env: what `python -m cluster.join` / `cluster.drain` need (0600: secrets)."""
        path = self.run_dir / "cluster.env"
        values = {**self.common_env(), "RL_ADMIN_TOKEN": self.admin_token}  # for cluster.drain, relay-rl operators
        lines = [f"{name}={value}" for name, value in values.items()]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("# written by python -m cluster.local; secrets: keep private\n" + "\n".join(lines) + "\n")
        os.chmod(path, 0o600)
        return path

    def launch(self, name: str, module: str, env: dict[str, str], launcher: list[str] | None = None) -> None:
        """Start `python [launcher] -m module` under supervision; a restart reuses this environment (ports included)."""
        if name != "coordinator":  # the coordinator serves /metrics on its own port
            port = free_port()
            env = {"RL_METRICS_PORT": str(port), **env}
            self.metrics_urls[name] = f"http://127.0.0.1:{port}/metrics"
        placement = self.options.placement
        full_env = {**self.common_env(), **(placement.env(name) if placement is not None else {}), **env}

        prefix = self.command_prefix(name)

        def start() -> ServiceProcess:
            return start_service(name, module, full_env, self.run_dir / "logs", REPO_ROOT, launcher or [], prefix)

        # exit 0 is deliberate for these two: the learner's run is complete, a worker was drained
        deliberate_exit = name == "learner" or name.startswith("worker")
        mode = RestartMode.ON_FAILURE if deliberate_exit else RestartMode.UNLESS_STOPPED
        process = self.supervisor.add(name, start, self.options.restart_policy(mode))
        assert isinstance(process, ServiceProcess)
        log.info("started %s (pid %d), log %s", name, process.pid, process.log_path)

    def wait_healthy(self, url: str, process: ServiceProcess) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        while time.monotonic() < deadline:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited with {process.popen.returncode}:\n{process.log_tail()}")
            try:
                if httpx.get(url, timeout=1.0, verify=self.coordinator_verify()).status_code == 200:
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

    # TLS (options.tls; docs/operations.md#tls): credentials cross only TLS off loopback
    @property
    def coordinator_scheme(self) -> str:
        return "https" if self.options.tls else "http"

    def tls_files(self) -> TlsFiles:
        """The run CA and the coordinator's certificate in <run_dir>/tls, made at the first call (for 127.0.0.1,
        localhost, the services' address and options.tls_hosts) and the same set after."""
        if self.tls is None:
            hosts = ["127.0.0.1", "localhost", self.services_host, *self.options.tls_hosts]
            self.tls = make_run_certificates(self.run_dir / "tls", hosts, overwrite=True)
            log.info(
                "coordinator certificate for %s, sha256 %s (run CA %s)", hosts, self.tls.cert_sha256, self.tls.ca_file
            )
        return self.tls

    def coordinator_tls_env(self) -> dict[str, str]:
        """The coordinator's RL_TLS_CERT_FILE and RL_TLS_KEY_FILE with --tls; nothing (plain http) without."""
        return self.tls_files().server_env() if self.options.tls else {}

    def coordinator_trust_env(self) -> dict[str, str]:
        """What every client of the coordinator gets: the run CA with --tls. Without it, plain http to a services
        address that is not loopback (the WAN testbed's namespaces) is allowed with RL_INSECURE_HTTP=1: tokens
        cross the emulated links in clear text, so it says so."""
        if self.options.tls:
            return self.tls_files().client_env()
        if not is_loopback_host(self.services_host):
            if not self.warned_plain_http:
                log.warning(
                    "plain http to %s: tokens cross the emulated links in clear text (--tls)", self.services_host
                )
                self.warned_plain_http = True
            return {INSECURE_HTTP_ENV: "1"}
        return {}

    def coordinator_verify(self) -> Verify:
        """httpx's `verify=` for this runner's own calls (health, status): the run CA with --tls."""
        return CoordinatorTrust(self.tls_files().ca_file).verify() if self.options.tls else True


def point_latest_at(run_dir: Path) -> None:
    latest = run_dir.parent / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(run_dir.name)


def print_progress(status: StatusResponse, supervision: SupervisionRecord | None = None) -> None:
    learner = status.learner
    if learner is None:
        print("waiting for the learner to publish version 0 ...", flush=True)
        return
    versions = ",".join(str(w.policy_version) for w in status.workers if w.state != WorkerState.DEAD) or "-"
    depths = status.stream_depths  # a stream nobody has written to yet is absent
    print(
        f"step {learner.learner_version:>4}/{learner.num_steps_target}"
        f" | reward {learner.last_reward_mean:.2f}"
        f" | flat {100 * learner.last_flat_groups.zero_variance_fraction:3.0f}%"
        + (" NOT LEARNING" if learner.zero_variance_warning is not None else "")
        + f" | busy {100 * learner.busy_fraction:3.0f}%"
        f" | dropped {sum(learner.num_dropped.values())}"
        f" | worker versions {versions}"
        f" | tasks {depths.get('tasks', 0)} rollouts {depths.get('rollouts', 0)} scored {depths.get('scored', 0)}"
        f" | dead letters {status.num_dead_letters}"
        f" | cost ${status.cost_usd:.4f}" + (f" | {restarts_text(supervision)}" if supervision is not None else ""),
        flush=True,
    )


@dataclass
class LearnerWarnings:
    """Prints the learner's zero-variance warning (LearnerState) once each time it is raised or changes."""

    last_seen: str | None = None

    def __call__(self, status: StatusResponse) -> None:
        warning = status.learner.zero_variance_warning if status.learner is not None else None
        if warning is not None and warning != self.last_seen:
            print(f"WARNING (learner): {warning}", flush=True)
        self.last_seen = warning


def restarts_text(supervision: SupervisionRecord) -> str:
    """ "restarts 3 (worker-0 2, reward 1)", plus "gave up on ..." when the supervisor has."""
    counts = ", ".join(f"{name} {s.num_restarts}" for name, s in supervision.services.items() if s.num_restarts)
    text = f"restarts {supervision.num_restarts}" + (f" ({counts})" if counts else "")
    gave_up = [name for name, service in supervision.services.items() if service.gave_up]
    return text + (f" | gave up on {', '.join(gave_up)}" if gave_up else "")


def learner_launcher(num_procs: int) -> list[str]:
    """What goes between `python` and `-m services.learner`: nothing for one process, else torchrun on this
    machine (--standalone: its own rendezvous on a free port). Rank 0 alone binds the chunk server and
    metrics ports it is given."""
    if num_procs < 1:
        raise ValueError(f"--learner-procs must be at least 1, got {num_procs}")
    if num_procs == 1:
        return []
    return ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={num_procs}"]


def raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per status poll otherwise
    from cluster.report import write_report

    try:
        cluster = LocalCluster(options_from_args(args))
    except ValueError as exc:  # a run file that does not fit the flags: one line, no traceback
        parser.error(str(exc))
    # Explicit handlers: a runner started in the background inherits SIGINT ignored, and `kill <pid>`
    # (SIGTERM) must stop the cluster like Ctrl-C does.
    signal.signal(signal.SIGINT, raise_keyboard_interrupt)
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    started_s = time.monotonic()
    final_status, failure = run_to_the_end(cluster)
    report = write_report(cluster.run_dir, cluster.run, final_status, wall_s=time.monotonic() - started_s)
    if failure is not None:
        sys.exit(f"cluster failed: {failure}")
    print(f"report: {cluster.run_dir / 'report.json'}")
    print_summary(report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.local", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_run_arguments(parser)
    add_supervision_arguments(parser)
    add_layout_arguments(parser)
    return parser


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """What runs: the run file, the model and the number of workers."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="run TOML file (default: configs/demo.toml; with --lora: demo_lora.toml)",
    )
    parser.add_argument(
        "--lora",
        action="store_true",
        help="train and publish LoRA adapters on the frozen base (docs/lora.md): the demo's LoRA run file by default",
    )
    parser.add_argument("--workers", type=int, default=3, help="number of rollout workers")
    parser.add_argument("--run-id", default=None, help="default: <config run_id>-<timestamp>")
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="local HF causal-LM folder to train (overrides [model] path); default: the run file's [model]",
    )


def add_supervision_arguments(parser: argparse.ArgumentParser) -> None:
    """How crashed services are restarted (cluster/supervisor.py)."""
    defaults = ClusterOptions(config_path=Path())
    parser.add_argument(
        "--restart-base-delay-s",
        type=float,
        default=defaults.restart_base_delay_s,
        help="backoff before restarting a crashed service; doubles per consecutive crash",
    )
    parser.add_argument(
        "--restart-max-delay-s", type=float, default=defaults.restart_max_delay_s, help="cap of that backoff"
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=defaults.max_restarts,
        help="restarts of one service within --restart-window-s before the runner gives up on it",
    )
    parser.add_argument("--restart-window-s", type=float, default=defaults.restart_window_s)


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """How the processes are laid out and reached: the learner's processes, the emulated WAN, core
    placement, TLS."""
    parser.add_argument(
        "--learner-procs",
        type=int,
        default=1,
        help="learner processes: > 1 shards it with FSDP2 under torchrun (gloo on CPU, nccl on GPUs)",
    )
    parser.add_argument(
        "--wan",
        default=None,
        metavar="FLEET",
        help="run across an emulated WAN (root; docs/wan.md): a fleet or link profile of --wan-links"
        " (broadband, far, mobile, datacenter, mixed); implies --tls",
    )
    parser.add_argument("--wan-links", type=Path, default=LINKS_FILE, help="the link profiles file")
    parser.add_argument(
        "--placement",
        default=None,
        metavar="'learner=CORES workers=CORES [services=CORES]'",
        help="pin the learner and the workers to their own cores, thread counts to match (docs/placement.md); "
        "e.g. 'learner=0 workers=1'",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="the coordinator serves https with a certificate of a CA made for this run (<run dir>/tls); workers "
        "verify it with the CA (docs/operations.md#tls)",
    )
    parser.add_argument(
        "--tls-host",
        action="append",
        default=[],
        metavar="NAME_OR_IP",
        help="with --tls, another name or address the certificate covers (repeatable; 127.0.0.1, localhost and the "
        "services' address always are)",
    )


def options_from_args(args: argparse.Namespace) -> ClusterOptions:
    """The runner's options from its command line (ValueError: a placement or fleet that does not parse)."""
    return ClusterOptions(
        config_path=args.config or REPO_ROOT / "configs" / ("demo_lora.toml" if args.lora else "demo.toml"),
        lora=args.lora,
        num_workers=args.workers,
        run_id=args.run_id,
        model_dir=args.model_dir,
        restart_base_delay_s=args.restart_base_delay_s,
        restart_max_delay_s=args.restart_max_delay_s,
        max_restarts=args.max_restarts,
        restart_window_s=args.restart_window_s,
        learner_procs=args.learner_procs,
        placement=Placement.parse(args.placement, args.workers) if args.placement else None,
        wan=load_fleet(args.wan, args.wan_links) if args.wan else None,
        tls=args.tls or args.wan is not None,  # across a network, credentials cross only TLS
        tls_hosts=tuple(args.tls_host),
    )


def run_to_the_end(cluster: LocalCluster) -> tuple[StatusResponse | None, Exception | None]:
    """Start the cluster, show its progress until the learner is done or Ctrl-C / SIGTERM, then stop every
    child whatever happened. Returns the last status seen and the failure that ended the run (None: none)."""
    final_status: StatusResponse | None = None
    failure: Exception | None = None
    try:
        cluster.start()
        print_where_to_look(cluster)
        learner_warnings = LearnerWarnings()

        def on_progress(status: StatusResponse) -> None:
            print_progress(status, cluster.supervision())
            learner_warnings(status)

        final_status = cluster.wait_until_done(on_progress)
    except KeyboardInterrupt:
        print("interrupted: stopping the cluster", flush=True)
    # the learner kept crashing, a service never came up, or the model folder is unusable: stop, report, fail
    except (RuntimeError, TimeoutError, ModelFolderError) as exc:
        failure = exc
    finally:
        # a second Ctrl-C must not cut the stop short and leave children behind
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cluster.stop()
    return final_status, failure


def print_where_to_look(cluster: LocalCluster) -> None:
    """The started cluster's addresses: its dashboard and API, logs, how to add or drain a worker, metrics."""
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


def print_summary(report: RunReport) -> None:
    """The report's headline, as the run's last lines."""
    headline = {
        "num_steps": report.num_steps,
        "reward_mean_first10": report.reward_mean_first10,
        "reward_mean_last10": report.reward_mean_last10,
        "eval_accuracy_before": report.eval_accuracy_before,
        "eval_accuracy_after": report.eval_accuracy_after,
        "learner_busy_fraction": report.learner_busy_fraction,
        "max_trained_staleness": report.max_trained_staleness,
        "num_dropped_stale": report.num_dropped_stale,
        "num_restarts": report.num_restarts,
        "wall_s": report.wall_s,
    }
    for name, value in headline.items():
        print(f"  {name}: {value}")
    zero_variance = report.zero_variance
    if zero_variance is not None:
        print(
            f"  zero_variance_fraction: {zero_variance.zero_variance_fraction}"
            f" (flat groups at 0: {zero_variance.num_flat_at_zero}, at 1: {zero_variance.num_flat_at_max};"
            f" skipped by dynamic sampling: {zero_variance.num_skipped})"
        )
        if zero_variance.warning is not None:
            print(f"  WARNING: {zero_variance.warning}")
    if report.accounting is not None:
        accounting = report.accounting
        print(f"  tasks issued {accounting.num_tasks_issued}, unaccounted {accounting.num_unaccounted}")
    if report.evals and report.evals[-1].format_rate is not None:
        last = report.evals[-1]
        chance = (
            f"; chance {last.chance_accuracy:.3f} ({last.chance_strategy})" if last.chance_accuracy is not None else ""
        )
        right = f", {last.formatted_accuracy:.3f} of those right" if last.formatted_accuracy is not None else ""
        print(f"  eval at version {last.step}: {last.format_rate:.0%} in the answer form{right}{chance}")
    if report.time_use is not None:
        print(f"  {report.time_use.verdict_line}")


if __name__ == "__main__":
    main()
