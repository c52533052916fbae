"""`relay-rl worker`: one command starts a rollout worker on any machine and joins a running cluster.

    relay-rl worker --coordinator https://coord.example:8000 --ca-file ca.pem --token=$RL_JOIN_TOKEN --name gpu-a

The join token is a credential the cluster's admin issued for this worker or its operator (`relay-rl operators
issue NAME`): its own budget and record, and a quarantine sticks to it. Without --coordinator and --token, on
the machine of a local cluster (`make worker`), both come from its cluster.env: a credential issued for this
worker with the admin token there, or with --shared-token the local demo's shared join token.

    0. trust     the coordinator is https://, checked against the run CA (--ca-file) or a pinned certificate
                 (--cert-sha256) before the token is sent (shared/tls.py); a plain http:// URL whose host is not
                 loopback is refused (exit 2) unless --insecure; a certificate that fails: exit 5, nothing sent
    1. fetch     GET /v1/cluster/bootstrap with the join token (header X-RL-Join-Token): the run id, the
                 run file, the learner's public key and the model (shared/api.py
                 ClusterBootstrap); 401: a wrong token, exit 3; no coordinator there: exit 4
    2. pin       with --public-key (or RL_WEIGHTS_PUBLIC_KEY) set, the coordinator's key must be that one:
                 the key comes over the same HTTP as the rest (trust on first use), pinning it means a
                 coordinator (or a man in the middle) cannot hand this worker weights signed by another key
    3. write     the run file into the work folder (--work-dir, default ~/.cache/relay-rl/<run id>)
    4. model     `[model] init = "tiny-random"`: build it from the run file, as the learner did (seeded, so the
                 same weights and the same fingerprint); a catalog model's name: its folder in this machine's
                 model cache, fetched and converted first where absent (relay-rl model get; the same bytes
                 where transformers is the learner's version); a real checkpoint: --model-dir (or the run file's
                 `[model] path` where the same folder exists here), checked before anything heavy loads;
                 then against the learner's newest manifest (its learner URL from the coordinator's relay
                 plan, its signature checked with the key): a folder with another tokenizer or architecture
                 (model fingerprint) is refused here. A learner this machine cannot reach, or no version
                 yet: the worker's own check at the first weights refuses it (shared/weight_channel/manifest.py)
    5. exec      `python -m services.rollout` with that environment (the trust of step 0 included) in place of
                 this process: Ctrl-C drains it (finish the batch, deregister, exit 0). The worker needs no
                 Redis: it takes tasks and hands back groups through the coordinator's work API.

Only the standard library is imported at module level: `relay-rl worker --help` builds its parser here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.join import (
    DEFAULT_RUN_DIR,
    CredentialNotIssuedError,
    add_shared_token_argument,
    local_join_token,
    read_cluster_env,
)
from cluster.model_cache import link_catalog_model
from cluster.tool_settings import tool_settings
from cluster.worker_process import add_identity_arguments, exec_rollout_worker, identity_environment
from shared.tls import (
    CA_FILE_ENV,
    CERT_SHA256_ENV,
    INSECURE_HTTP_ENV,
    CoordinatorTrust,
    Verify,
    is_verification_failure,
)

if TYPE_CHECKING:
    import httpx

    from shared.api import ClusterBootstrap

COORDINATOR_ENV = "RL_COORDINATOR_URL"
JOIN_TOKEN_ENV = "RL_JOIN_TOKEN"
PUBLIC_KEY_ENV = "RL_WEIGHTS_PUBLIC_KEY"  # = shared.signing.PUBLIC_KEY_ENV (not imported: --help stays instant)
DEFAULT_WORK_ROOT = Path.home() / ".cache" / "relay-rl"
BOOTSTRAP_TIMEOUT_S = 10.0
NOTHING_PUBLISHED = "no version published yet: the fingerprint is checked at the first weights"

# exit codes besides 0 (drained or stopped)
EXIT_FAILED = 1  # anything else: the coordinator has no bootstrap, a model folder is unusable, ...
EXIT_USAGE = 2  # no coordinator URL or no join token (argparse's code for a usage error)
EXIT_REFUSED = 3  # the coordinator refused the join token (HTTP 401/403)
EXIT_UNREACHABLE = 4  # no coordinator answered at that URL
EXIT_UNTRUSTED = 5  # the coordinator's certificate failed verification (run CA, pin): nothing was sent


class JoinError(Exception):
    """Why the worker cannot join, in one line for the user, with the exit code to leave with."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    environment = tool_settings("relay-rl worker")
    parser.add_argument(
        "--coordinator",
        default=environment.coordinator_url,
        help=f"the coordinator's base URL, reachable from here (default ${COORDINATOR_ENV})",
    )
    parser.add_argument(
        "--token",
        default=environment.join_token_value(),
        help=f"a join credential the cluster's admin issued (relay-rl operators issue), or a shared join token "
        f"(default ${JOIN_TOKEN_ENV}; write --token=VALUE if it begins with -)",
    )
    parser.add_argument(
        "--ca-file",
        type=Path,
        default=environment.coordinator_ca_file,
        help=f"the run's CA certificate (ca.pem of relay-rl keys): the https coordinator's certificate must chain to "
        f"it (default ${CA_FILE_ENV}; neither this nor --cert-sha256: the system's CAs)",
    )
    parser.add_argument(
        "--cert-sha256",
        default=environment.coordinator_cert_sha256,
        help=f"pin the coordinator's certificate by its SHA-256 (hex; the coordinator logs it at start) instead of a "
        f"CA (default ${CERT_SHA256_ENV})",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=environment.insecure_http,
        help=f"allow a plain http:// coordinator that is not on loopback: the join token and the worker's tokens "
        f"cross the network in clear text (test beds only; default ${INSECURE_HTTP_ENV})",
    )
    parser.add_argument(
        "--public-key",
        default=environment.weights_public_key,
        help="pin the learner's Ed25519 public key (hex): refuse a coordinator that hands out another one "
        f"(default ${PUBLIC_KEY_ENV}; unset: trust the coordinator's on first use)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help=f"where the run file and model go (default {DEFAULT_WORK_ROOT}/<run id>)",
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="the run's HF checkpoint on this machine (default: built here for init = tiny-random, the model "
        "cache's folder for a catalog model's name, else the run file's [model] path)",
    )
    parser.add_argument("--engine", choices=("torch", "vllm", "auto"), default=None, help="default: the run file's")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the inference engine")
    add_identity_arguments(parser, default_name=f"worker-{os.uname().nodename}"[:64])
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface this worker's chunk server binds (weight relaying to peers)"
    )
    parser.add_argument("--port", type=int, default=0, help="chunk server port (0: any free port)")
    parser.add_argument(
        "--public-url", default=None, help="how other workers reach that chunk server (default http://<host>:<port>)"
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=DEFAULT_RUN_DIR,
        help="a local cluster's run folder: with neither --coordinator nor --token, both (and --model-dir) come "
        "from its cluster.env (make worker; default runs/latest)",
    )
    add_shared_token_argument(parser)


