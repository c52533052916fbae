"""The run report's broadcast section from the coordinator's broadcast times (broadcast_times.json, as the
local runner saves GET /v1/broadcast/times): T_bcast, what its window is, and the rollout pause."""

from __future__ import annotations

from pathlib import Path

from cluster.report import summarize_broadcast
from shared.api import BroadcastSplits, BroadcastTimesResponse


def splits(publish_s: float, transfer_s: float, pause_mean_s: float | None, num_paused: int) -> BroadcastSplits:
    return BroadcastSplits(
        publish_s=publish_s,
        transfer_s=transfer_s,
        ready_s=None,
        pause_mean_s=pause_mean_s,
        pause_max_s=pause_mean_s,
        num_paused=num_paused,
    )


def test_the_report_says_what_t_bcast_measures_and_carries_the_rollout_pause(tmp_path: Path) -> None:
    times = BroadcastTimesResponse(
        seconds_by_version={1: 0.3, 2: 0.5},
        num_versions=2,
        mean_s=0.4,
        max_s=0.5,
        last_s=0.5,
        window="learner publish start -> engine sampling with the version",
        splits_by_version={1: splits(0.1, 0.2, 0.05, 2), 2: splits(0.2, 0.3, None, 0)},
        pause_mean_s=0.05,
        pause_max_s=0.05,
    )
    (tmp_path / "broadcast_times.json").write_text(times.model_dump_json())
    section = summarize_broadcast(tmp_path)
    assert section.t_bcast_window == "learner publish start -> engine sampling with the version"
    assert (section.t_bcast_mean_s, section.t_bcast_publish_mean_s, section.t_bcast_transfer_mean_s) == (
        0.4,
        0.15,
        0.25,
    )
    assert (section.rollout_pause_mean_s, section.rollout_pause_max_s, section.rollout_pause_num_swaps) == (
        0.05,
        0.05,
        2,
    )


def test_broadcast_times_saved_by_an_older_coordinator_still_make_a_report(tmp_path: Path) -> None:
    old = '{"seconds_by_version": {"1": 0.25}, "num_versions": 1, "mean_s": 0.25, "max_s": 0.25, "last_s": 0.25}'
    (tmp_path / "broadcast_times.json").write_text(old)
    section = summarize_broadcast(tmp_path)
    assert section.t_bcast_mean_s == 0.25
    assert section.t_bcast_window == "learner announcement -> engine sampling with the version"
    assert (section.rollout_pause_mean_s, section.t_bcast_publish_mean_s) == (None, None)
