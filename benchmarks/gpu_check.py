"""`make gpu-check`: one prepared run on a lent GPU machine (one H100) that measures the learner and checks
the device paths, in one JSON (docs/gpu_check.md).

    make gpu-wheels                                    # here, with PyPI: the wheels the machine lacks -> .whl/
    make gpu-check                                     # there: install .whl/ into /tmp/site, run this
    python -m benchmarks.gpu_check --smoke --out DIR   # the same code paths at tiny sizes on CPU (~3 min)
    python -m benchmarks.gpu_check --check-imports     # what the machine + .whl/ would leave unimportable

Parts (benchmarks/gpu_check_parts.py), each in a process of its own with a time limit, so one that fails or
hangs is recorded with its error and the others still run:
    learner_step  tokens/s, MFU and peak memory of the learner's mixed-precision step at the Qwen3-0.6B
                  shape, 2k-16k tokens per sequence, against prime-rl's published single-H100 numbers
    fsdp          the step sharded with FSDP2 over one NCCL rank: it works, and its time
    engine        the torch engine's sampling tokens/s on the GPU
    cluster       a 30-step local cluster run: learner and one torch-engine worker on the GPU

Writes <out>/gpu_check.json (--smoke: gpu_check_smoke.json; <out> defaults to benchmarks/results) with the
device, date and library versions, and a copy to $OUT when that is set (the device call's output folder),
with each failed part's log. Exits 1 if any part failed or a module the parts import cannot be found.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.devices import device_name

REPO_ROOT = Path(__file__).resolve().parent.parent
PARTS = ("learner_step", "fsdp", "engine", "cluster")
PART_LIMIT_S = {"learner_step": 150.0, "fsdp": 90.0, "engine": 120.0, "cluster": 240.0}
QWEN3_CONTEXT = 40_960  # Qwen3-0.6B's declared context: the 16k rows fit it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: checks the script, not a result")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results", help="folder of the JSON")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {PARTS}")
    parser.add_argument("--budget-s", type=float, default=450.0, help="wall-clock limit of all parts together")
    parser.add_argument("--runs-dir", type=Path, default=REPO_ROOT / "runs", help="where the cluster part's run goes")
    parser.add_argument("--check-imports", action="store_true", help="list the modules the lent machine would lack")
    parser.add_argument(
        "--wheels", type=Path, default=REPO_ROOT / ".whl", help="the wheel folder --check-imports reads"
    )
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # a child: run one part
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--run-id", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.check_imports:
        sys.exit(check_imports(args.wheels))
    if args.part:
        run_part_here(args)
        return
    sys.exit(0 if run_all(args) else 1)


def run_all(args: argparse.Namespace) -> bool:
    """Every part in turn; writes the JSON; True when all of them worked."""
    from benchmarks.gpu_check_parts import FULL, SMOKE
    from benchmarks.gpu_wheels import not_importable

    sizes = SMOKE if args.smoke else FULL
    deadline_s = time.monotonic() + args.budget_s
    results: dict[str, Any] = header(args, sizes.shape)
    missing = not_importable()
    results["imports"] = {"not_importable": missing}
    work_dir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    try:
        model_dir = build_model(sizes.shape, work_dir, args.smoke, results)
        for part in args.parts.split(","):
            print(f"part {part} ...", flush=True)
            if model_dir is None and part != "cluster":
                results[part] = {"error": "not run: no model folder (see model_folder)"}
                continue
            results[part] = run_part(part, args, model_dir, work_dir, deadline_s)
            print(f"  {json.dumps(results[part])[:600]}", flush=True)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)  # the 0.6B folder is 1.2 GB
    failed = [name for name, section in results.items() if isinstance(section, dict) and "error" in section]
    results["failed_parts"] = failed
    write_results(results, args.out / ("gpu_check_smoke.json" if args.smoke else "gpu_check.json"))
    return not failed and not missing


def header(args: argparse.Namespace, shape: str) -> dict[str, Any]:
    return {
        "command": "python -m benchmarks.gpu_check" + (" --smoke" if args.smoke else ""),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device_name(),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
        "transformers": importlib.metadata.version("transformers"),
        "smoke": args.smoke,
        "model_shape": shape,
    }


def build_model(shape: str, work_dir: Path, smoke: bool, results: dict[str, Any]) -> Path | None:
    """The random-init folder every part but the cluster trains or samples (bf16 weights, as the real
    checkpoint: the mixed-precision learner loads float32 masters from it). Its build time, or its error,
    goes into results["model_folder"]; None when it failed (the cluster part runs without it)."""
    from benchmarks.model_shapes import build_qwen3_folder

    context = None if smoke else QWEN3_CONTEXT
    print(f"building a random {shape} folder in {work_dir} ...", flush=True)
    started_s = time.monotonic()
    try:
        model_dir = build_qwen3_folder(shape, work_dir / shape, dtype="bfloat16", max_position_embeddings=context)
    except Exception as exc:  # recorded: the parts that need the folder say so, the cluster part still runs
        results["model_folder"] = {"error": f"{type(exc).__name__}: {exc}"}
        return None
    results["model_folder"] = {"shape": shape, "dtype": "bfloat16", "build_s": since(started_s)}
    return model_dir


def run_part(part: str, args: argparse.Namespace, model_dir: Path | None, work_dir: Path, deadline_s: float) -> dict:
    """One part in a fresh process, under min(its limit, what is left of the budget); a failure or a
    timeout comes back as {"error": ...} with the tail of its log (the whole log goes to $OUT)."""
    limit_s = min(PART_LIMIT_S[part], deadline_s - time.monotonic())
    if limit_s <= 0:
        return {"error": f"not run: the {args.budget_s:.0f} s budget was spent"}
    part_out, log_path = work_dir / f"{part}.json", work_dir / f"{part}.log"
    run_id = f"gpu-check-{part}-{int(time.time())}"
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--part", part, "--part-out", str(part_out)]
    command += ["--run-id", run_id, "--runs-dir", str(args.runs_dir)]
    command += ["--model-dir", str(model_dir)] if model_dir else []
    command += ["--smoke"] if args.smoke else []
    started_s = time.monotonic()
    with open(log_path, "wb") as log_file:
        # its own session: a timeout stops it and whatever it started (the cluster's services stop on SIGTERM)
        child = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        timed_out = wait_or_stop(child, limit_s)
    seconds = since(started_s)
    if timed_out or child.returncode != 0 or not part_out.exists():
        keep_log(log_path, args.runs_dir / run_id / "logs")
        why = f"over its {limit_s:.0f} s limit" if timed_out else f"exit code {child.returncode}"
        tail = log_path.read_text(errors="replace").strip().splitlines()[-6:]
        return {"error": f"{why}: " + " | ".join(tail)[-1200:], "part_s": seconds}
    return json.loads(part_out.read_text()) | {"part_s": seconds}


def wait_or_stop(child: subprocess.Popen[bytes], limit_s: float) -> bool:
    """Wait up to limit_s, then stop it. True: it timed out. Ctrl-C here stops it too (its own session
    does not get the terminal's SIGINT)."""
    try:
        child.wait(timeout=limit_s)
        return False
    except subprocess.TimeoutExpired:
        stop_child(child)
        return True
    except KeyboardInterrupt:
        stop_child(child)
        raise


def stop_child(child: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM (a cluster part stops its services on it), then SIGKILL after grace_s."""
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def keep_log(part_log: Path, cluster_logs: Path) -> None:
    """A failed part's log (and the cluster's service logs) into $OUT/gpu_check_logs, when $OUT is set."""
    out = os.environ.get("OUT")
    if not out:
        return
    logs = Path(out) / "gpu_check_logs"
    logs.mkdir(parents=True, exist_ok=True)
    shutil.copy(part_log, logs / part_log.name)
    if cluster_logs.is_dir():
        shutil.copytree(cluster_logs, logs / cluster_logs.parent.name, dirs_exist_ok=True)


def write_results(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=2) + "\n"
    path.write_text(text)
    print(f"wrote {path}")
    if os.environ.get("OUT"):
        copy = Path(os.environ["OUT"]) / path.name
        copy.write_text(text)
        print(f"wrote {copy}")


def run_part_here(args: argparse.Namespace) -> None:
    """The child: one part, its result as JSON in --part-out. SIGTERM (the parent's timeout) unwinds like
    Ctrl-C, so a cluster part stops its services before it exits."""
    import logging

    from benchmarks import gpu_check_parts as parts

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    sizes = parts.SMOKE if args.smoke else parts.FULL
    if args.part == "learner_step":
        result = parts.learner_step_part(args.model_dir, sizes)
    elif args.part == "fsdp":
        result = parts.fsdp_part(args.model_dir, sizes)
    elif args.part == "engine":
        result = parts.engine_part(args.model_dir, sizes)
    else:
        result = parts.cluster_part(sizes, args.runs_dir, args.run_id)
    args.part_out.write_text(json.dumps(result))


def raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def check_imports(wheel_dir: Path) -> int:
    """Print what the lent machine (its packages + the wheels) and this interpreter would leave missing."""
    from benchmarks.gpu_wheels import check_report, missing_imports, not_importable

    print(check_report(wheel_dir))
    here = not_importable()
    print("not importable in this interpreter: " + (", ".join(here) if here else "none"))
    return 1 if here or missing_imports(wheel_dir) else 0


def since(started_s: float) -> float:
    return round(time.monotonic() - started_s, 1)


if __name__ == "__main__":
    main()