def main(args: argparse.Namespace) -> None:
    """Steps 1-5 of the module doc; exits with a one-line reason and the exit codes above on failure."""
    try:
        env = prepare(args)
    except JoinError as exc:
        print(f"relay-rl worker: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    print(
        f"joining {args.coordinator} (run {env['RL_RUN_ID']}) as {args.name}, ${args.price}/h; Ctrl-C drains it",
        file=sys.stderr,
        flush=True,
    )
    exec_rollout_worker(env)


def prepare(args: argparse.Namespace) -> dict[str, str]:
    """Steps 1-4: the rollout worker's environment, with the run file and model folder in place."""
    if not args.coordinator and not args.token and (args.run_dir / "cluster.env").exists():
        take_local_cluster(args)
    elif args.shared_token:
        print("relay-rl worker: --shared-token is for a local cluster's cluster.env: ignored", file=sys.stderr)
    if not args.coordinator:
        raise JoinError(f"no coordinator: pass --coordinator URL or set {COORDINATOR_ENV}", EXIT_USAGE)
    if not args.token:
        raise JoinError(f"no join token: pass --token TOKEN or set {JOIN_TOKEN_ENV}", EXIT_USAGE)
    trust = CoordinatorTrust(args.ca_file, args.cert_sha256, args.insecure)
    try:  # step 0, before the token goes anywhere
        verify = trust.verify_for(args.coordinator)
    except ValueError as exc:  # plain http to another host, an unreadable CA file, a malformed pin
        raise JoinError(str(exc), EXIT_USAGE) from exc
    from rich.console import Console

    console = Console(stderr=True)
    with console.status(f"fetching the cluster's settings from {args.coordinator}"):
        bootstrap = fetch_bootstrap(args.coordinator, args.token, verify)
    check_public_key(bootstrap.weights_public_key, args.public_key)
    work_dir = (args.work_dir or DEFAULT_WORK_ROOT / bootstrap.run_id).resolve()
    run_file = write_run_file(work_dir, bootstrap.run_config_toml)
    init = bootstrap.model.init
    with console.status("preparing the model folder" + (f" (init = {init}: built or fetched here)" if init else "")):
        model_dir = prepare_model_folder(bootstrap, run_file, args.model_dir, work_dir)
    with console.status("checking the model folder against the learner's newest weights"):
        checked = check_against_learner(args.coordinator, bootstrap.weights_public_key, model_dir, verify)
    console.print(f"run {bootstrap.run_id}: run file {run_file}, model folder {model_dir} ({checked})")
    env = {
        "RL_COORDINATOR_URL": args.coordinator.rstrip("/"),
        "RL_JOIN_TOKEN": args.token,
        "RL_WEIGHTS_PUBLIC_KEY": bootstrap.weights_public_key,
        "RL_RUN_CONFIG": str(run_file),
        "RL_RUN_ID": bootstrap.run_id,
        "RL_RUN_DIR": str(work_dir),
        "RL_MODEL_DIR": str(model_dir),
        "RL_WORKER_NUM_THREADS": str(args.threads),
        "RL_WORKER_HOST": args.host,
        "RL_WORKER_PORT": str(args.port),
        **trust.environment(),
        **identity_environment(args),
    }
    if args.engine is not None:
        env["RL_WORKER_ENGINE"] = args.engine
    if args.public_url is not None:
        env["RL_WORKER_PUBLIC_URL"] = args.public_url
    return env


