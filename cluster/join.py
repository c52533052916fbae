"""python -m cluster.join: add one rollout worker to a running cluster, from any terminal.

Reads the cluster's settings from <run dir>/cluster.env (written by `python -m cluster.local`; default
runs/latest, the newest local cluster) and runs `python -m services.rollout` in the foreground with
them, so Ctrl-C drains it (finish the batch, deregister, exit). What the worker reports about itself
(name, price, GPU type, bandwidth, region) comes from the flags; the coordinator decides whether it is
active or on standby (cost-aware activation) and the dashboard shows it.

    python -m cluster.join --name gpu-a --price 0.5        # or: make worker NAME=gpu-a PRICE=0.5
    python -m cluster.join --print-env                     # the environment, to start a worker by hand

A worker on another machine takes the rest from the coordinator: `relay-rl worker --coordinator URL
--token JOIN_TOKEN` (cluster/remote_worker.py, docs/cli.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cluster.worker_process import add_identity_arguments, exec_rollout_worker, identity_environment

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUN_DIR = REPO_ROOT / "runs" / "latest"
# what a worker needs from cluster.env (the admin token stays out of the worker's environment)
WORKER_VARIABLES = (
    "RL_COORDINATOR_URL",
    "RL_WEIGHTS_PUBLIC_KEY",
    "RL_JOIN_TOKEN",
    "RL_RUN_CONFIG",
    "RL_RUN_ID",
    "RL_RUN_DIR",
    "RL_MODEL_DIR",
)


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


def worker_environment(cluster: dict[str, str], args: argparse.Namespace) -> dict[str, str]:
    missing = [name for name in WORKER_VARIABLES if name not in cluster]
    if missing:
        raise ValueError(f"cluster.env lacks {', '.join(missing)}")
    return {name: cluster[name] for name in WORKER_VARIABLES} | identity_environment(args)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.join", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--run-dir", type=Path, default=DEFAULT_RUN_DIR, help="the cluster's run folder (default runs/latest)"
    )
    add_identity_arguments(parser, default_name=f"joined-{os.getpid()}")
    parser.add_argument(
        "--print-env", action="store_true", help="print the worker's environment as shell exports and exit"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        env = worker_environment(read_cluster_env(args.run_dir), args)
    except ValueError as exc:
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
