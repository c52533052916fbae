"""benchmarks/continuous_cluster.py: a worker's decoding window read from its real /metrics text, and a
cell's run file."""

from __future__ import annotations

from prometheus_client import generate_latest

from benchmarks.continuous_cluster import Cell, worker_windows
from services.rollout.prometheus import BatchOccupancy, SwapPauses, rollout_families
from shared.api import HeartbeatRequest
from shared.config import RunConfig
from shared.metrics import CallbackCollector, new_registry


def metrics_text(occupancy: BatchOccupancy, pauses: SwapPauses) -> str:
    collector = CallbackCollector(lambda: rollout_families("worker-0", HeartbeatRequest(), pauses, occupancy))
    return generate_latest(new_registry(collector)).decode()


def test_the_window_runs_from_the_first_decoded_token_to_the_last_scrape() -> None:
    occupancy, pauses = BatchOccupancy(), SwapPauses()
    scrapes = [(100.0, "worker-0", metrics_text(occupancy, pauses))]  # loading: nothing decoded yet
    occupancy.observe(num_tokens=50, num_places=100)
    scrapes.append((101.0, "worker-0", metrics_text(occupancy, pauses)))
    occupancy.observe(num_tokens=300, num_places=400)
    pauses.observe(0.02)
    pauses.extend_last(0.06)
    scrapes.append((103.0, "worker-0", metrics_text(occupancy, pauses)))

    (window,) = worker_windows(scrapes)

    assert window.window_s == 2.0 and window.num_tokens == 300 and window.num_places == 400
    assert window.tokens_per_s == 150.0 and window.occupancy == 0.75
    assert window.num_swaps == 1 and abs(window.swap_pause_s_max - 0.08) < 1e-9


def test_a_cell_sets_the_mode_the_bound_and_equal_batch_capacity() -> None:
    raw = Cell("long-tail", "torch", 1, "continuous-per-token").run_file()
    run = RunConfig.model_validate(raw)
    assert (run.rollout.batching, run.schedule.admission, run.schedule.staleness_bound) == (
        "continuous",
        "per_token",
        1,
    )
    assert run.rollout.continuous_max_rows == 16 * run.grpo.group_size
