"""Where the time goes (shared/time_use.py): the verdict follows the numbers."""

from __future__ import annotations

from shared.time_use import WorkerTimeUse, percentile, time_use


def use(
    *,
    wait_s: float,
    gated_s: float = 0.0,
    sync_s: tuple[float, ...] = (0.1,),
    steps: int = 10,
    no_task_s: float = 5.0,
    synchronous: bool = False,
) -> str:
    result = time_use(
        learner_wall_s=100.0,
        learner_train_s=100.0 - wait_s,
        learner_wait_s=wait_s,
        num_steps=steps,
        workers=[WorkerTimeUse(generating_s=95.0 - gated_s, gated_s=gated_s, waiting_for_tasks_s=no_task_s)],
        weight_sync_s=sync_s,
        swap_pause_mean_s=0.01,
        stale_tokens_dropped=0,
        synchronous=synchronous,
    )
    assert result.verdict_line.startswith(result.verdict)
    return result.verdict


def test_a_learner_that_rarely_waits_bounds_the_run() -> None:
    assert use(wait_s=5.0) == "learner-bound"


def test_a_learner_waiting_on_fresh_weights_is_generation_bound() -> None:
    assert use(wait_s=40.0) == "generation-bound"


def test_workers_held_by_the_gate_or_slow_weights_in_a_sync_run_make_it_sync_bound() -> None:
    assert use(wait_s=40.0, gated_s=30.0) == "sync-bound"
    # T_train is 6 s a step here: a p95 T_bcast of 4 s is over half of it, and a pull run waits for it every step
    slow_weights = (0.1,) * 18 + (4.0, 4.0)
    assert use(wait_s=40.0, sync_s=slow_weights, synchronous=True) == "sync-bound"
    # an async run waits for weights only when the gate holds its workers: slow weights alone cost it nothing
    assert use(wait_s=40.0, sync_s=slow_weights) == "generation-bound"


def test_workers_out_of_tasks_make_an_async_run_feed_bound_but_not_a_sync_one() -> None:
    assert use(wait_s=40.0, no_task_s=30.0) == "feed-bound"
    # a pull run's workers wait for its learner by design
    assert use(wait_s=40.0, no_task_s=30.0, synchronous=True) == "generation-bound"


def test_too_early_before_three_steps_or_any_worker_time() -> None:
    assert use(wait_s=40.0, steps=2) == "too early"
    empty = time_use(
        learner_wall_s=10.0,
        learner_train_s=9.0,
        learner_wait_s=1.0,
        num_steps=5,
        workers=[],
        weight_sync_s=(),
        swap_pause_mean_s=None,
        stale_tokens_dropped=0,
    )
    assert empty.verdict == "too early" and empty.weight_sync_p95_s is None


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 0.95) == 19.0
    assert percentile(values, 0.5) == 10.0
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([], 0.95) is None
