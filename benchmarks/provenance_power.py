"""Sampling provenance, measured: how often the keyed-sampling check (services/learner/provenance.py) fails
an honest group, and how often it catches each kind of deviation (docs/trust.md#sampling-provenance).

    python -m benchmarks.provenance_power --model-dir MODEL   # or: make bench-provenance MODEL=... (~15 min)

One process, no cluster. The auditor is the learner's: a `Policy` of the run file (configs/smollm2.toml:
float32 masters, bf16 compute), checking every group at the claimed version with `audit_rows`. Workers are
torch engines on the same folder, keyed with each task's seeds unless said otherwise:

- honest_bf16 / honest_fp32: the published weights in bf16 (what a bf16 engine holds) / float32;
- replayed: honest_bf16's tokens posted as the answer to another task of the same prompt (its seed differs);
  their log-probs are exact, so the log-prob checks pass them;
- cherry_picked: per sample, the best-rewarded of 4 draws (its own seed and 3 others), as a worker keeping
  its luckiest samples would;
- unkeyed: torch's own random sampling (a worker ignoring the keys);
- weights_<delta>: keyed, with weights w * (1 + delta * N(0, 1)) per element (another checkpoint or a fine-tune).

Per cell: the gap quantiles, the fraction of tokens past the tolerance, the fraction of groups failing, and
P(caught within 50 groups) when each group is audited with probability audit_fraction. Also the audit's
cost per group with provenance against the log-prob recomputation alone. Writes
benchmarks/results/provenance_power.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.sample_rows import sample_rows
from cluster.local import REPO_ROOT
from engines.interface import Sample, Sampling
from engines.torch_engine import TorchEngine
from services.learner.grpo import token_logprobs
from services.learner.policy import Policy
from services.learner.provenance import MAX_VIOLATION_FRACTION, MIN_VIOLATIONS, audit_rows, group_provenance
from shared.config import RunConfig, load_run_config
from shared.keyed_sampling import sample_seeds, task_seed
from shared.tasks import TaskAdapter, build_task

NUM_GROUPS_BUDGET = 50
NUM_CHERRY_DRAWS = 4
WEIGHT_DELTAS = (0.001, 0.01, 0.03)


def perturbed_state(model: torch.nn.Module, relative_noise: float, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter (a tied head once, with its embedding) times (1 + relative_noise * N(0, 1))."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor.detach().float() * (1 + relative_noise * torch.randn(tensor.shape, generator=generator))
        for name, tensor in model.named_parameters()
    }


def group_sampling(run: RunConfig) -> Sampling:
    """A worker's sampling of one of the run's tasks: a GRPO group at the run's length cap and temperature."""
    return Sampling(run.grpo.group_size, run.grpo.max_new_tokens, run.grpo.temperature)


