"""PPO minibatches on the demo task, in one process: does splitting each batch into several optimizer
updates (`[grpo] num_minibatches`) learn faster per learner step than the single update?

    python -m benchmarks.ppo_minibatches                  # or: make bench-ppo (~20 min on 2 shared cores)
    python -m benchmarks.ppo_minibatches --steps 50 --seeds 0 --num-minibatches 1 4   # a quick look

Each run is the demo's learner without the cluster: configs/demo.toml's tiny random Qwen2 and task
(a+b= -> (a+b) mod 10, 20 held-out prompts), its [grpo] section (64 groups x 8 samples, lr 1e-3) with
only num_minibatches (and ppo_epochs) changed. Every step samples the batch with the workers' engine
(engines.torch_engine.TorchEngine) holding the weights of version t - lag (lag 0: on-policy; the
demo's S = 2 cluster trains mostly at lag 1-2), scores it with the task's verifier, tensorizes it as
the learner does and takes services.learner.trainer.train_step. Equal learner steps for every setting
(one published version per step, whatever the number of updates). One torch thread.

Reported per run: train reward over the first and last 10 steps, held-out greedy accuracy before and
after (and every --eval-every steps), the first step whose 10-step mean reward reaches 0.8, mean
train_s per step (the learner's step only, not sampling), mean clip_fraction and ess_fraction; and
per setting the mean and spread over seeds. Also the cost alone: train_s of one step on the same demo
batch for each num_minibatches, interleaved (`train_s_same_batch`; the per-run train_s moves with the
machine's load). Writes benchmarks/results/ppo_minibatches.json after every run and resumes from it:
runs it already holds (same setting, lag, seed and steps) are kept, `--fresh` redoes them.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engines.interface import InferenceEngine, Sampling
from engines.torch_engine import TorchEngine
from services.learner.batch import tensorize
from services.learner.evaluate import evaluate_greedy
from services.learner.model_init import build_initial_policy
from services.learner.trainer import load_policy, make_optimizer, train_step
from shared.config import GRPOConfig, load_run_config
from shared.messages import RolloutGroup, ScoredGroup, pack_float32, pack_int32
from shared.tasks import TaskAdapter, TaskPrompt, make_task, task_type

RESULTS = Path("benchmarks/results/ppo_minibatches.json")
REACH_REWARD = 0.8


@dataclass
class RunResult:
    num_minibatches: int
    ppo_epochs: int
    lag: int
    seed: int
    rewards: list[float] = field(default_factory=list)  # train reward mean per step
    accuracy_by_step: dict[int, float] = field(default_factory=dict)  # held-out greedy accuracy
    train_s: list[float] = field(default_factory=list)
    clip_fraction: list[float] = field(default_factory=list)
    ess_fraction: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict[str, object]:
        rolling = [statistics.fmean(self.rewards[max(0, i - 9) : i + 1]) for i in range(len(self.rewards))]
        reached = [i + 1 for i, value in enumerate(rolling) if i >= 9 and value >= REACH_REWARD]
        return {
            "num_minibatches": self.num_minibatches,
            "ppo_epochs": self.ppo_epochs,
            "lag": self.lag,
            "seed": self.seed,
            "reward_first10": round(statistics.fmean(self.rewards[:10]), 4),
            "reward_last10": round(statistics.fmean(self.rewards[-10:]), 4),
            "heldout_before": self.accuracy_by_step[0],
            "heldout_after": self.accuracy_by_step[len(self.rewards)],
            "heldout_by_step": {str(step): value for step, value in sorted(self.accuracy_by_step.items())},
            "steps_to_reward_0.8": reached[0] if reached else None,
            "train_s_per_step": round(statistics.fmean(self.train_s), 4),
            "clip_fraction_mean": round(statistics.fmean(self.clip_fraction), 4),
            "ess_fraction_mean": round(statistics.fmean(self.ess_fraction), 4),
            "wall_s": round(self.wall_s, 1),
            "reward_by_step": [round(value, 3) for value in self.rewards],
        }


def train(
    policy_dir: Path,
    config_path: Path,
    num_minibatches: int,
    ppo_epochs: int,
    lag: int,
    seed: int,
    args: argparse.Namespace,
) -> RunResult:
    run = load_run_config(config_path)
    grpo = GRPOConfig.model_validate(
        {**run.grpo.model_dump(), "num_minibatches": num_minibatches, "ppo_epochs": ppo_epochs}
    )
    task = make_task(run.task.name, num_eval_prompts=run.task.num_eval_prompts, seed=run.task.seed)
    torch.manual_seed(seed)
    model, tokenizer = load_policy(policy_dir)
    optimizer = make_optimizer(model, grpo)
    engine = TorchEngine(policy_dir)
    snapshots: collections.deque[dict[str, torch.Tensor]] = collections.deque(maxlen=lag + 1)
    prompt_rng = torch.Generator().manual_seed(seed)
    result = RunResult(num_minibatches, ppo_epochs, lag, seed)
    started_s = time.perf_counter()

    def evaluate(step: int) -> None:
        engine.load_state_dict(model.state_dict(), policy_version=step)
        result.accuracy_by_step[step] = evaluate_greedy(engine, task, max_new_tokens=grpo.max_new_tokens).accuracy

    evaluate(0)
    for step in range(args.steps):
        snapshots.append({name: tensor.detach().clone() for name, tensor in model.state_dict().items()})
        behaviour_version = max(0, step - lag)
        engine.load_state_dict(snapshots[0], policy_version=behaviour_version)  # the oldest kept: version t - lag
        picks = torch.randint(len(task.train_set), (grpo.groups_per_step,), generator=prompt_rng).tolist()
        prompts = [task.train_set[index] for index in picks]
        groups = sample_groups(engine, task, prompts, grpo, behaviour_version)
        batch = tensorize(groups, engine.pad_token_id, grpo.normalize_advantage_by_std)
        step_result = train_step(
            model,
            optimizer,
            batch,
            grpo,
            group_sizes=[group.rollout.num_samples for group in groups],
            shuffle_seed=step,
        )
        result.rewards.append(float(batch.rewards.mean()))
        result.train_s.append(step_result.train_s)
        result.clip_fraction.append(step_result.diagnostics.clip_fraction)
        result.ess_fraction.append(step_result.diagnostics.ess_fraction)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            evaluate(step + 1)
    result.wall_s = time.perf_counter() - started_s
    return result


def sample_groups(
    engine: InferenceEngine, task: TaskAdapter, prompts: list[TaskPrompt], grpo: GRPOConfig, policy_version: int
) -> list[ScoredGroup]:
    """What a rollout worker and the reward service would send: one scored group per prompt."""
    sampling = Sampling(grpo.group_size, grpo.max_new_tokens, grpo.temperature)
    samples = engine.generate([item.input for item in prompts], sampling)
    groups = []
    for item, group in zip(prompts, samples, strict=True):
        rollout = RolloutGroup(
            run_id="bench-ppo",
            group_id=uuid.uuid4().hex,
            task_id=uuid.uuid4().hex,
            task_name=task.name,
            prompt=item.prompt,
            worker_id="bench",
            policy_version=policy_version,
            temperature=grpo.temperature,
            prompt_token_ids=pack_int32(group[0].prompt_token_ids),
            completion_token_ids=pack_int32([token for sample in group for token in sample.token_ids]),
            completion_lengths=pack_int32([sample.num_tokens for sample in group]),
            behaviour_logprobs=pack_float32([logprob for sample in group for logprob in sample.logprobs]),
            completion_texts=[sample.text for sample in group],
            finish_reasons=[sample.finish_reason for sample in group],
            generation_s=0.0,
        )
        rewards = [task.score(sample.text, item.reference) for sample in group]
        groups.append(ScoredGroup(run_id="bench-ppo", rollout=rollout, rewards=rewards))
    return groups


def settings_summary(runs: list[dict[str, object]]) -> list[dict[str, object]]:
    """Per (num_minibatches, ppo_epochs, lag): mean and min..max over seeds."""
    keyed: dict[tuple[object, ...], list[dict[str, object]]] = collections.defaultdict(list)
    for run in runs:
        keyed[(run["num_minibatches"], run["ppo_epochs"], run["lag"])].append(run)
    rows = []
    for (num_minibatches, ppo_epochs, lag), group in sorted(keyed.items(), key=lambda item: str(item[0])):
        row: dict[str, object] = {"num_minibatches": num_minibatches, "ppo_epochs": ppo_epochs, "lag": lag}
        row["num_seeds"] = len(group)
        for name in ("reward_last10", "heldout_after", "train_s_per_step", "clip_fraction_mean", "ess_fraction_mean"):
            values = [float(run[name]) for run in group]  # type: ignore[arg-type]
            row[name] = round(statistics.fmean(values), 4)
            row[f"{name}_range"] = [round(min(values), 4), round(max(values), 4)]
        row["steps_to_reward_0.8"] = [run["steps_to_reward_0.8"] for run in group]
        rows.append(row)
    return rows


def time_train_step(policy_dir: Path, config_path: Path, settings: list[int], repeats: int) -> dict[str, object]:
    """train_s of one learner step per num_minibatches on one demo batch (sampled by the initial policy),
    the settings interleaved round after round so a load change on the machine hits them all alike;
    the first round warms up and is not counted. Each timed step starts from the initial weights."""
    run = load_run_config(config_path)
    task = make_task(run.task.name, num_eval_prompts=run.task.num_eval_prompts, seed=run.task.seed)
    torch.manual_seed(0)
    engine = TorchEngine(policy_dir)
    prompts = [task.train_set[index % len(task.train_set)] for index in range(run.grpo.groups_per_step)]
    groups = sample_groups(engine, task, prompts, run.grpo, policy_version=0)
    batch = tensorize(groups, engine.pad_token_id, run.grpo.normalize_advantage_by_std)
    start_model, _ = load_policy(policy_dir)
    wall_s: dict[int, list[float]] = collections.defaultdict(list)
    cpu_s: dict[int, list[float]] = collections.defaultdict(list)
    for repeat in range(repeats + 1):
        for num_minibatches in settings:
            grpo = GRPOConfig.model_validate({**run.grpo.model_dump(), "num_minibatches": num_minibatches})
            model = copy.deepcopy(start_model)
            optimizer = make_optimizer(model, grpo)
            cpu_started_s = time.thread_time()  # one torch thread: the step's work runs on this thread
            result = train_step(model, optimizer, batch, grpo, shuffle_seed=repeat)
            if repeat:
                wall_s[num_minibatches].append(result.train_s)
                cpu_s[num_minibatches].append(time.thread_time() - cpu_started_s)
    base_cpu_s = statistics.median(cpu_s[settings[0]])
    return {
        "what": f"one learner step on a {batch.num_samples}-row demo batch, {repeats} rounds with the settings "
        "interleaved: train_s (wall) and the thread's CPU seconds, which other jobs on the machine do not inflate",
        "by_num_minibatches": {
            str(num_minibatches): {
                "train_s_median": round(statistics.median(wall_s[num_minibatches]), 4),
                "train_s_min": round(min(wall_s[num_minibatches]), 4),
                "cpu_s_median": round(statistics.median(cpu_s[num_minibatches]), 4),
                f"cpu_s_over_num_minibatches_{settings[0]}": round(statistics.median(values) / base_cpu_s, 2),
            }
            for num_minibatches, values in cpu_s.items()
        },
    }


def load_done_runs(path: Path, fresh: bool) -> list[dict[str, object]]:
    """The runs a previous invocation wrote to `path` (each run's setting, seed and steps tell it apart)."""
    if fresh or not path.exists():
        return []
    report = json.loads(path.read_text())
    return [{"steps": report["steps"], **run} for run in report["runs"]]


def run_key(run: dict[str, object]) -> tuple[object, ...]:
    return (run["num_minibatches"], run["ppo_epochs"], run["lag"], run["seed"], run["steps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("configs/demo.toml"))
    parser.add_argument("--steps", type=int, default=150, help="learner steps per run (equal for every setting)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--num-minibatches", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--ppo-epochs", type=int, default=1)
    parser.add_argument("--lags", type=int, nargs="+", default=[0, 2], help="train on samples from version t - lag")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--timing-repeats", type=int, default=15, help="rounds of the same-batch train_s timing")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--fresh", action="store_true", help="redo the runs --out already holds (default: resume)")
    args = parser.parse_args()

    from transformers.utils import logging as transformers_logging

    torch.set_num_threads(1)
    transformers_logging.disable_progress_bar()
    run_config = load_run_config(args.config)
    done = {run_key(run): run for run in load_done_runs(args.out, args.fresh)}
    report: dict[str, object] = {
        "command": "python -m benchmarks.ppo_minibatches " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.node()}, 1 torch thread, torch {torch.__version__}",
        "config": str(args.config),
        "steps": args.steps,
    }
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        policy_dir = build_initial_policy(run_config.model, task_type(run_config.task.name).alphabet, Path(tmp))
        report["train_s_same_batch"] = time_train_step(
            policy_dir, args.config, args.num_minibatches, args.timing_repeats
        )
        print(json.dumps(report["train_s_same_batch"]), flush=True)
        for lag in args.lags:
            for seed in args.seeds:
                for num_minibatches in args.num_minibatches:
                    key = (num_minibatches, args.ppo_epochs, lag, seed, args.steps)
                    if key in done:
                        runs.append(done[key])
                        continue
                    result = train(policy_dir, args.config, num_minibatches, args.ppo_epochs, lag, seed, args).summary()
                    print(
                        f"lag {lag} seed {seed} num_minibatches {num_minibatches}: reward "
                        f"{result['reward_first10']:.3f} -> {result['reward_last10']:.3f}, held-out "
                        f"{result['heldout_before']:.2f} -> {result['heldout_after']:.2f}, train "
                        f"{result['train_s_per_step']:.3f} s/step, clip {result['clip_fraction_mean']:.3f}, "
                        f"ess {result['ess_fraction_mean']:.3f}, reward 0.8 at step {result['steps_to_reward_0.8']}",
                        flush=True,
                    )
                    runs.append(result)
                    write_report(args.out, report, runs)  # after every run: a killed invocation resumes
    write_report(args.out, report, runs)
    print(f"wrote {args.out}")


def write_report(path: Path, report: dict[str, object], runs: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    full = {**report, "settings": settings_summary(runs), "runs": [{**run, "steps": report["steps"]} for run in runs]}
    path.write_text(json.dumps(full, indent=2) + "\n")


if __name__ == "__main__":
    main()
