"""python -m cluster.join: add one rollout worker to a running cluster, from any terminal.

Reads the cluster's settings from <run dir>/cluster.env (written by `python -m cluster.local`; default
runs/latest, the newest local cluster) and runs `python -m services.rollout` in the foreground with
them, so Ctrl-C drains it (finish the batch, deregister, exit). What the worker reports about itself
(name, price, GPU type, bandwidth, region) comes from the flags; the coordinator decides whether it is
active or on standby (cost-aware activation) and the dashboard shows it.

It joins with a credential of its own: with the admin token of cluster.env, a join credential is issued for
it (POST /v1/operators, named after the worker), so it has its own budget and record and a quarantine
sticks to it alone. `--shared-token` joins with the cluster's shared RL_JOIN_TOKEN instead (a trusted
worker of the local demo, one credential with the demo's own workers).

    python -m cluster.join --name gpu-a --price 0.5        # or: relay-rl worker --name gpu-a (make worker)
    python -m cluster.join --print-env                     # the environment, to start a worker by hand

A worker on another machine takes the rest from the coordinator: `relay-rl worker --coordinator URL
--token JOIN_TOKEN`, JOIN_TOKEN a credential the admin issued for it (`relay-rl operators issue NAME`;
cluster/remote_worker.py, docs/cli.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cluster.worker_process import add_identity_arguments, exec_rollout_worker, identity_environment
from shared.tls import CoordinatorTrust, is_verification_failure

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUN_DIR = REPO_ROOT / "runs" / "latest"
# what a worker needs from cluster.env besides its join token (the admin token stays out of its environment)
WORKER_VARIABLES = (
    "RL_COORDINATOR_URL",
    "RL_WEIGHTS_PUBLIC_KEY",
    "RL_RUN_CONFIG",
    "RL_RUN_ID",
    "RL_RUN_DIR",
    "RL_MODEL_DIR",
)  # and, with a cluster run with --tls, RL_COORDINATOR_CA_FILE (shared/tls.py CoordinatorTrust.environment)
ADMIN_TOKEN_VARIABLE = "RL_ADMIN_TOKEN"  # in cluster.env: issues each new worker a credential of its own
SHARED_TOKEN_VARIABLE = "RL_JOIN_TOKEN"  # the demo's shared token, for --shared-token
ISSUE_TIMEOUT_S = 10.0


def read_cluster_env(run_dir: Path) -> dict[str, str]:
    """The KEY=VALUE lines of <run_dir>/cluster.env. Raises ValueError with what to do when it is missing."""
    path = run_dir / "cluster.env"
    if not path.exists():
        raise ValueError(
            f"{path} not found: start a cluster first (make demo / python -m cluster.local) or pass --run-dir"
        )
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def cluster_trust(cluster: dict[str, str]) -> CoordinatorTrust:
    """How a tool verifies the coordinator (shared/tls.py): RL_COORDINATOR_CA_FILE, RL_COORDINATOR_CERT_SHA256 and
    RL_INSECURE_HTTP from this process's environment where set there, else from `cluster` (a cluster.env)."""
    overrides = {name: value for name, value in os.environ.items() if value.strip()}
    return CoordinatorTrust.from_env({**cluster, **overrides})


class CredentialNotIssuedError(Exception):
    """The coordinator issued no join credential for a new worker: it did not answer (`unreachable`), or refused."""

    def __init__(self, message: str, *, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def add_shared_token_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shared-token",
        action="store_true",
        help="join with the local cluster's shared RL_JOIN_TOKEN (a trusted worker of the demo) instead of a join "
        "credential issued for this worker with cluster.env's admin token",
    )