def take_local_cluster(args: argparse.Namespace) -> None:
    """`make worker`: the coordinator and model folder of the local cluster in args.run_dir and a join token (a
    credential issued for this worker, or with --shared-token the cluster's shared one); its work folder (default)
    in that run folder, <run dir>/joined/<name>."""
    cluster = read_cluster_env(args.run_dir)
    args.coordinator = cluster["RL_COORDINATOR_URL"]
    local = CoordinatorTrust.from_env(cluster)  # --tls: its run CA; the emulated WAN without it: plain http allowed
    args.ca_file = args.ca_file or local.ca_file
    args.cert_sha256 = args.cert_sha256 or local.cert_sha256
    args.insecure = args.insecure or local.insecure_http
    try:
        args.token = local_join_token(cluster, args.name, shared_token=args.shared_token)
    except CredentialNotIssuedError as exc:
        raise JoinError(str(exc), EXIT_UNREACHABLE if exc.unreachable else EXIT_FAILED) from exc
    except ValueError as exc:
        raise JoinError(str(exc), EXIT_USAGE) from exc
    if args.model_dir is None:
        args.model_dir = Path(cluster["RL_MODEL_DIR"])
    if args.work_dir is None:
        args.work_dir = args.run_dir.resolve() / "joined" / args.name


def fetch_bootstrap(coordinator_url: str, join_token: str, verify: Verify = True) -> ClusterBootstrap:
    """Step 1: GET /v1/cluster/bootstrap; JoinError with the reason (and exit code) otherwise."""
    import httpx
    from pydantic import ValidationError

    from shared.api import BOOTSTRAP_PATH, JOIN_TOKEN_HEADER, ClusterBootstrap

    url = coordinator_url.rstrip("/") + BOOTSTRAP_PATH
    try:
        response = httpx.get(url, headers={JOIN_TOKEN_HEADER: join_token}, timeout=BOOTSTRAP_TIMEOUT_S, verify=verify)
    except httpx.HTTPError as exc:  # refused, unresolvable, timed out: nothing to retry on the user's behalf
        if is_verification_failure(exc):
            raise JoinError(
                f"the coordinator at {coordinator_url} failed TLS verification (nothing was sent): {exc}",
                EXIT_UNTRUSTED,
            ) from exc
        raise JoinError(f"cannot reach the coordinator at {coordinator_url}: {exc}", EXIT_UNREACHABLE) from exc
    if response.status_code in (401, 403):
        raise JoinError(
            f"the coordinator refused the join token (HTTP {response.status_code}: {detail_of(response)})", EXIT_REFUSED
        )
    if response.status_code != 200:
        raise JoinError(f"GET {url}: HTTP {response.status_code}: {detail_of(response)}")
    try:
        return ClusterBootstrap.model_validate_json(response.content)
    except ValidationError as exc:
        raise JoinError(f"GET {url} answered something other than a relay-rl cluster bootstrap: {exc}") from exc


