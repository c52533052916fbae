"""make ablation: the staleness ablation on the demo task, on CPU, with real local clusters.

    python -m benchmarks.ablation.run [--staleness 0,1,2,4,6,11] [--corrections truncated_is,none]
                                      [--seeds 0,1,2] [--steps 400] [--workers 3] [--pull] [--only-report]

Grid: S x correction x seed, every cell the same number of learner steps (docs/staleness_ablation.md).
S = 0 is run once per seed: at lag 0 the importance weight is 1 whatever the correction, so both
columns show the same runs. `--pull` adds the pull-mode baseline (Echo's sequential mode) per seed; `--s4-queue` the investigation's
S = 4 cells with the default in-flight queue (every group 3-4 versions old) at two learning rates.

Resumable: each finished cell is written to benchmarks/results/ablation/cells/<key>.json and skipped
when the command runs again; an interrupted cell starts over (its run folder is removed first). The
report (table, plots) is rebuilt from every cell file at the end, and alone with --only-report.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.ablation.cells import REPO_ROOT, Cell, run_missing, start_runner_logging
from benchmarks.ablation.report import write_report

OUT_DIR = REPO_ROOT / "benchmarks" / "results" / "ablation"
RUNS_DIR = REPO_ROOT / "runs" / "ablation"


def grid(args: argparse.Namespace) -> list[Cell]:
    cells: list[Cell] = []
    for seed in args.seeds:
        if args.pull:
            cells.append(Cell(0, "truncated_is", seed, mode="pull", num_steps=args.steps, num_workers=args.workers))
        for bound in [] if args.no_grid else args.staleness:
            for correction in args.corrections if bound > 0 else args.corrections[:1]:
                cells.append(Cell(bound, correction, seed, num_steps=args.steps, num_workers=args.workers))
    if args.s4_queue:  # the first look's S = 4: the default queue (S - 1 steps), nothing held back
        for seed in args.seeds:
            for rate, tag in ((None, "queue"), (5e-4, "queue-lr5e-4")):
                cells.append(
                    Cell(
                        4,
                        "truncated_is",
                        seed,
                        num_steps=args.steps,
                        num_workers=args.workers,
                        hold_versions_max=0,
                        max_groups_in_flight=0,
                        learning_rate=rate,
                        tag=tag,
                    )
                )
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda text: [int(item) for item in text.split(",")]  # noqa: E731
    parser.add_argument("--staleness", type=ints, default=[0, 1, 2, 4, 6, 11])
    parser.add_argument("--corrections", type=lambda text: text.split(","), default=["truncated_is", "none"])
    parser.add_argument("--seeds", type=ints, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--pull", action="store_true", help="also the pull-mode baseline per seed")
    parser.add_argument(
        "--s4-queue", action="store_true", help="also S = 4 with the default in-flight queue, at lr 1e-3 and 5e-4"
    )
    parser.add_argument("--no-grid", action="store_true", help="only the extra cells (--pull, --s4-queue)")
    parser.add_argument("--only-report", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--runs-dir", type=Path, default=RUNS_DIR)
    args = parser.parse_args()
    start_runner_logging()
    if not args.only_report:
        run_missing(grid(args), args.out, args.runs_dir)
    print(write_report(args.out))


if __name__ == "__main__":
    main()