def local_join_token(cluster: dict[str, str], worker_name: str, *, shared_token: bool) -> str:
    """What a new worker of the local cluster (`cluster`: its cluster.env) joins with: a credential issued for it
    when cluster.env has the admin token, unless `shared_token`; else the shared RL_JOIN_TOKEN.
    Raises CredentialNotIssuedError, or ValueError when cluster.env has neither token."""
    if shared_token or ADMIN_TOKEN_VARIABLE not in cluster:
        if SHARED_TOKEN_VARIABLE not in cluster:
            raise ValueError(f"cluster.env has no {SHARED_TOKEN_VARIABLE} (and no admin token to issue a credential)")
        return cluster[SHARED_TOKEN_VARIABLE]
    join_token = issue_join_credential(
        cluster["RL_COORDINATOR_URL"], cluster[ADMIN_TOKEN_VARIABLE], worker_name, CoordinatorTrust.from_env(cluster)
    )
    print(
        f"issued join credential {join_token.partition('.')[0]} for {worker_name}: its own budget and record "
        "(relay-rl operators list)",
        file=sys.stderr,
        flush=True,
    )
    return join_token


def issue_join_credential(
    coordinator_url: str, admin_token: str, name: str, trust: CoordinatorTrust | None = None
) -> str:
    """POST /v1/operators with the admin token: a new credential named `name`; returns its join token. `trust`:
    how the coordinator is verified first (shared/tls.py; default the system's CAs, plain http on loopback only:
    InsecureCoordinatorError, a ValueError, otherwise)."""
    import httpx

    from shared.api import OPERATORS_PATH, IssuedOperator

    verify = (trust or CoordinatorTrust()).verify_for(coordinator_url)
    try:
        response = httpx.post(
            coordinator_url.rstrip("/") + OPERATORS_PATH,
            json={"name": name},
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=ISSUE_TIMEOUT_S,
            verify=verify,
        )
    except httpx.HTTPError as exc:  # refused, unresolvable, timed out: the user starts it again
        what = "failed TLS verification (nothing was sent)" if is_verification_failure(exc) else "cannot be reached"
        message = f"the coordinator at {coordinator_url} {what}; no join credential issued: {exc}"
        raise CredentialNotIssuedError(message, unreachable=True) from exc
    if response.status_code != 201:
        message = (
            f"the coordinator issued no join credential for {name}: HTTP {response.status_code} {response.text[:200]}"
        )
        raise CredentialNotIssuedError(message, unreachable=False)
    return IssuedOperator.model_validate_json(response.content).join_token


def worker_environment(cluster: dict[str, str], args: argparse.Namespace) -> dict[str, str]:
    missing = [name for name in WORKER_VARIABLES if name not in cluster]
    if missing:
        raise ValueError(f"cluster.env lacks {', '.join(missing)}")
    join_token = local_join_token(cluster, args.name, shared_token=args.shared_token)
    return (
        {name: cluster[name] for name in WORKER_VARIABLES}
        | CoordinatorTrust.from_env(cluster).environment()
        | {"RL_JOIN_TOKEN": join_token}
        | identity_environment(args)
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.join", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--run-dir", type=Path, default=DEFAULT_RUN_DIR, help="the cluster's run folder (default runs/latest)"
    )
    add_identity_arguments(parser, default_name=f"joined-{os.getpid()}")
    add_shared_token_argument(parser)
    parser.add_argument(
        "--print-env",
        action="store_true",
        help="print the worker's environment as shell exports and exit (its join credential issued all the same)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        env = worker_environment(read_cluster_env(args.run_dir), args)
    except (ValueError, CredentialNotIssuedError) as exc:
        sys.exit(str(exc))
    if args.print_env:
        print("\n".join(f"export {name}={value}" for name, value in env.items()))
        print("python -m services.rollout")
        return
    print(
        f"joining {env['RL_COORDINATOR_URL']} (run {env['RL_RUN_ID']}) as {args.name}, ${args.price}/h; Ctrl-C drains it",
        flush=True,
    )
    os.chdir(REPO_ROOT)
    exec_rollout_worker(env)


if __name__ == "__main__":
    main()
