"""`relay-rl status`: the run at a glance from the coordinator's GET /v1/status (shared/api.py
StatusResponse), as a short summary and a table of the workers; `--json` prints the answer as sent.

The coordinator is --coordinator, else $RL_COORDINATOR_URL, else the one in <run dir>/cluster.env
(runs/latest: the newest local cluster). /v1/status needs no token; an https coordinator is verified with
$RL_COORDINATOR_CA_FILE or $RL_COORDINATOR_CERT_SHA256, else cluster.env's, else the system's CAs."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.tool_settings import tool_settings

if TYPE_CHECKING:
    from rich.console import RenderableType

    from shared.api import StatusResponse

STATUS_TIMEOUT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser, default_run_dir: Path) -> None:
    parser.add_argument(
        "--coordinator",
        default=tool_settings("relay-rl status").coordinator_url,
        help="the coordinator's base URL (default $RL_COORDINATOR_URL, else the one in <run dir>/cluster.env)",
    )
    parser.add_argument(
        "--run-dir", type=Path, default=default_run_dir, help="a local cluster's run folder (default runs/latest)"
    )
    parser.add_argument("--json", action="store_true", help="print GET /v1/status as JSON, unformatted")


def main(args: argparse.Namespace) -> None:
    import httpx

    from cluster.join import cluster_trust, read_cluster_env
    from shared.api import StatusResponse

    url = coordinator_url(args.coordinator, args.run_dir)
    cluster = read_cluster_env(args.run_dir) if (args.run_dir / "cluster.env").exists() else {}
    try:
        verify = cluster_trust(cluster).verify()  # no token goes with it: plain http is fine anywhere
        response = httpx.get(url + "/v1/status", timeout=STATUS_TIMEOUT_S, verify=verify)
    except ValueError as exc:
        sys.exit(f"relay-rl status: {exc}")
    except httpx.HTTPError as exc:
        sys.exit(f"relay-rl status: cannot reach the coordinator at {url}: {exc}")
    if response.status_code != 200:
        sys.exit(f"relay-rl status: GET {url}/v1/status: HTTP {response.status_code}: {response.text[:200]}")
    if args.json:
        print(response.text)
        return
    from rich.console import Console

    Console().print(*render_status(StatusResponse.model_validate_json(response.content)))


def coordinator_url(explicit: str | None, run_dir: Path) -> str:
    """--coordinator / $RL_COORDINATOR_URL, else the local cluster's (exit with what to do if neither)."""
    if explicit:
        return explicit.rstrip("/")
    from cluster.join import read_cluster_env

    try:
        return read_cluster_env(run_dir)["RL_COORDINATOR_URL"].rstrip("/")
    except ValueError as exc:
        sys.exit(f"relay-rl status: no --coordinator and {exc}")


def render_status(status: StatusResponse) -> list[RenderableType]:
    """Two summary lines and the workers' table."""
    from rich.table import Table

    from shared.api import WorkerState

    learner = status.learner
    if learner is None:
        learner_line = "learner: not reported yet"
    else:
        learner_line = (
            f"learner {learner.status}: step {learner.learner_version}/{learner.num_steps_target}"
            f", published v{learner.published_version}, reward {learner.last_reward_mean:.3f}"
            f", busy {100 * learner.busy_fraction:.0f}%, dropped {sum(learner.num_dropped.values())}"
        )
    # every worker the coordinator knows, by state (the listing below is the live ones first, 50 at most)
    by_state = status.num_workers_by_state or Counter(worker.state.value for worker in status.workers)
    states = ", ".join(f"{count} {state}" for state, count in sorted(by_state.items())) or "none"
    depths = " ".join(f"{name} {depth}" for name, depth in sorted(status.stream_depths.items())) or "-"
    summary = (
        f"run {status.run_id} | staleness bound {status.staleness_bound} | cost ${status.cost_usd:.4f}\n"
        f"{learner_line}\n"
        f"workers: {states} | streams: {depths} | dead letters {status.num_dead_letters}"
    )
    table = Table("name", "id", "state", "version", "groups", "samples/s", "$/h", "gpu", "region", box=None)
    for worker in sorted(status.workers, key=lambda w: (w.state == WorkerState.DEAD, w.name)):
        table.add_row(
            worker.name,
            worker.worker_id[:12],
            worker.state.value,
            str(worker.policy_version),
            str(worker.num_groups_done),
            f"{worker.samples_per_s:.1f}",
            f"{worker.price_per_hour:.2f}",
            worker.gpu_type,
            worker.region,
        )
    return [summary, table]
