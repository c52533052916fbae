"""Starting a rollout worker process in the foreground, for `make worker` (cluster/join.py, a local
cluster's settings) and `relay-rl worker` (cluster/remote_worker.py, settings from the coordinator):
the flags that say what a worker reports about itself, and the exec into `python -m services.rollout`,
so Ctrl-C (SIGINT) reaches the worker itself and drains it (finish the batch, deregister, exit 0).

Standard library only: `relay-rl worker --help` imports this before any argument is parsed."""

from __future__ import annotations

import argparse
import os
import sys


def add_identity_arguments(parser: argparse.ArgumentParser, default_name: str) -> None:
    """--name, --price, --gpu-type, --bandwidth-mbps, --region, --metrics-port: what the worker reports at
    registration (the coordinator's cost-aware activation and relay plan use them)."""
    parser.add_argument("--name", default=default_name, help="label shown by the coordinator and dashboard")
    parser.add_argument("--price", type=float, default=0.0, help="$/h this worker costs (0: free, always active)")
    parser.add_argument("--gpu-type", default="cpu", help="accelerator kind reported at registration")
    parser.add_argument("--bandwidth-mbps", type=float, default=1000.0, help="link speed reported at registration")
    parser.add_argument("--region", default="local", help="where it runs")
    parser.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: off)")


def identity_environment(args: argparse.Namespace) -> dict[str, str]:
    """The RL_* variables of services/rollout/settings.py that the identity flags set."""
    return {
        "RL_WORKER_NAME": args.name,
        "RL_WORKER_PRICE_PER_HOUR": str(args.price),
        "RL_WORKER_GPU_TYPE": args.gpu_type,
        "RL_WORKER_BANDWIDTH_MBPS": str(args.bandwidth_mbps),
        "RL_WORKER_REGION": args.region,
        "RL_METRICS_PORT": str(args.metrics_port),
    }


def exec_rollout_worker(env: dict[str, str]) -> None:
    """Replace this process by `python -m services.rollout` with `env` over the current environment (never
    returns). The same PID: a signal sent to the command the user started reaches the worker."""
    os.execvpe(
        sys.executable, [sys.executable, "-m", "services.rollout"], {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    )