def cherry_picked(
    engine: TorchEngine, task: TaskAdapter, prompts: list[Any], task_ids: list[str], run: RunConfig
) -> tuple[list[list[Sample]], float]:
    """Per sample slot, the best-rewarded of NUM_CHERRY_DRAWS draws (draw 0 with its own seed); returns the
    groups and the fraction of samples that are not the own-seed draw."""
    draws = [
        engine.generate(
            [p.input for p in prompts],
            group_sampling(run),
            sampling_seeds=[task_seed(task_id) + 7_919 * draw for task_id in task_ids],
        )
        for draw in range(NUM_CHERRY_DRAWS)
    ]
    groups, num_substituted = [], 0
    for index, prompt in enumerate(prompts):
        group = []
        for slot in range(run.grpo.group_size):
            candidates = [draws[draw][index][slot] for draw in range(NUM_CHERRY_DRAWS)]
            rewards = [task.score(c.text, prompt.reference) for c in candidates]
            best = max(range(NUM_CHERRY_DRAWS), key=lambda d: (rewards[d], d == 0))  # own draw wins ties
            num_substituted += best != 0
            group.append(candidates[best])
        groups.append(group)
    return groups, num_substituted / (len(prompts) * run.grpo.group_size)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.provenance_power", description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "smollm2.toml")
    parser.add_argument("--num-groups", type=int, default=24)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "provenance_power.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    run = load_run_config(args.config)
    trust = run.trust
    task = build_task(run.task)
    prompts = random.Random(0).sample(task.train_set, args.num_groups)
    task_ids = [f"task-{index}" for index in range(args.num_groups)]
    policy = Policy(args.model_dir, run)
    auditor_model = policy.model
    bf16 = TorchEngine(args.model_dir, dtype=torch.bfloat16)
    bf16.load_state_dict(auditor_model.state_dict(), 0)  # the published weights, rounded to bf16
    fp32 = TorchEngine(args.model_dir, dtype=torch.float32)
    fp32.load_state_dict(auditor_model.state_dict(), 0)
    pad_id = bf16.pad_token_id

    def keyed(engine: TorchEngine, ids: list[str]) -> list[list[Sample]]:
        return engine.generate(
            [p.input for p in prompts], group_sampling(run), sampling_seeds=[task_seed(task_id) for task_id in ids]
        )

    def audit(groups: list[list[Sample]], claimed_ids: list[str]) -> tuple[torch.Tensor, torch.Tensor, float]:
        batch = sample_rows(groups, pad_id)
        input_ids, attention_mask, completion_mask = batch.input_ids, batch.attention_mask, batch.completion_mask
        seeds = torch.tensor([s for task_id in claimed_ids for s in sample_seeds(task_id, run.grpo.group_size)])
        started_s = time.perf_counter()
        with torch.no_grad(), policy.precision.compute():
            _, gaps = audit_rows(
                auditor_model,  # type: ignore[arg-type]
                input_ids,
                attention_mask,
                torch.full((input_ids.shape[0],), run.grpo.temperature),
                completion_mask,
                seeds,
            )
        return gaps, completion_mask, (time.perf_counter() - started_s) / len(groups)

    def evaluate(kind: str, groups: list[list[Sample]], claimed_ids: list[str], **extra: Any) -> dict[str, Any]:
        gaps, completion_mask, audit_s = audit(groups, claimed_ids)
        size = run.grpo.group_size
        checks = [
            group_provenance(gaps[g * size : (g + 1) * size], completion_mask[g * size : (g + 1) * size], trust)
            for g in range(len(groups))
        ]
        token_gaps = gaps[completion_mask].float()
        failing = sum(c.failed for c in checks) / len(checks)
        audited_failing = failing * trust.audit_fraction
        row = {
            "kind": kind,
            "num_tokens": int(token_gaps.numel()),
            "gap_p99": float(token_gaps.quantile(0.99)),
            "gap_max": float(token_gaps.max()),
            "fraction_of_tokens_violating": float((token_gaps > trust.provenance_tolerance).float().mean()),
            "fraction_of_groups_failing": failing,
            "p_caught_within_50_groups": 1 - (1 - audited_failing) ** NUM_GROUPS_BUDGET,
            "audit_s_per_group": audit_s,
            **extra,
        }
        print(json.dumps(row), flush=True)
        return row

    started_s = time.monotonic()
    honest_bf16 = keyed(bf16, task_ids)
    rows = [evaluate("honest_bf16", honest_bf16, task_ids)]
    rows.append(evaluate("honest_fp32", keyed(fp32, task_ids), task_ids))
    rows.append(evaluate("replayed", honest_bf16, [f"{task_id}-replay" for task_id in task_ids]))
    picked, substituted = cherry_picked(bf16, task, prompts, task_ids, run)
    rows.append(evaluate("cherry_picked", picked, task_ids, fraction_of_samples_substituted=substituted))
    unkeyed = bf16.generate([p.input for p in prompts], group_sampling(run))
    rows.append(evaluate("unkeyed", unkeyed, task_ids))
    for delta in WEIGHT_DELTAS:
        deviant = copy.deepcopy(bf16)
        deviant.load_state_dict(perturbed_state(auditor_model, delta, seed=3), 0)
        rows.append(evaluate(f"weights_{delta:g}", keyed(deviant, task_ids), task_ids, delta=delta))

    # the audit's cost: log-probs alone (what it computed before provenance) vs log-probs and gaps
    honest_rows = sample_rows(honest_bf16, pad_id)
    input_ids, attention_mask = honest_rows.input_ids, honest_rows.attention_mask
    temperatures = torch.full((input_ids.shape[0],), run.grpo.temperature)
    with torch.no_grad(), policy.precision.compute():
        timed_s = time.perf_counter()
        token_logprobs(auditor_model, input_ids, attention_mask, temperatures, chunk_tokens=1024)  # type: ignore[arg-type]
        logprobs_only_s = (time.perf_counter() - timed_s) / len(honest_bf16)
    with_provenance_s = evaluate("honest_bf16_timing", honest_bf16, task_ids)["audit_s_per_group"]
    result = {
        "command": f"python -m benchmarks.provenance_power --model-dir {args.model_dir} --config {args.config.name} "
        f"--num-groups {args.num_groups}",
        "date": time.strftime("%Y-%m-%d"),
        "model_dir": str(args.model_dir),
        "precision": policy.precision.mode,
        "num_groups": args.num_groups,
        "group_size": run.grpo.group_size,
        "max_new_tokens": run.grpo.max_new_tokens,
        "temperature": run.grpo.temperature,
        "provenance_tolerance": trust.provenance_tolerance,
        "provenance_max_violation_fraction": MAX_VIOLATION_FRACTION,
        "provenance_min_violations": MIN_VIOLATIONS,
        "audit_fraction": trust.audit_fraction,
        "audit_s_per_group_logprobs_only": logprobs_only_s,
        "audit_s_per_group_with_provenance": with_provenance_s,
        "wall_s": time.monotonic() - started_s,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
