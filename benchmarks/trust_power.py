"""Detection power of the exact checks: the smallest deviation from the published policy that a worker can
make and still be caught within 50 of its groups (docs/trust.md#detection-power).

    python -m benchmarks.trust_power --model-dir MODEL   # or: make bench-trust-power MODEL=... (~10 min)

One process, no cluster. The learner is a mixed-precision `Policy` (float32 masters, bf16 compute) on the
model folder; the honest worker is a bf16 copy of it (every operation rounded, as a bf16 engine). Prompts
are the run file's task (benchmarks/trust_bf16.toml: chat-templated chain sums), sampled once with the
honest bf16 torch engine. A deviating worker reports its own policy's log-probs of those tokens:

- temperature: it samples at (1 + delta) x the run's temperature and reports those log-probs;
- weights: its weights are the published ones times (1 + delta * N(0, 1)) per element (another
  checkpoint, a coarser quantisation, a fine-tune of its own).

Per delta, each group's exact difference (mean |log mu - log pi| over its tokens, as at lag 0) is compared
with the tolerance the learner measures (services/learner/numerics.py, on the honest groups' rows), and the
worker's score (services/learner/trust.py TrustTracker, the run file's [trust]) is replayed over 50 groups
drawn from them, 2,000 times: P(suspect within 50) at lag 0 (every group checked) and for lag >= 1 groups
(audited with probability audit_fraction; unchecked groups face the band). The tokens are the honest
policy's, not the deviating one's: the statistic is the same function of both log-probs, so this bounds
the check's power on its own. Writes benchmarks/results/trust_power.json.
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
from services.learner.batch import TrainBatch
from services.learner.grpo import token_logprobs
from services.learner.numerics import NUMERICS_WINDOW_STEPS, NumericsReference
from services.learner.policy import Policy
from services.learner.trust import TrustTracker, group_abs_diffs
from shared.config import RunConfig, load_run_config
from shared.tasks import build_task

NUM_GROUPS_BUDGET = 50  # "caught within 50 of its groups"
NUM_REPLAYS = 2000
TEMPERATURE_DELTAS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
WEIGHT_DELTAS = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1)


def sample_batch(model_dir: Path, run: RunConfig, num_groups: int, seed: int) -> tuple[TrainBatch, list[int]]:
    """num_groups groups of run.grpo.group_size samples from the bf16 torch engine on the run's prompts,
    as a TrainBatch (behaviour log-probs: the honest engine's) and the group sizes."""
    from engines.interface import Sampling
    from engines.torch_engine import TorchEngine

    task = build_task(run.task)
    prompts = random.Random(seed).sample(task.train_set, num_groups)
    engine = TorchEngine(model_dir, dtype=torch.bfloat16)  # the published (bf16) weights, as a worker holds them
    torch.manual_seed(seed)
    groups = engine.generate(
        [p.input for p in prompts], Sampling(run.grpo.group_size, run.grpo.max_new_tokens, run.grpo.temperature)
    )
    rows = sample_rows(groups, engine.pad_token_id)
    num_rows = rows.input_ids.shape[0]
    batch = TrainBatch(
        input_ids=rows.input_ids,
        attention_mask=rows.attention_mask,
        completion_mask=rows.completion_mask,
        behaviour_logprobs=rows.behaviour_logprobs,
        advantages=torch.zeros((num_rows, 1)),
        temperatures=torch.full((num_rows,), run.grpo.temperature),
        rewards=torch.zeros(num_rows),
    )
    return batch, [run.grpo.group_size] * num_groups


def worker_logprobs(model: torch.nn.Module, batch: TrainBatch, temperature_scale: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        return token_logprobs(
            model,  # type: ignore[arg-type]
            batch.input_ids,
            batch.attention_mask,
            batch.temperatures * temperature_scale,
            chunk_tokens=1024,
        )


def perturbed(model: torch.nn.Module, relative_noise: float, seed: int) -> torch.nn.Module:
    """A bf16 copy of `model` whose every weight is w * (1 + relative_noise * N(0, 1))."""
    copied = copy.deepcopy(model).float()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in copied.parameters():
            parameter.mul_(1 + relative_noise * torch.randn(parameter.shape, generator=generator))
    return copied.to(torch.bfloat16).eval()


def p_suspect(diffs: list[float], tolerance: float, lag: int, run: RunConfig, seed: int) -> float:
    """P(the worker's score reaches quarantine within NUM_GROUPS_BUDGET groups), replaying the tracker
    over groups drawn with replacement from `diffs` (their exact differences; for lag >= 1 a group is
    audited with probability audit_fraction, else it faces the band with the same statistic)."""
    rng = random.Random(seed)
    caught = 0
    for _ in range(NUM_REPLAYS):
        tracker = TrustTracker(run.trust)
        for _ in range(NUM_GROUPS_BUDGET):
            diff = rng.choice(diffs)
            checked = lag == 0 or rng.random() < run.trust.audit_fraction
            tracker.observe("w", lag, diff, diff if checked else None, tolerance)
            if tracker.scores["w"].suspect:
                caught += 1
                break
    return caught / NUM_REPLAYS


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trust_power", description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "benchmarks" / "trust_bf16.toml")
    parser.add_argument("--num-groups", type=int, default=48, help="groups sampled (each delta re-scores them)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "trust_power.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    run = load_run_config(args.config)
    policy = Policy(args.model_dir, run)
    started_s = time.monotonic()
    batch, group_sizes = sample_batch(args.model_dir, run, args.num_groups, seed=0)
    print(f"sampled {args.num_groups} groups in {time.monotonic() - started_s:.0f} s", flush=True)
    with torch.no_grad(), policy.precision.compute():
        learner = worker_logprobs(policy.model, batch)  # pi as the learner computes it (lag 0: pi_v)
    numerics = NumericsReference(run.trust, seed=0)
    for _ in range(NUMERICS_WINDOW_STEPS):
        numerics.measure(policy.model, batch)
    tolerance = numerics.tolerance_nats
    honest_engine = copy.deepcopy(policy.model).to(torch.bfloat16).eval()
    engine_diffs = [
        d for _, d in group_abs_diffs(learner, batch.behaviour_logprobs, batch.completion_mask, group_sizes)
    ]

    def evaluate(kind: str, delta: float, mu: torch.Tensor) -> dict[str, Any]:
        diffs = [d for _, d in group_abs_diffs(learner, mu, batch.completion_mask, group_sizes)]
        row = {
            "kind": kind,
            "delta": delta,
            "group_diff_median": sorted(diffs)[len(diffs) // 2],
            "group_diff_max": max(diffs),
            "fraction_of_groups_failing": sum(d > tolerance for d in diffs) / len(diffs),
            "p_suspect_within_50_lag0": p_suspect(diffs, tolerance, 0, run, seed=1),
            "p_suspect_within_50_lag1_audited": p_suspect(diffs, tolerance, 1, run, seed=2),
        }
        print(json.dumps(row), flush=True)
        return row

    rows = [
        evaluate("temperature", delta, worker_logprobs(honest_engine, batch, 1 + delta)) for delta in TEMPERATURE_DELTAS
    ]
    rows += [
        evaluate("weights", delta, worker_logprobs(perturbed(policy.model, delta, seed=3), batch))
        for delta in WEIGHT_DELTAS
    ]

    def smallest_caught(kind: str, key: str) -> float | None:
        return next((r["delta"] for r in rows if r["kind"] == kind and r["delta"] > 0 and r[key] >= 0.95), None)

    result = {
        "command": f"python -m benchmarks.trust_power --model-dir {args.model_dir} --config {args.config.name}",
        "date": time.strftime("%Y-%m-%d"),
        "model_dir": str(args.model_dir),
        "precision": policy.precision.mode,
        "num_groups": args.num_groups,
        "group_size": run.grpo.group_size,
        "num_completion_tokens": int(batch.completion_mask.sum()),
        "tolerance_nats": tolerance,
        "numerics_reference_nats": list(numerics.references_nats),
        "sampling_engine_group_diffs": {
            "median": sorted(engine_diffs)[len(engine_diffs) // 2],
            "max": max(engine_diffs),
        },
        "rows": rows,
        "smallest_caught_within_50": {
            f"{kind}_{lag}": smallest_caught(kind, f"p_suspect_within_50_{lag}")
            for kind in ("temperature", "weights")
            for lag in ("lag0", "lag1_audited")
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
