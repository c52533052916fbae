"""deploy/relay-rl cannot be installed here (no Kubernetes cluster): render it with helm for each values
set and validate every object offline against the Kubernetes schemas, then check what the schemas cannot
see: each service's environment satisfies its own settings class, probes and scrape annotations name
ports the container exposes, every Secret key referenced is rendered, and only the learner can sign."""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
from pydantic_settings import BaseSettings

from cluster.cli import build_parser
from cluster.redis_acl import OPERATOR, TRUSTED_SERVICES
from services.coordinator.settings import CoordinatorSettings
from services.learner.settings import LearnerSettings
from services.reward.settings import RewardSettings
from services.rollout.settings import RolloutSettings
from shared.config import RunConfig, load_run_config
from tests.helm_chart import (
    FIELD_REFS,
    REPO_ROOT,
    VALUES,
    Container,
    containers,
    expand,
    find,
    helm_template,
    render,
    resolved_env,
    secret_data,
    secret_values,
)

KUBERNETES_VERSION = "1.30.0"  # the oldest release the chart supports (Chart.yaml kubeVersion)
EXTERNAL_REDIS = "redis://redis.example.internal:6380/2"
VALUE_SETS = {
    "cpu-demo": ([VALUES / "cpu-demo.yaml"], "configs/demo.toml", []),
    "gpu": ([VALUES / "gpu.yaml"], "configs/qwen3.toml", []),
    "external-redis": ([VALUES / "cpu-demo.yaml"], "configs/demo.toml", [f"--set=redis.external.url={EXTERNAL_REDIS}"]),
}
SETTINGS: dict[str, type[BaseSettings]] = {
    "services.coordinator": CoordinatorSettings,
    "services.learner": LearnerSettings,
    "services.reward": RewardSettings,
}
# relay-rl worker sets its RolloutSettings itself, from its flags and the coordinator's bootstrap
WORKER_SETTINGS = RolloutSettings
# read by `python -m cluster.redis_acl` (the Redis pod's init container) and the Redis readiness probe
REDIS_PASSWORD_VARIABLES = {f"RL_REDIS_PASSWORD_{name.upper()}" for name in (*TRUSTED_SERVICES, OPERATOR)}


def env_variable(name: str, settings: type[BaseSettings]) -> str:
    alias = settings.model_fields[name].validation_alias
    return alias if isinstance(alias, str) else f"RL_{name.upper()}"


KNOWN_VARIABLES = {
    env_variable(name, s) for s in [*SETTINGS.values(), WORKER_SETTINGS] for name in s.model_fields
} | REDIS_PASSWORD_VARIABLES


def service_of(container: Container) -> str | None:
    """Which service a container runs: the module after `-m` (python or torchrun), or `worker` for relay-rl."""
    command = container.command
    if command[:2] == ["relay-rl", "worker"]:
        return "worker"
    modules = [
        command[i + 1] for i, arg in enumerate(command[:-1]) if arg == "-m" and command[i + 1].startswith("services.")
    ]
    return modules[-1] if modules and modules[-1] in SETTINGS else None


def worker_args(container: Container, objects: list[dict]) -> argparse.Namespace:
    """The worker's command line as `relay-rl` (cluster.cli) parses it, `$(VAR)` expanded as the kubelet does."""
    env = resolved_env(container, objects)
    command = [expand(arg, env) for arg in container.command]
    assert command[0] == "relay-rl"
    return build_parser().parse_args(command[1:])  # an unknown flag or a bad value exits here