def detail_of(response: httpx.Response) -> str:
    """FastAPI's `detail` of an error answer, else its text (cut short)."""
    import json

    try:
        return str(json.loads(response.text)["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def check_public_key(offered_hex: str, pinned_hex: str | None) -> None:
    """Step 2: a pinned key must be the coordinator's."""
    if pinned_hex is not None and pinned_hex.strip().lower() != offered_hex:
        raise JoinError(
            f"the coordinator hands out weights public key {offered_hex[:16]}.., but {pinned_hex.strip()[:16]}.. "
            f"is pinned (--public-key / {PUBLIC_KEY_ENV}): refusing to join a cluster whose weights another key signs"
        )


def write_run_file(work_dir: Path, run_config_toml: str) -> Path:
    """Step 3: <work_dir>/run.toml, the coordinator's run file as it read it."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "run.toml"
    path.write_text(run_config_toml)
    return path


def prepare_model_folder(bootstrap: ClusterBootstrap, run_file: Path, model_dir: Path | None, work_dir: Path) -> Path:
    """Step 4: the checked model folder. Without --model-dir, `init = "tiny-random"`: built into
    <work_dir>/model with the learner's own builder (services/learner/model_init.py), once; a catalog
    model's name: <work_dir>/model links its folder in the model cache (fetched and converted where absent)."""
    from shared.model_catalog import TINY_RANDOM
    from shared.tokenization import ModelFolderError, check_model_folder

    if model_dir is None:
        if bootstrap.model.init is not None:
            model_dir = work_dir / "model"
            if bootstrap.model.init == TINY_RANDOM and not (model_dir / "config.json").exists():
                build_tiny_random_policy(run_file, model_dir)
            elif bootstrap.model.init != TINY_RANDOM:
                fetch_catalog_model(bootstrap.model.init, model_dir)
        elif bootstrap.model.path is not None:
            model_dir = bootstrap.model.path
        else:
            raise JoinError("the run file names no model ([model] path or init): pass --model-dir with the checkpoint")
    try:
        check_model_folder(model_dir)
    except ModelFolderError as exc:
        raise JoinError(f"{exc} (--model-dir: the run's checkpoint on this machine)") from exc
    return model_dir.resolve()


def check_against_learner(coordinator_url: str, public_key_hex: str, model_dir: Path, verify: Verify = True) -> str:
    """Step 4's last check: JoinError unless the learner's newest full version was published for this
    folder's model fingerprint and verifies with the public key. Returns what was checked, in words."""
    import httpx
    from pydantic import ValidationError

    from shared.api import RelayPlanResponse
    from shared.signing import load_public_key
    from shared.tokenization import model_fingerprint
    from shared.weight_channel import (
        Manifest,
        ManifestError,
        ModelMismatchError,
        check_model_fingerprint,
        manifest_path,
        verify_signature,
    )

    try:
        plan = httpx.get(coordinator_url.rstrip("/") + "/v1/broadcast/plan", timeout=BOOTSTRAP_TIMEOUT_S, verify=verify)
        learner_url = RelayPlanResponse.model_validate_json(plan.raise_for_status().content).learner_url
        if not learner_url:
            return NOTHING_PUBLISHED
        latest = httpx.get(learner_url.rstrip("/") + manifest_path(None), timeout=BOOTSTRAP_TIMEOUT_S)
        if latest.status_code == 404:
            return NOTHING_PUBLISHED
        manifest = Manifest.model_validate_json(latest.raise_for_status().content)
    except (httpx.HTTPError, ValidationError) as exc:  # its chunk server may be reachable only through relays
        return f"the learner is out of reach ({exc}): the fingerprint is checked at the first weights"
    if not manifest.model_fingerprint:
        return f"the learner's version {manifest.policy_version} names no model fingerprint: nothing to compare"
    try:
        verify_signature(manifest, load_public_key(public_key_hex))
        check_model_fingerprint(manifest, model_fingerprint(model_dir))
    except ModelMismatchError as exc:
        raise JoinError(f"{model_dir}: {exc}") from exc
    except ManifestError as exc:
        raise JoinError(
            f"the learner's newest manifest does not verify with the coordinator's public key: {exc}"
        ) from exc
    return f"same model fingerprint as the learner's version {manifest.policy_version}"


def fetch_catalog_model(name: str, link: Path) -> None:
    """`link` -> the catalog model's cached folder, checked (cheaply where cached) each time the worker starts."""
    try:
        link_catalog_model(name, link)
    except RuntimeError as exc:
        raise JoinError(f"getting catalog model {name}: {exc}") from exc


def build_tiny_random_policy(run_file: Path, model_dir: Path) -> None:
    """The run's tiny random policy, in a child process (torch and transformers stay out of this one)."""
    command = [sys.executable, "-m", "services.learner.model_init", "--config", str(run_file), "--out", str(model_dir)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise JoinError(f"building the tiny-random policy failed:\n{result.stderr[-2000:]}")
