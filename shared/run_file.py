"""Run files as text: read one (resolving `extends`) and write one.

A run file may start from another: `extends = "smollm2.toml"` (a path relative to the file's own folder) takes
that file, and this file's keys replace the base's, section by section (a key this file sets replaces the base's
value, a list included; the base's other keys stay). The base may extend another in turn.

    python -m shared.run_file configs/smollm2_lora.toml     # the file resolved, as one TOML text

Every reader of a run file goes through `read_run_file`; what leaves the process (the bootstrap a joining worker
gets, the copy a local cluster hands its services, the cells a benchmark writes) is `dump_run_file` of it,
with no `extends` left.
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

EXTENDS_KEY = "extends"


class RunFileError(ValueError):
    """A run file that cannot be read as TOML, or whose `extends` chain is broken."""


def read_run_file(path: str | Path) -> dict[str, Any]:
    """The run file at `path` as a dict, its `extends` chain resolved."""
    return _resolve(Path(path), chain=())


def _resolve(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in (*chain, resolved))
        raise RunFileError(f"run file {path}: `extends` loops back to itself ({cycle})")
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        via = f" (extended by {chain[-1]})" if chain else ""
        raise RunFileError(f"run file {path}{via}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise RunFileError(f"run file {path}: not TOML: {exc}") from exc
    base_name = raw.pop(EXTENDS_KEY, None)
    if base_name is None:
        return raw
    if not isinstance(base_name, str):
        raise RunFileError(f"run file {path}: `extends` must be a file name, got {base_name!r}")
    return overlay(_resolve(path.parent / base_name, (*chain, resolved)), raw)


def overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`: a section in both is merged key by key (top's value wins); anything else top replaces."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def dump_run_file(raw: dict[str, Any]) -> str:
    """A run file's dict as TOML: top-level scalars, then one table per section (scalars, lists, inline tables)."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in raw.items() if not isinstance(value, dict)]
    for section, values in raw.items():
        if isinstance(values, dict):
            lines += ["", f"[{section}]", *(f"{key} = {_toml_value(value)}" for key, value in values.items())]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):  # a table inside a section (e.g. [task] reasoning_gym_config): inline
        return "{ " + ", ".join(f"{json.dumps(str(key))} = {_toml_value(item)}" for key, item in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        sys.exit("usage: python -m shared.run_file RUN_FILE   (prints the file with its `extends` resolved)")
    try:
        sys.stdout.write(dump_run_file(read_run_file(args[0])))
    except RunFileError as exc:
        sys.exit(str(exc))


if __name__ == "__main__":
    main()
