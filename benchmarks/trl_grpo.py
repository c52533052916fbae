"""The TRL cell of `make bench-vs-trl`: TRL's GRPOTrainer on our run file's work (runs in .venv-trl).

    .venv-trl/bin/python -m benchmarks.trl_grpo --run-file CELL.toml --seed K --out OUT_DIR [--threads N]

benchmarks/vs_trl.py writes CELL.toml (the run file with the cell's overrides) and starts this; it writes
OUT_DIR/cells/trl_seed<K>.json (benchmarks/vs_trl_records.py). What it takes from the run file, so both
systems do the same work (docs/vs_trl.md lists what still differs):

    model          [model] path, loaded with float32 master weights for precision "mixed" (bf16 autocast via
                   TrainingArguments.bf16), as our learner holds it (services/learner/precision.py)
    prompts        the task's train_set (shared.tasks.build_task), its chat messages as TRL's conversational
                   prompt, so the same chat template renders them (checked against our encode_prompt at start)
    reward         task.score(completion text, reference): the reward our reward service computes
    algorithm      num_generations = group_size; one optimizer step per group_size x groups_per_step completions;
                   learning_rate constant, AdamW (torch), weight_decay, max_grad_norm; beta = 0 (no KL, no reference
                   model: ours has none); loss_type "dapo" (token sum over the step's completion tokens / their
                   number: our token-level mean); scale_rewards "group" (our normalize_advantage_by_std); one update
                   per batch (num_iterations 1), epsilon = clip_eps (never binds at one update)
    sampling       temperature, top_p 1, top_k 0 (our engines' settings), max_completion_length = max_new_tokens;
                   HF generate (use_vllm False)
    held-out       our own evaluation (services/learner/evaluate.py evaluate_greedy on a TorchEngine in the
                   checkpoint's dtype, as the learner's evaluator): at step 0, every eval_every steps and at the end

The clock: wall_s is the trainer's time from on_train_begin, with every evaluation's time taken out (the callback
runs it between steps and subtracts it), so it counts generation, scoring and training only.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.vs_trl_records import CellRecord, EvalPoint, StepPoint, save_record
from shared.config import RunConfig, load_run_config
from shared.tasks import TaskAdapter, TaskPrompt, build_task

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, TrainerCallback

log = logging.getLogger("trl_grpo")

TRL_CLOCK = "TRL trainer time from on_train_begin, held-out evaluations excluded (paused)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-file", type=Path, required=True, help="the cell's run file (benchmarks/vs_trl.py)")
    parser.add_argument("--seed", type=int, required=True, help="TRL's seed: prompt order and sampling")
    parser.add_argument("--out", type=Path, required=True, help="results folder: writes cells/trl_seed<K>.json")
    parser.add_argument("--work-dir", type=Path, default=None, help="TRL's output_dir (default: a temporary one)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads")
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=16,
        help="completions per forward/backward, gradients accumulated over the step (memory only: the loss is "
        "normalised by the step's token count either way); 0: the whole step at once",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only; never the hub
    config = load_run_config(args.run_file)
    record = run(config, args.run_file, args.seed, args.threads, args.micro_batch, args.work_dir)
    print(f"wrote {save_record(record, args.out)}")


def run(
    config: RunConfig, run_file: Path, seed: int, threads: int, micro_batch: int, work_dir: Path | None
) -> CellRecord:
    """Train with TRL's GRPOTrainer for [schedule] num_steps steps, evaluating as the learner does."""
    import tempfile

    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engines.torch_engine import TorchEngine
    from services.learner.precision import resolve_precision

    started_s = time.perf_counter()
    torch.set_num_threads(threads)
    model_dir = config.model.path
    if model_dir is None:
        raise ValueError(f"{run_file}: [model] path must name the model folder (benchmarks/vs_trl.py sets it)")
    notes = check_supported(config)
    precision = resolve_precision(config.learner, model_dir)
    task = build_task(config.task)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    check_same_prompt_ids(tokenizer, task.train_set[:8])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=precision.param_dtype)
    engine = TorchEngine(model_dir, device="cpu", dtype=precision.publish_dtype)  # the learner's evaluator's engine
    tracker = HeldOutTracker(task, engine, config)
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as scratch:
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=tracker.reward,
            args=grpo_args(config, seed, precision.mode, micro_batch, work_dir or Path(scratch)),
            train_dataset=prompt_dataset(task.train_set),
            processing_class=tokenizer,
            callbacks=[trainer_callback(tracker)],
        )
        trainer.train()
    grpo = config.grpo
    return CellRecord(
        cell="trl",
        seed=seed,
        system="trl",
        run_file=str(run_file),
        model_dir=str(model_dir),
        samples_per_step=grpo.group_size * grpo.groups_per_step,
        num_eval_prompts=len(task.eval_set),
        clock=TRL_CLOCK,
        evals=tracker.evals,
        steps=tracker.steps,
        eval_s=tracker.eval_s,
        total_s=time.perf_counter() - started_s,
        versions={
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "threads": str(threads),
            "precision": precision.mode,
        },
        notes=notes,
    )


