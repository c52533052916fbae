"""`relay-rl demo`'s progress bar: learner steps out of the run's num_steps, with the reward, read from the
coordinator's GET /v1/status while cluster.local runs in the foreground (its own progress lines and logs
print above the bar). Only on a terminal; piped output keeps cluster.local's plain lines alone.

The coordinator is found in <runs dir>/latest/cluster.env once the runner has written one newer than the
start of this command (an older one belongs to a finished run)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.api import StatusResponse
    from shared.tls import Verify

POLL_INTERVAL_S = 1.0


@contextlib.contextmanager
def demo_progress_bar(runs_dir: Path) -> Iterator[None]:
    """A progress bar following the run the block starts; nothing when stdout is not a terminal."""
    if not sys.stdout.isatty():
        yield
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    stop = threading.Event()
    with Progress(
        TextColumn("[bold]learner steps"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(),
    ) as progress:  # fmt: skip
        task = progress.add_task("starting the cluster ...", total=None)

        def follow() -> None:
            for url, verify in coordinator_urls(runs_dir / "latest" / "cluster.env", time.time(), stop):
                status = fetch_status(url, verify)
                if status is not None and status.learner is not None:
                    learner = status.learner
                    progress.update(
                        task,
                        total=learner.num_steps_target,
                        completed=learner.learner_version,
                        description=f"reward {learner.last_reward_mean:.2f}",
                    )

        thread = threading.Thread(target=follow, name="demo-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5.0)


def coordinator_urls(cluster_env: Path, started_at_s: float, stop: threading.Event) -> Iterator[tuple[str, Verify]]:
    """The coordinator URL of the run started after `started_at_s` and how to verify it (its run CA with --tls),
    once per poll interval, until `stop`."""
    from cluster.join import read_cluster_env
    from shared.tls import CoordinatorTrust

    found: tuple[str, Verify] | None = None
    while not stop.wait(POLL_INTERVAL_S):
        if found is None:
            if cluster_env.exists() and cluster_env.stat().st_mtime >= started_at_s:
                cluster = read_cluster_env(cluster_env.parent)
                found = cluster["RL_COORDINATOR_URL"], CoordinatorTrust.from_env(cluster).verify()
            continue
        yield found


def fetch_status(url: str, verify: Verify = True) -> StatusResponse | None:
    import httpx

    from shared.api import StatusResponse

    try:
        response = httpx.get(url + "/v1/status", timeout=2.0, verify=verify)
    except httpx.HTTPError:
        return None  # starting or stopping: the next poll tries again
    return StatusResponse.model_validate_json(response.content) if response.status_code == 200 else None
