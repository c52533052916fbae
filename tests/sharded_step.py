"""Learner steps through `Policy` on fixed batches, on one process or as one rank of a torchrun job:

    python -m torch.distributed.run --standalone --nproc-per-node=2 -m tests.sharded_step MODEL_DIR OUT_DIR [--precision mixed]

Rank 0 writes OUT_DIR/result.json (per step: loss, grad norm, clip fraction, the pi_prox sum), the
published version's bytes (weights.safetensors: serialize_weights of Policy.weights()) and the
checkpoint state (checkpoint.pt). tests/integration/test_distributed_learner.py runs the same steps in
its own process and compares.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from services.learner.batch import TrainBatch
from services.learner.distributed import RankGroup, init_ranks, teardown
from services.learner.policy import Policy
from services.learner.publish import serialize_weights
from shared.config import GRPOConfig, LearnerConfig, RunConfig

# 7 rows in groups of 2, 2 and 3: two ranks get 4 and 3 rows (one padding row), two minibatches of whole
# groups, micro-batches of 2 rows: every path of the sharded step (pi_prox gathered, padding, several
# micro-batches and updates) runs.
GROUP_SIZES = [2, 2, 3]
RUN = RunConfig(
    run_id="sharded-step",
    grpo=GRPOConfig(group_size=2, groups_per_step=3, num_minibatches=2, learning_rate=1e-3),
    learner=LearnerConfig(device="cpu", precision="fp32", micro_batch_size=2, logprob_chunk_tokens=16),
)
NUM_STEPS = 2


def fixed_batch(vocab_size: int, seed: int, num_positions: int = 12) -> TrainBatch:
    """Right-padded rows of different lengths, prompts of 3 tokens, random advantages and behaviour."""
    num_rows = sum(GROUP_SIZES)
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, num_positions + 1, (num_rows,), generator=generator)
    lengths[0] = num_positions
    attention_mask = (torch.arange(num_positions)[None, :] < lengths[:, None]).long()
    input_ids = torch.randint(3, vocab_size, (num_rows, num_positions), generator=generator) * attention_mask
    completion_mask = torch.zeros((num_rows, num_positions - 1), dtype=torch.bool)
    for i, length in enumerate(lengths.tolist()):
        completion_mask[i, 2 : length - 1] = True
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        completion_mask=completion_mask,
        behaviour_logprobs=-torch.rand((num_rows, num_positions - 1), generator=generator) * 3 * completion_mask,
        advantages=torch.randn((num_rows, 1), generator=generator),
        temperatures=torch.rand((num_rows,), generator=generator) + 0.5,
        rewards=torch.rand((num_rows,), generator=generator),
    )


def run_in_precision(precision: str) -> RunConfig:
    return RUN.model_copy(update={"learner": RUN.learner.model_copy(update={"precision": precision})})


def run_steps(model_dir: Path, out_dir: Path, ranks: RankGroup, precision: str = "fp32") -> None:
    policy = Policy(model_dir, run_in_precision(precision), ranks)
    if not ranks.is_leader:
        policy.follow()
        return
    steps = []
    for step in range(NUM_STEPS):
        result = policy.train_step(fixed_batch(policy.config.vocab_size, seed=step), GROUP_SIZES, shuffle_seed=step)
        steps.append(
            {
                "loss": result.diagnostics.loss,
                "grad_norm": result.diagnostics.grad_norm,
                "clip_fraction": result.diagnostics.clip_fraction,
                "proximal_sum": float(result.logprobs.double().sum()),
            }
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "weights.safetensors").write_bytes(serialize_weights(policy.weights()))
    model_state, optimizer_state = policy.checkpoint_state()
    torch.save((model_state, optimizer_state), out_dir / "checkpoint.pt")
    master_dtypes = sorted({str(tensor.dtype) for tensor in model_state.values()})
    result = {"world_size": ranks.world_size, "steps": steps, "master_dtypes": master_dtypes}
    (out_dir / "result.json").write_text(json.dumps(result))
    policy.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "mixed", "bf16"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    ranks = init_ranks("cpu")
    try:
        run_steps(args.model_dir, args.out_dir, ranks, args.precision)
    finally:
        teardown(ranks)


if __name__ == "__main__":
    main()
