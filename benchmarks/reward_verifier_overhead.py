"""Cost of scoring a group in the verifier's child process against scoring it in the reward service's
own process, on the demo task (arithmetic_mod10, groups of 8 two-token completions as configs/demo.toml
samples them), plus the cost of decoding the group's token ids.

    python -m benchmarks.reward_verifier_overhead            # --num-groups 2000 --repeats 5

in-process   [task.score(text, reference) for text in texts]: what the service did before
pool         VerifierPool.score(texts, reference): one round trip per group to the reused child process
decode       CompletionDecoder.decode(group): the token checks and the `tokenizers` decode of 8 samples

Groups alternate old / new within each repeat; the median per-group time over repeats is reported.
Writes benchmarks/results/reward_verifier_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.result_file import write_result
from services.reward.decode import CompletionDecoder
from shared.config import TaskConfig
from shared.messages import RolloutGroup, pack_float32, pack_int32
from shared.tasks.arithmetic import ArithmeticMod10Task
from shared.verifier_pool import VerifierPool

RESULTS = Path(__file__).resolve().parent / "results" / "reward_verifier_overhead.json"
GROUP_SIZE = 8


def demo_groups(num_groups: int, tokenizer_dir: Path) -> list[tuple[RolloutGroup, str]]:
    """Groups of GROUP_SIZE completions of one or two digits (the demo's max_new_tokens 2), with references."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eos_id = tokenizer.token_to_id("<eos>")
    rng = random.Random(0)
    groups = []
    for index in range(num_groups):
        texts = [str(rng.randrange(10)) * rng.choice([1, 2]) for _ in range(GROUP_SIZE)]
        samples = [tokenizer.encode(t, add_special_tokens=False).ids + ([eos_id] if len(t) == 1 else []) for t in texts]
        token_ids = [token for sample in samples for token in sample]
        group = RolloutGroup(
            run_id="bench", group_id=str(index), task_id=str(index), task_name="arithmetic_mod10", prompt="1+2=",
            worker_id="w", policy_version=0, temperature=1.0, prompt_token_ids=pack_int32(tokenizer.encode("1+2=").ids),
            completion_token_ids=pack_int32(token_ids), completion_lengths=pack_int32([len(s) for s in samples]),
            behaviour_logprobs=pack_float32([-1.0] * len(token_ids)), completion_texts=texts,
            finish_reasons=["stop" if len(t) == 1 else "length" for t in texts], generation_s=0.0,
        )  # fmt: skip
        groups.append((group, str(rng.randrange(10))))
    return groups


def per_group_s(function: Callable[[RolloutGroup, str], object], groups: list[tuple[RolloutGroup, str]]) -> float:
    started = time.perf_counter()
    for group, reference in groups:
        function(group, reference)
    return (time.perf_counter() - started) / len(groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-groups", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from services.learner.model_init import build_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        tokenizer_dir = Path(folder)
        build_tokenizer(ArithmeticMod10Task.alphabet, tokenizer_dir)
        groups = demo_groups(args.num_groups, tokenizer_dir)
        decoder = CompletionDecoder(tokenizer_dir, max_new_tokens=2)
        task = ArithmeticMod10Task(num_eval_prompts=20, seed=0)
        pool = VerifierPool(TaskConfig(name="arithmetic_mod10"), timeout_s=5.0).start()
        try:
            timings: dict[str, list[float]] = {"in_process": [], "pool": [], "decode": []}
            for _ in range(args.repeats):
                timings["in_process"].append(
                    per_group_s(lambda g, r: [task.score(t, r) for t in g.completion_texts], groups)
                )
                timings["pool"].append(per_group_s(lambda g, r: pool.score(g.completion_texts, r), groups))
                timings["decode"].append(per_group_s(lambda g, r: decoder.decode(g), groups))
        finally:
            pool.close()
    median_us = {name: 1e6 * statistics.median(values) for name, values in timings.items()}
    result = {
        "command": "python -m benchmarks.reward_verifier_overhead "
        f"--num-groups {args.num_groups} --repeats {args.repeats}",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_1m": round(os.getloadavg()[0], 2),  # other jobs on the machine inflate every figure
        "group_size": GROUP_SIZE,
        "median_per_group_us": {name: round(value, 1) for name, value in median_us.items()},
        "pool_overhead_per_group_us": round(median_us["pool"] - median_us["in_process"], 1),
        "all_repeats_per_group_us": {name: [round(1e6 * v, 1) for v in values] for name, values in timings.items()},
    }
    write_result(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