def grpo_args(config: RunConfig, seed: int, precision_mode: str, micro_batch: int, output_dir: Path) -> Any:
    """GRPOConfig matching the run file (module docstring). TRL's whole-batch forward keeps several (B, T, V)
    float32 tensors (log-probs, entropies) where our learner chunks them: micro-batches keep its memory in bounds."""
    import trl

    grpo, learner = config.grpo, config.learner
    samples_per_step = grpo.group_size * grpo.groups_per_step
    micro_batch = min(micro_batch or samples_per_step, samples_per_step)
    if samples_per_step % micro_batch:
        raise ValueError(f"--micro-batch {micro_batch} does not divide the step's {samples_per_step} completions")
    return trl.GRPOConfig(
        output_dir=str(output_dir),
        seed=seed,
        data_seed=seed,
        use_cpu=True,
        bf16=precision_mode == "mixed",  # fp32 masters + bf16 autocast; "bf16" loads bf16 weights (no autocast)
        max_steps=config.schedule.num_steps,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=samples_per_step // micro_batch,  # one generation batch = one optimizer step
        num_generations=grpo.group_size,
        learning_rate=grpo.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        weight_decay=grpo.weight_decay,
        max_grad_norm=grpo.max_grad_norm,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group" if grpo.normalize_advantage_by_std else "none",
        num_iterations=1,
        epsilon=grpo.clip_eps,
        temperature=grpo.temperature,
        top_p=1.0,
        top_k=0,
        max_completion_length=grpo.max_new_tokens,
        mask_truncated_completions=False,  # ours trains a truncated completion like any other
        gradient_checkpointing=learner.gradient_checkpointing,
        use_vllm=False,
        shuffle_dataset=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def check_supported(config: RunConfig) -> list[str]:
    """Settings of ours this TRL cell has no equivalent for: refused where the runs would be different
    algorithms; warned, and returned for the record, where TRL runs without them."""
    grpo = config.grpo
    if grpo.num_minibatches != 1 or grpo.ppo_epochs != 1:
        raise ValueError("the TRL cell matches one optimizer update per batch: set num_minibatches = ppo_epochs = 1")
    if config.lora.enabled:
        raise ValueError("the TRL cell trains full weights: [lora] enabled must be false")
    notes = []
    if grpo.dynamic_sampling:
        # The comparison counts generated samples on both sides, so ours pays for the flat groups it drops.
        notes.append(
            "[grpo] dynamic_sampling ignored: TRL's GRPOTrainer has none, so it trains every group it generates, "
            "flat ones included (advantages 0: no gradient, but their tokens count in the loss's normaliser)"
        )
    for note in notes:
        log.warning(note)
    return notes


def prompt_dataset(prompts: list[TaskPrompt]) -> Any:
    """TRL's conversational prompts: {"prompt": [{"role", "content"}, ...], "reference": str} per row;
    TRL passes the extra column to the reward function by name."""
    from datasets import Dataset

    rows = [
        {"prompt": [{"role": m.role, "content": m.content} for m in item.messages], "reference": item.reference}
        for item in prompts
    ]
    return Dataset.from_list(rows)


def check_same_prompt_ids(tokenizer: PreTrainedTokenizerBase, prompts: list[TaskPrompt]) -> None:
    """TRL renders a conversational prompt with the chat template and the generation prompt; our workers
    encode it with shared.tokenization.encode_prompt. Both must give the same ids, or the runs differ."""
    from shared.tokenization import encode_prompt

    for item in prompts:
        conversation = [{"role": m.role, "content": m.content} for m in item.messages]
        trl_ids = tokenizer.apply_chat_template(
            conversation, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        if list(trl_ids["input_ids"]) != encode_prompt(tokenizer, item.input):
            raise RuntimeError(f"TRL's prompt ids differ from ours for {item.prompt!r:.80}")


class HeldOutTracker:
    """Held-out evaluation at step 0, every eval_every steps and at the end, with TRL's clock paused; and
    the reward function (it sees every completion of a step, so it keeps the step's mean reward).
    TRL calls it through `trainer_callback`."""

    def __init__(self, task: TaskAdapter, engine: Any, config: RunConfig) -> None:
        self.task = task
        self.engine = engine
        self.max_new_tokens = config.grpo.max_new_tokens
        self.eval_every = config.schedule.eval_every
        self.samples_per_step = config.grpo.group_size * config.grpo.groups_per_step
        self.evals: list[EvalPoint] = []
        self.steps: list[StepPoint] = []
        self.eval_s = 0.0  # evaluation time so far: taken out of the clock
        self._started_s = 0.0
        self._step_rewards: list[float] = []

    def reward(self, completions: list[Any], reference: list[str], **_: Any) -> list[float]:
        """TRL's reward function: task.score on each completion's text (conversational: the assistant turn)."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [self.task.score(text, ref) for text, ref in zip(texts, reference, strict=True)]
        self._step_rewards.extend(rewards)
        return rewards

    def wall_s(self) -> float:
        return time.perf_counter() - self._started_s - self.eval_s

    def train_begin(self, model: torch.nn.Module) -> None:
        self._started_s = time.perf_counter()
        self.evaluate(model, 0)

    def step_end(self, model: torch.nn.Module, step: int, max_steps: int) -> None:
        rewards, self._step_rewards = self._step_rewards, []
        reward_mean = sum(rewards) / len(rewards) if rewards else 0.0
        num_samples = step * self.samples_per_step  # TRL trains every completion it generates
        point = StepPoint(
            step=step,
            num_samples=num_samples,
            num_trained_samples=num_samples,
            wall_s=self.wall_s(),
            reward_mean=reward_mean,
        )
        self.steps.append(point)
        log.info("step %d: reward %.3f, wall %.1fs", step, reward_mean, point.wall_s)
        if step % self.eval_every == 0 or step >= max_steps:
            self.evaluate(model, step)

    def evaluate(self, model: torch.nn.Module, step: int) -> None:
        from services.learner.evaluate import evaluate_greedy

        started_s = time.perf_counter()
        wall_s = self.wall_s()
        was_training = model.training
        weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        self.engine.load_state_dict(weights, step)
        result = evaluate_greedy(self.engine, self.task, max_new_tokens=self.max_new_tokens)
        model.train(was_training)
        self.evals.append(
            EvalPoint(step=step, num_samples=step * self.samples_per_step, wall_s=wall_s, accuracy=result.accuracy)
        )
        self.eval_s += time.perf_counter() - started_s
        log.info("eval at step %d: accuracy %.3f (%.1fs, not on the clock)", step, result.accuracy, self.eval_s)


def trainer_callback(tracker: HeldOutTracker) -> TrainerCallback:
    """The tracker as a transformers TrainerCallback (imported here: --help stays instant)."""
    from transformers import TrainerCallback

    class Forward(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            tracker.train_begin(model)

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            tracker.step_end(model, state.global_step, state.max_steps)

    return Forward()


if __name__ == "__main__":
    main()