def option(command: list[str], flag: str) -> str:
    """The value of `--flag value` or `--flag=value`."""
    for i, arg in enumerate(command):
        if arg == flag:
            return command[i + 1]
        if arg.startswith(flag + "="):
            return arg.removeprefix(flag + "=")
    raise AssertionError(f"no {flag} in {command}")


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def value_set(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def secrets_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return secret_values(tmp_path_factory.mktemp("k8s"))


@pytest.fixture(scope="module")
def objects(value_set: str, secrets_file: Path) -> list[dict]:
    files, run_config, extra = VALUE_SETS[value_set]
    return render([*files, secrets_file], REPO_ROOT / run_config, extra)


def test_every_rendered_object_validates_against_the_kubernetes_schemas(objects: list[dict]) -> None:
    for obj in objects:
        # strict: an unknown field (a typo such as `readinesProbe`) fails too
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    kinds = {obj["kind"] for obj in objects}
    assert {"Secret", "ConfigMap", "Service", "Deployment", "Job", "PersistentVolumeClaim"} <= kinds


def test_helm_lint_finds_nothing_in_strict_mode(value_set: str, secrets_file: Path) -> None:
    files, run_config, extra = VALUE_SETS[value_set]
    args = [arg for path in [*files, secrets_file] for arg in ("-f", str(path))]
    result = helm_template([*args, "--set-file", f"runConfig={REPO_ROOT / run_config}", *extra, "--strict"], "lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_service_gets_the_environment_its_settings_class_requires(
    objects: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Derived from the settings classes: the required fields must be set, every RL_* variable set must be
    read by some service (no typo goes unnoticed), and the settings must build from the environment."""
    services = set()
    for container in containers(objects):
        env = resolved_env(container, objects)
        unknown = {name for name in env if name.startswith("RL_")} - KNOWN_VARIABLES
        assert not unknown, f"{container.name} sets {unknown}, which no service reads"
        service = service_of(container)
        if service is None:
            continue
        services.add(service)
        if service == "worker":  # test_the_worker_command_is_one_the_cli_accepts_and_fits_its_pod
            continue
        settings_type = SETTINGS[service]
        required = {
            env_variable(name, settings_type) for name, f in settings_type.model_fields.items() if f.is_required()
        }
        assert required <= env.keys(), f"{container.name} lacks {required - env.keys()}"
        with monkeypatch.context() as patch:
            for name in [name for name in os.environ if name.startswith("RL_")]:
                patch.delenv(name)
            for name, value in env.items():
                patch.setenv(name, value)
            settings_type()  # raises ValidationError on a missing or malformed value
    assert services == {*SETTINGS, "worker"}


def test_the_run_file_the_model_and_the_run_folder_are_mounted_where_the_services_look(objects: list[dict]) -> None:
    config_maps = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "ConfigMap"}
    for container in containers(objects):
        env = resolved_env(container, objects)
        if "RL_RUN_CONFIG" in env:
            volume = container.mount_for(env["RL_RUN_CONFIG"])
            assert volume is not None and "configMap" in volume, container.name
            config_map = config_maps[volume["configMap"]["name"]]
            assert Path(env["RL_RUN_CONFIG"]).name in config_map["data"], container.name
        for variable in ("RL_MODEL_DIR", "RL_RUN_DIR"):
            if variable in env:
                assert container.mount_for(env[variable]) is not None, (
                    f"{container.name}: {variable} is not on a volume"
                )
    (config_map,) = config_maps.values()
    run_toml = config_map["data"]["run.toml"]
    assert load_run_config_text(run_toml).run_id  # the ConfigMap holds a run file that validates


def load_run_config_text(text: str) -> RunConfig:
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(text)
        f.flush()
        return load_run_config(f.name)


def test_probes_and_scrape_annotations_name_ports_the_container_exposes(objects: list[dict]) -> None:
    for container in containers(objects):
        if container.init:
            continue
        ports = container.port_names_and_numbers()
        assert {"readinessProbe", "livenessProbe"} <= container.spec.keys(), f"{container.name} has no probes"
        for probe_kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.spec.get(probe_kind, {})
            for handler in ("httpGet", "tcpSocket"):
                if handler in probe:
                    assert probe[handler]["port"] in ports, f"{container.name} {probe_kind} -> {probe[handler]['port']}"
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        annotations = obj["spec"]["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            port = int(annotations["prometheus.io/port"])
            exposed = {
                p["containerPort"] for c in obj["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
            }
            assert port in exposed, f"{obj['metadata']['name']} scrapes {port}, not a container port"
    scraped = {
        obj["metadata"]["name"].rsplit("-", 1)[-1]
        for obj in objects
        if obj["kind"] in ("Deployment", "Job")
        and obj["spec"]["template"]["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true"
    }
    assert scraped == {"coordinator", "reward", "learner", "worker"}


def test_every_referenced_secret_config_map_and_claim_is_rendered(objects: list[dict]) -> None:
    rendered = {(obj["kind"], obj["metadata"]["name"]) for obj in objects}
    keys = secret_data(objects)
    for container in containers(objects):
        for entry in container.spec.get("env", []):
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert (ref["name"], ref["key"]) in keys, f"{container.name}: {ref}"
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        for volume in obj["spec"]["template"]["spec"].get("volumes", []):
            if volume["name"] == "models":  # the user's own model claim (model.source: volume)
                continue
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in rendered
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in rendered


def test_only_the_learner_holds_the_signing_key_and_each_trusted_service_its_own_redis_user(
    objects: list[dict],
) -> None:
    passwords = {key: value for (name, key), value in secret_data(objects).items() if name.endswith("-redis")}
    holders = []
    for container in containers(objects):
        env = resolved_env(container, objects)
        if "RL_SIGNING_KEY" in env:
            holders.append(service_of(container))
        service = service_of(container)
        if service in ("services.coordinator", "services.reward", "services.learner"):
            user = service.split(".")[1]
            url = urlsplit(env["RL_REDIS_URL"])
            assert (url.username, url.password) == (user, passwords[user]), container.name
        if service == "worker":  # no Redis credentials: registration issues the worker its own user
            assert "RL_REDIS_URL" not in env and "RL_ADMIN_TOKEN" not in env
    assert holders == ["services.learner"]


def test_workers_join_with_the_one_command_and_scale_by_replicas(secrets_file: Path) -> None:
    objects = render(
        [VALUES / "cpu-demo.yaml", secrets_file], REPO_ROOT / "configs/demo.toml", ["--set=workers.replicas=7"]
    )
    workers = find(objects, "Deployment", "-worker")
    assert workers["spec"]["replicas"] == 7
    (container,) = [c for c in containers([workers]) if not c.init]
    command = container.command
    assert command[:2] == ["relay-rl", "worker"] and option(command, "--token") == "$(RL_JOIN_TOKEN)"
    coordinator = find(objects, "Service", "-coordinator")
    assert (
        option(command, "--coordinator")
        == f"https://{coordinator['metadata']['name']}:{coordinator['spec']['ports'][0]['port']}"
    )


def test_the_worker_command_is_one_the_cli_accepts_and_fits_its_pod(objects: list[dict], repo_root: Path) -> None:
    scripts = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["relay-rl"] == "cluster.cli:main"  # the parser below is the installed command's
    workers = find(objects, "Deployment", "-worker")
    (container,) = [c for c in containers([workers]) if not c.init]
    args = worker_args(container, objects)
    cluster_secret = {key: value for (name, key), value in secret_data(objects).items() if name.endswith("-cluster")}
    coordinator = find(objects, "Service", "-coordinator")
    assert args.command == "worker"
    assert args.coordinator == f"https://{coordinator['metadata']['name']}:{coordinator['spec']['ports'][0]['port']}"
    assert container.mount_for(str(args.ca_file))["secret"]["secretName"].endswith("-coordinator-ca")
    assert (args.token, args.public_key) == (cluster_secret["operator-token"], cluster_secret["weights-public-key"])
    assert args.name == FIELD_REFS["metadata.name"]  # registered under its pod's name
    ports = {port["name"]: port["containerPort"] for port in container.spec["ports"]}
    assert (args.host, args.port) == ("0.0.0.0", ports["chunks"])  # what its probes and other workers reach
    assert args.public_url == f"http://{FIELD_REFS['status.podIP']}:{ports['chunks']}"  # its own pod's IP
    annotations = workers["spec"]["template"]["metadata"]["annotations"]
    assert args.metrics_port == ports["metrics"] == int(annotations["prometheus.io/port"])
    assert container.mount_for(str(args.work_dir)) is not None  # the run file and a built model live there
    if args.model_dir is not None:  # a real checkpoint, on the model volume; else built from the run file
        assert container.mount_for(str(args.model_dir)) == container.mount_for("/models")


def test_the_cpu_demo_builds_the_tiny_model_and_asks_for_no_gpu(secrets_file: Path) -> None:
    objects = render([VALUES / "cpu-demo.yaml", secrets_file], REPO_ROOT / "configs/demo.toml")
    assert "nvidia.com/gpu" not in str(objects)
    learner = find(objects, "Job", "-learner")
    assert learner["spec"]["template"]["spec"]["containers"][0]["command"] == ["python", "-m", "services.learner"]
    init = find(objects, "Deployment", "-reward")["spec"]["template"]["spec"]["initContainers"]
    assert init[0]["command"][:3] == ["python", "-m", "services.learner.model_init"]  # the tokenizer it decodes with
    (worker,) = [c for c in containers([find(objects, "Deployment", "-worker")]) if not c.init]
    assert "--model-dir" not in worker.command  # relay-rl worker builds the tiny-random policy itself
    run = load_run_config_text(find(objects, "ConfigMap", "-run-config")["data"]["run.toml"])
    assert run.model.init == "tiny-random" and run.rollout.engine == "torch"


def test_the_gpu_values_run_the_learner_under_torchrun_on_its_gpus_and_vllm_workers(secrets_file: Path) -> None:
    objects = render(
        [VALUES / "gpu.yaml", secrets_file],
        REPO_ROOT / "configs/qwen3.toml",
        ["--set=learner.gpus=8", "--set=learner.processesPerNode=8"],
    )
    (learner,) = [c for c in containers([find(objects, "Job", "-learner")]) if not c.init]
    assert learner.spec["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert learner.command == [
        "python",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=8",
        "-m",
        "services.learner",
    ]
    assert learner.mount_for("/dev/shm") is not None
    assert resolved_env(learner, objects)["RL_MODEL_DIR"] == "/models/Qwen3-0.6B"
    (worker,) = [c for c in containers([find(objects, "Deployment", "-worker")]) if not c.init]
    assert option(worker.command, "--engine") == "vllm" and worker.spec["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert option(worker.command, "--model-dir") == "/models/Qwen3-0.6B"


def test_redis_keeps_an_append_only_file_and_acl_users_on_its_volume_or_is_external(secrets_file: Path) -> None:
    objects = render([VALUES / "cpu-demo.yaml", secrets_file], REPO_ROOT / "configs/demo.toml")
    redis = find(objects, "StatefulSet", "-redis")
    args = " ".join(redis["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "--appendonly yes" in args and "--aclfile /data/users.acl" in args
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    (acl,) = redis["spec"]["template"]["spec"]["initContainers"]
    assert "python -m cluster.redis_acl" in acl["command"][-1]
    assert "user rl:" not in acl["command"][-1]  # no worker users to keep: workers have no Redis access

    external = render(
        [VALUES / "cpu-demo.yaml", secrets_file],
        REPO_ROOT / "configs/demo.toml",
        [f"--set=redis.external.url={EXTERNAL_REDIS}"],
    )
    assert not [obj for obj in external if obj["kind"] == "StatefulSet"]
    for container in containers(external):
        env = resolved_env(container, external)
        if "RL_REDIS_URL" in env:
            assert (
                urlsplit(env["RL_REDIS_URL"]).netloc.endswith("@redis.example.internal:6380")
                or env["RL_REDIS_URL"] == EXTERNAL_REDIS
            )


def test_a_missing_secret_stops_the_render_with_its_name() -> None:
    result = helm_template(
        ["-f", str(VALUES / "cpu-demo.yaml"), "--set-file", f"runConfig={REPO_ROOT / 'configs/demo.toml'}"]
    )
    assert result.returncode != 0
    assert "secrets.operatorToken" in result.stderr


def test_python_commands_run_modules_that_exist(objects: list[dict]) -> None:
    for container in containers(objects):
        command = container.command
        if command[:1] != ["python"] or "-m" not in command:
            continue
        for i, arg in enumerate(command[:-1]):
            if arg == "-m":
                module = command[i + 1]
                spec = importlib.util.find_spec(module)
                assert spec is not None, f"{container.name} runs missing module {module}"
                if spec.submodule_search_locations:  # a package: `python -m` runs its __main__
                    assert importlib.util.find_spec(module + ".__main__") is not None, module


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("workers.engine=tensorrt", "workers.engine"),
        ("secrets.operatorToken=short", "secrets.operatorToken"),
        ("secrets.operatorToken=0123456789abcdef0123456789abcdef", "secrets.operatorToken"),  # a shared token's form
        ("redis.external.url=redis://user:password@redis:6379/0", "redis.external.url"),  # credentials: per service
        ("redis.external.url=", None),  # empty: the chart's own Redis
        ("learner.processesPerNode=0", "learner.processesPerNode"),
        ("model.source=volume", "model"),  # a volume source needs its volume
    ],
)
def test_values_outside_the_schema_are_refused_with_their_name(
    setting: str, named: str | None, secrets_file: Path
) -> None:
    """deploy/relay-rl/values.schema.json: helm checks a user's values before rendering anything."""
    result = helm_template(
        ["-f", str(VALUES / "cpu-demo.yaml"), "-f", str(secrets_file), "--set", setting]
        + ["--set-file", f"runConfig={REPO_ROOT / 'configs/demo.toml'}"]
    )
    if named is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0 and f"- {named}:" in result.stderr, result.stderr


def test_workers_join_with_the_operator_credential_the_coordinator_provisions(
    objects: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No shared join token: the coordinator provisions the chart's operator credential at start and the
    workers send it, so they have a budget and a record of their own and quarantine sticks to them."""
    (coordinator,) = [c for c in containers([find(objects, "Deployment", "-coordinator")]) if not c.init]
    (worker,) = [c for c in containers([find(objects, "Deployment", "-worker")]) if not c.init]
    coordinator_env, worker_env = resolved_env(coordinator, objects), resolved_env(worker, objects)
    assert "RL_JOIN_TOKEN" not in coordinator_env
    for name in [name for name in os.environ if name.startswith("RL_")]:
        monkeypatch.delenv(name)
    for name, value in coordinator_env.items():
        monkeypatch.setenv(name, value)
    settings = CoordinatorSettings()
    assert settings.join_token is None and settings.operator_token_values() == [worker_env["RL_JOIN_TOKEN"]]
    assert worker_args(worker, objects).token == worker_env["RL_JOIN_TOKEN"]


def test_the_coordinator_serves_https_with_a_certificate_the_workers_verify_with_the_run_ca(
    objects: list[dict],
) -> None:
    """Workers send the coordinator tokens, so it serves https only: its certificate and key come from
    <fullname>-coordinator-tls, mounted where RL_TLS_CERT_FILE / RL_TLS_KEY_FILE say; the workers get only the
    CA (<fullname>-coordinator-ca), and that CA issued a certificate for the name they dial."""
    from cryptography import x509

    (coordinator,) = [c for c in containers([find(objects, "Deployment", "-coordinator")]) if not c.init]
    env = resolved_env(coordinator, objects)
    data = secret_data(objects)
    for variable, key in (("RL_TLS_CERT_FILE", "tls.crt"), ("RL_TLS_KEY_FILE", "tls.key")):
        volume = coordinator.mount_for(env[variable])
        assert volume is not None and volume["secret"]["secretName"].endswith("-coordinator-tls"), variable
        assert Path(env[variable]).name == key and (volume["secret"]["secretName"], key) in data
    for probe in ("readinessProbe", "livenessProbe"):
        assert coordinator.spec[probe]["httpGet"]["scheme"] == "HTTPS"
    (worker,) = [c for c in containers([find(objects, "Deployment", "-worker")]) if not c.init]
    args = worker_args(worker, objects)
    ca_secret = worker.mount_for(str(args.ca_file))["secret"]["secretName"]
    assert {key for name, key in data if name == ca_secret} == {"ca.crt"}  # no key reaches a worker's pod
    ca = x509.load_pem_x509_certificate(data[(ca_secret, "ca.crt")].encode())
    (tls_secret,) = {name for name, key in data if key == "tls.crt"}
    certificate = x509.load_pem_x509_certificate(data[(tls_secret, "tls.crt")].encode())
    certificate.verify_directly_issued_by(ca)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert urlsplit(args.coordinator).hostname in names.get_values_for_type(x509.DNSName)
