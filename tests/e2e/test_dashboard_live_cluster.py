"""A real local cluster (Redis, coordinator, reward, learner, 2 workers as processes): every service serves
parseable Prometheus metrics, and the coordinator's /dashboard renders in real headless Chromium
(Debian's `chromium`): the DOM shows the workers and the learner, and the screenshot is not blank."""

from __future__ import annotations

import io
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from cluster.local import ClusterOptions, LocalCluster
from tests.polling import wait_for

pytestmark = pytest.mark.e2e

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
RUN_TOML = """\
run_id = "dash"
[model]
init = "tiny-random"
max_position_embeddings = 32
[grpo]
group_size = 8
groups_per_step = 32
max_new_tokens = 2
[schedule]
staleness_bound = 2
num_steps = 2000
checkpoint_every = 50
eval_every = 1000
max_wall_s = 120
[broadcast]
chunk_size_bytes = 65536
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Up and training: the learner has taken a few steps, both workers hold weights and have reported
    their generation speed, and the control loop has taken a pass since."""
    root = tmp_path_factory.mktemp("dashboard")
    (root / "run.toml").write_text(RUN_TOML)
    cluster = LocalCluster(ClusterOptions(config_path=root / "run.toml", num_workers=2, runs_dir=root / "runs"))

    def get(path: str) -> dict:
        cluster.check_services_alive()
        return httpx.get(cluster.coordinator_url + path, timeout=5).json()

    def training() -> bool:
        status = get("/v1/status")  # read from Redis now, unlike /metrics (the control loop's last pass)
        workers = status["workers"]
        return (
            (status["learner"] or {}).get("learner_version", 0) >= 5
            and len(workers) == 2
            and all(w["policy_version"] >= 0 and w["tokens_per_s"] > 0 for w in workers)  # speed reported
        )

    def control_passes(num_passes: int) -> None:
        """Wait for `num_passes` more control-loop passes: the last began after this call, so the
        coordinator's pass-based views (/metrics, /dashboard) show what held before it."""
        seen = [get("/v1/activation")["planned_at_s"]]

        def newer_pass() -> bool:
            if (planned_at_s := get("/v1/activation")["planned_at_s"]) > seen[-1]:
                seen.append(planned_at_s)
            return len(seen) > num_passes

        wait_for(newer_pass, f"{num_passes} control-loop passes")

    try:
        cluster.start()
        wait_for(training, "the cluster training (learner version 5, both workers sampling)", timeout_s=90)
        control_passes(2)  # the first may have been under way already
        yield cluster
    finally:
        cluster.stop()


def scrape(url: str) -> dict[str, list]:
    response = httpx.get(url, timeout=5)
    assert response.status_code == 200, (url, response.status_code)
    return {family.name: family.samples for family in text_string_to_metric_families(response.text)}


def test_every_service_serves_parseable_prometheus_metrics(cluster: LocalCluster) -> None:
    assert set(cluster.metrics_urls) == {"reward", "learner", "worker-0", "worker-1"}
    learner = scrape(cluster.metrics_urls["learner"])
    assert learner["relayrl_learner_steps"][0].value >= 5
    assert {"relayrl_learner_idle_seconds", "relayrl_learner_trained_groups", "relayrl_learner_dropped_groups"} <= set(
        learner
    )
    assert {s.labels["lag"] for s in learner["relayrl_learner_trained_groups"]} <= {"0", "1", "2"}  # S = 2
    reward = scrape(cluster.metrics_urls["reward"])
    assert reward["relayrl_reward_scored_groups"][0].value > 0
    assert {s.labels["stream"] for s in reward["relayrl_stream_depth"]} == {"tasks", "rollouts", "scored", "dead"}
    for name in ("worker-0", "worker-1"):
        worker = scrape(cluster.metrics_urls[name])
        assert worker["relayrl_worker_tokens_per_second"][0].labels == {"worker": name}
        assert worker["relayrl_worker_groups"][0].value > 0
    coordinator = scrape(cluster.coordinator_url + "/metrics")
    tokens = {s.labels["name"]: s.value for s in coordinator["relayrl_fleet_worker_tokens_per_second"]}
    assert set(tokens) == {"worker-0", "worker-1"} and all(value > 0 for value in tokens.values())
    assert {s.labels["component"] for s in coordinator["relayrl_cost_usd"]} == {"learner", "workers"}
    assert coordinator["relayrl_learner_version"][0].value >= 5
    num_heartbeats = coordinator["relayrl_coordinator_fast_heartbeats"][0].value  # the workers' own heartbeats
    assert 0 < coordinator["relayrl_coordinator_heartbeat_script_calls"][0].value <= num_heartbeats


def chromium(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[bytes]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does it)")
    return subprocess.run([binary, *CHROMIUM_FLAGS, *args], capture_output=True, timeout=timeout_s, check=False)


def test_the_dashboard_renders_workers_learner_and_cost_in_headless_chromium(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    url = cluster.coordinator_url + "/dashboard"
    # virtual time lets the page's fetches and first render finish before the DOM is dumped
    dom = chromium(f"--user-data-dir={tmp_path / 'profile-dom'}", "--virtual-time-budget=8000", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    html = dom.stdout.decode()
    assert "worker-0" in html and "worker-1" in html
    assert 'class="badge state-active"' in html
    assert '<div id="error"></div>' in html  # no fetch failed
    assert 'id="learner-version">v' in html  # the learner's version was filled in
    assert "Relay tree" in html and ("<b>learner</b>" in html or "no relay plan" in html)
    assert "<rect" in html  # the staleness histogram has bars

    shot = tmp_path / "dashboard.png"
    result = chromium(
        f"--user-data-dir={tmp_path / 'profile-shot'}",
        "--virtual-time-budget=8000",
        "--window-size=1280,1000",
        f"--screenshot={shot}",
        url,
    )
    assert result.returncode == 0 and shot.exists(), result.stderr.decode(errors="replace")[-2000:]
    pixels = np.asarray(Image.open(io.BytesIO(shot.read_bytes())).convert("RGB"), dtype=np.float64)
    assert pixels.shape == (1000, 1280, 3)
    assert pixels.std() > 20, "the screenshot is (nearly) one colour"
    colours = {tuple(p) for p in pixels[::10, ::10].reshape(-1, 3).astype(int)}
    assert len(colours) > 20  # text, badges, bars and lines, not a blank page
