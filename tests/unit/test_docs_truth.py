"""The docs name only what exists. In README.md and every docs/*.md:

- a repository path, in backticks, a fenced block or a link target, is in the tree (a link relative to its doc);
- a dotted module name (`python -m benchmarks.wan`, `shared.config.RunConfig`) is a module of the tree, and the
  name after it is defined at its top level;
- a run-file setting, `[section] key` or a line of a ```toml block, is a field of that section's model in
  shared/config.py;
- an `RL_*` name is one the code knows: a string (not a comment) of the code or the tests, or a settings class's
  variable (its env prefix and field name, or its alias);
- a link's `#anchor` into a page of docs/ or the README is one of that page's headings;
and the layout map in docs/guide.md lists every module of services/, shared/ and engines/ and every top-level folder,
and nothing that is not in the tree. A measured figure lives once, on docs/results.md, with its command and date: no
other page states a date, and a line that links to the results page quotes only figures the results page shows
(FIGURE says what a figure is). A finding names the doc, its line and the missing thing; each test lists all of its
findings at once.
"""

from __future__ import annotations

import ast
import fnmatch
import glob
import importlib
import io
import re
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic import AliasChoices, BaseModel
from pydantic_settings import BaseSettings

from shared.config import RunConfig

REPO = Path(__file__).resolve().parents[2]
CODE_PACKAGES = ("services", "shared", "engines", "cluster", "simulator", "benchmarks")
# Where an RL_* variable may be read: the code, and the test suite's own switches (RL_REQUIRE_VLLM).
ENV_READERS = (*CODE_PACKAGES, "tests")
# The modules the layout map must list, one by one.
MAPPED_MODULES = ("services/**/*.py", "shared/**/*.py", "engines/*.py")
LAYOUT_HEADING = "## Layout"
# The one page that states measured figures and their dates (generated: benchmarks/results_page.py).
RESULTS_PAGE = REPO / "docs" / "results.md"
DATE = re.compile(r"(?<!\d)\d{4}-\d{2}-\d{2}(?!\d)")  # 2026-11-24: the date of a run
# A number: 27,990 or 1,234.5 (thousands separators), 0.41 (a decimal point), 16 (digits alone); never part of a
# word, a version (2.13.0) or an anchor (`0.6` in Qwen3-0.6B, `1000` in #coordinator-under-1000-workers).
NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+)([x%])?(?![\w%]|[.,]\d)")

INLINE_CODE = re.compile(r"(`+)((?:(?!\n\s*\n)[^`])+?)\1")  # not across a blank line
LINK_TARGET = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w-]*)")
# a token of code: split at whitespace, quotes, `=`, `,`, `;`, brackets and braces
TOKEN_SEPARATORS = re.compile(r"[\s\"'`=,;()|{}\[\]]+")
DOTTED_MODULE = re.compile(r"^(?:" + "|".join((*CODE_PACKAGES, "tests")) + r")(?:\.[A-Za-z_]\w*)+$")
# `[section] key`, or `[section]` alone as the whole span (not a command's `[flags]`)
SETTING = re.compile(r"(?:^|[\s(])\[([a-z_]+)\](?:\s+([a-z_][a-z0-9_]*))?")
TOML_SECTION = re.compile(r"^\s*\[([a-z_][a-z0-9_.]*)\]\s*(?:#.*)?$")
TOML_KEY = re.compile(r"^\s*#?\s*([a-z_][a-z0-9_]*)\s*=")
ENV_NAME = re.compile(r"\bRL_[A-Z0-9_]*[*<]?")  # `RL_FAULT_*`, `RL_REDIS_PASSWORD_<USER>`: a family
FILE_SUFFIXES = {"env", "json", "jsonl", "md", "png", "py", "sh", "toml", "txt", "yaml", "yml"}
PLACEHOLDER = re.compile(r"<[^<>/]*>")


@dataclass(frozen=True)
class Span:
    """A piece of a doc that may name something: inline code, a fenced block's line or a link target."""

    line: int  # 1-based line in the doc
    kind: str  # "code", "fenced", "link"
    text: str
    language: str = ""  # a fenced block's info string ("toml", "bash", ...)
    block: int = 0  # a fenced line's block: the line of its opening fence


def docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def spans(doc: Path) -> Iterator[Span]:
    """The doc's inline code (which may run over a line break), link targets and fenced lines, in order of kind."""
    fence = language = ""
    block = 0
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        opening = FENCE.match(line)
        if fence:
            if opening and opening.group(1).startswith(fence) and not opening.group(2):
                fence = ""
            else:
                yield Span(number, "fenced", line, language, block)
        elif opening:
            fence, language, block = opening.group(1), opening.group(2), number
    text = unfenced(doc)
    for match in INLINE_CODE.finditer(text):
        yield Span(text.count("\n", 0, match.start()) + 1, "code", " ".join(match.group(2).split()))
    for number, line in enumerate(without_code(text), start=1):
        for match in (*LINK_TARGET.finditer(line), *REFERENCE_LINK.finditer(line)):
            yield Span(number, "link", match.group(1))


def unfenced(doc: Path) -> str:
    """The doc with its fenced blocks (fences included) blanked, so line numbers stay."""
    lines = doc.read_text().splitlines()
    fence = ""
    for number, line in enumerate(lines):
        opening = FENCE.match(line)
        if fence or opening:
            lines[number] = ""
            if not fence:
                fence = opening.group(1) if opening else ""
            elif opening and opening.group(1).startswith(fence) and not opening.group(2):
                fence = ""
    return "\n".join(lines)


def without_code(text: str) -> list[str]:
    """`text`'s lines with its inline code cut out (a code span's text is no link and no figure); a span's line
    breaks are kept, so the line numbers stay."""
    return INLINE_CODE.sub(lambda match: "\n" * match.group(0).count("\n"), text).splitlines()


@cache
def root_names() -> frozenset[str]:
    """The tree's top-level files and folders. Not repository paths: what .gitignore keeps out of the tree, such as
    runs/ (a run's files, written while it runs), tls/ (written by `make keys`) and the .venv* folders (`make setup*`).
    """
    ignored = [
        line.strip().strip("/")
        for line in (REPO / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return frozenset(
        entry.name
        for entry in REPO.iterdir()
        if entry.name != ".git" and not any(fnmatch.fnmatch(entry.name, pattern) for pattern in ignored)
    )


def repo_path(token: str) -> str | None:
    """`token` as a path relative to the repository root, or None where it is not one: trailing `:line`,
    `::test`, `:function` and `#anchor` are cut, `<placeholder>` segments become `*`."""
    token = token.removeprefix("./")
    if token.split("/", 1)[0] not in root_names():
        return None
    path = re.split(r"::?|#", token, maxsplit=1)[0].rstrip(".,")
    return PLACEHOLDER.sub("*", path).rstrip("/")


def exists(relative: str, base: Path = REPO) -> bool:
    if "*" in relative:
        return bool(glob.glob(str(base / relative), recursive=True))
    return (base / relative).exists()


def missing_paths(doc: Path) -> list[str]:
    found = []
    for span in spans(doc):
        if span.kind == "link":
            found.extend(missing_link(doc, span))
            continue
        for token in TOKEN_SEPARATORS.split(span.text):
            path = repo_path(token)
            if path is not None and not exists(path):
                found.append(f"{doc.relative_to(REPO)}:{span.line}: no such path `{path}`")
    return found


def missing_link(doc: Path, span: Span) -> list[str]:
    target = re.split(r"[#?]", span.text, maxsplit=1)[0]
    if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):  # an anchor of this page, or a URL
        return []
    resolved = (doc.parent / target).resolve()
    if resolved.is_relative_to(REPO) and resolved.exists():
        return []
    return [f"{doc.relative_to(REPO)}:{span.line}: link to a missing file `{span.text}`"]


def module_file(parts: list[str]) -> Path | None:
    """The source of the module `parts` names (a package's __init__.py), or None."""
    base = REPO.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if base.is_dir():
        return base / "__init__.py"
    return None


def top_level_names(source: Path) -> set[str]:
    if not source.is_file():
        return set()
    names = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def missing_module(dotted: str) -> str | None:
    """What of `dotted` (a module, maybe followed by a name in it) is not in the tree, or None."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        source = module_file(parts[:end])
        if source is None:
            continue
        if end == len(parts) or parts[end] in top_level_names(source):
            return None
        return ".".join(parts[: end + 1])
    return dotted


def missing_modules(doc: Path) -> list[str]:
    found = []
    for span in spans(doc):
        if span.kind == "link":
            continue
        for token in TOKEN_SEPARATORS.split(span.text):
            token = token.rstrip(".,:")
            if token.rsplit(".", 1)[-1] in FILE_SUFFIXES:  # a file's name (`cluster.env`), not a module
                continue
            if DOTTED_MODULE.match(token) and (missing := missing_module(token)):
                found.append(f"{doc.relative_to(REPO)}:{span.line}: no module or name `{missing}`")
    return found


def section_models() -> dict[str, type[BaseModel]]:
    """Run-file section name -> its model, from RunConfig's fields."""
    return {
        name: field.annotation
        for name, field in RunConfig.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    }


def missing_setting(section: str, key: str | None) -> str | None:
    model = section_models().get(section)
    if model is None:
        return f"[{section}]"
    if key is not None and key not in model.model_fields:
        return f"[{section}] {key}"
    return None


def missing_settings(doc: Path) -> list[str]:
    found: list[str] = []
    table, block = "", 0  # the table a ```toml line is in: "" for the run file's top level
    for span in spans(doc):
        if span.block != block:
            table, block = "", span.block
        missing: list[str | None] = []
        if span.kind == "code":
            missing = [
                missing_setting(section, key or None)
                for section, key in SETTING.findall(span.text)
                if key or span.text.strip() == f"[{section}]"
            ]
        elif span.kind == "fenced" and span.language == "toml":  # a run file's lines (a commented-out key too)
            if header := TOML_SECTION.match(span.text):
                table = header.group(1)
                missing = [missing_setting(table, None)]
            elif key := TOML_KEY.match(span.text):
                if table:
                    missing = [missing_setting(table, key.group(1))]
                elif key.group(1) not in RunConfig.model_fields:
                    missing = [key.group(1)]
        found.extend(f"{doc.relative_to(REPO)}:{span.line}: no run-file setting `{name}`" for name in missing if name)
    return found


def python_sources(*packages: str) -> Iterator[Path]:
    for package in packages:
        yield from sorted((REPO / package).rglob("*.py"))


@cache
def known_env_names() -> frozenset[str]:
    """RL_* names in the strings (not the comments) of the code and the tests, and each settings class's variables.
    The settings modules are imported for their classes: pydantic-settings, no torch."""
    names: set[str] = set()
    settings_modules = []
    for path in python_sources(*ENV_READERS):
        if path == Path(__file__).resolve():
            continue
        source = path.read_text()
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.STRING:
                names.update(re.findall(r"RL_[A-Z0-9_]+", token.string))
        if re.search(r"^class \w+\([\w, ]*Settings\)", source, re.MULTILINE):
            settings_modules.append(".".join(path.relative_to(REPO).with_suffix("").parts))
    for module in settings_modules:
        importlib.import_module(module)
    for settings in subclasses(BaseSettings):
        prefix = settings.model_config.get("env_prefix", "")
        for name, field in settings.model_fields.items():
            alias = field.validation_alias
            if isinstance(alias, str):
                names.add(alias)
            elif isinstance(alias, AliasChoices):
                names.update(choice for choice in alias.choices if isinstance(choice, str))
            else:
                names.add((prefix + name).upper())
    return frozenset(names)


def subclasses(cls: type[BaseSettings]) -> Iterator[type[BaseSettings]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)


def unknown_env_names(doc: Path) -> list[str]:
    found = []
    known = known_env_names()
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        for name in ENV_NAME.findall(line):
            if name.endswith(("*", "<", "_")):  # a family: some name of the code starts with it
                known_name = any(k.startswith(name.rstrip("*<")) for k in known)
            else:
                known_name = name in known
            if not known_name:
                found.append(f"{doc.relative_to(REPO)}:{number}: no code reads `{name}`")
    return found


def layout_entries(guide: Path) -> Iterator[tuple[int, str]]:
    """(line, path) of each entry of the layout map, the first fenced block under LAYOUT_HEADING: one entry a line,
    `<indent><name>  <description>`, two spaces of indent per folder level (a folder's name ends in `/`); a line
    indented past the next level continues the description above it."""
    lines = guide.read_text().splitlines()
    start = lines.index(LAYOUT_HEADING)
    opening = next(n for n in range(start, len(lines)) if FENCE.match(lines[n]))
    folders: list[str] = []  # the folders the next entry may be in, outermost first
    for number in range(opening + 1, len(lines)):
        line = lines[number]
        if FENCE.match(line):
            return
        level, spare = divmod(len(line) - len(line.lstrip(" ")), 2)
        if not line.strip() or spare or level > len(folders):  # a description's next line
            continue
        name = line.split()[0]
        folders = folders[:level]
        yield number + 1, "/".join([*folders, name.rstrip("/")])
        if name.endswith("/"):
            folders.append(name.rstrip("/"))


def layout_findings(guide: Path) -> list[str]:
    """Entries of the layout map not in the tree, and what the map must list but does not: every module of
    MAPPED_MODULES (but `__init__.py`) and every top-level folder."""
    where = guide.relative_to(REPO)
    heading = guide.read_text().splitlines().index(LAYOUT_HEADING) + 1
    listed = {path: line for line, path in layout_entries(guide)}
    found = [f"{where}:{line}: the layout map names `{path}`, not in the tree" for path, line in listed.items()]
    found = [finding for finding, path in zip(found, listed, strict=True) if not (REPO / path).exists()]
    modules = {str(path.relative_to(REPO)) for pattern in MAPPED_MODULES for path in REPO.glob(pattern)}
    folders = {name for name in root_names() if (REPO / name).is_dir()}
    required = {path for path in modules if not path.endswith("/__init__.py")} | folders
    found += [f"{where}:{heading}: the layout map lacks `{path}`" for path in sorted(required - set(listed))]
    return found


def dated_lines(doc: Path) -> list[str]:
    """Each date (YYYY-MM-DD) the doc states, anywhere on a line: in prose, code, a table or a link's anchor."""
    return [
        f"{doc.relative_to(REPO)}:{number}: a dated result `{date}` (figures live on docs/results.md)"
        for number, line in enumerate(doc.read_text().splitlines(), start=1)
        for date in DATE.findall(line)
    ]


def figures(line: str) -> Iterator[str]:
    """The figures a line states: a number with a decimal point (0.41) or thousands separators (27,990), or any
    number followed by `x` (a ratio: 1.66x) or `%` (a percentage: 5%); a number alone (16 receivers, S = 2) is a
    count, not a figure. Link targets are left out (an anchor is no figure)."""
    for match in NUMBER.finditer(LINK_TARGET.sub("]()", line)):
        number, suffix = match.groups()
        if suffix or "." in number or "," in number:
            yield number + (suffix or "")


@cache
def results_page_numbers() -> frozenset[str]:
    """Every number docs/results.md shows, anywhere on it, as written (a unit's space closed: `0.14 %` is `0.14%`),
    and each percentage with its `%`."""
    text = re.sub(r"(\d) ([x%])(?![\w%])", r"\1\2", RESULTS_PAGE.read_text())
    found = set()
    for match in NUMBER.finditer(text):
        number, suffix = match.groups()
        found.update((number, number + "%") if suffix == "%" else (number,))
    return frozenset(found)


def links_to(doc: Path, line: str, page: Path) -> bool:
    return any(
        (doc.parent / re.split(r"[#?]", match.group(1), maxsplit=1)[0]).resolve() == page
        for match in LINK_TARGET.finditer(line)
    )


def unpublished_figures(doc: Path) -> list[str]:
    """On each line of the doc that links to docs/results.md, outside inline code and fenced blocks (commands and
    settings: `--steps 20`, `lr = 1e-6`), every figure (`figures`) the results page does not show. A ratio matches
    the bare number (`0.41x` is shown as `0.41 x` or `0.41`); a percentage must be shown as a percentage; a decimal
    must be written as the page writes it (`0.90` is not `0.9`)."""
    found = []
    for number, line in enumerate(without_code(unfenced(doc)), start=1):
        if links_to(doc, line, RESULTS_PAGE):
            found += [
                f"{doc.relative_to(REPO)}:{number}: `{figure}` beside a link to the results page, which does not show it"
                for figure in figures(line)
                if (figure if figure.endswith("%") else figure.removesuffix("x")) not in results_page_numbers()
            ]
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: a link's text kept, markup and punctuation dropped, lower case, a hyphen for
    each space."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors of a page's headings (outside fenced blocks); a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    for line in unfenced(page).splitlines():
        if heading := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(heading.group(1))
            seen[base if base not in seen else f"{base}-{seen[base]}"] = 0
            seen[base] = seen.get(base, 0) + 1
    return frozenset(seen)


def broken_anchors(doc: Path) -> list[str]:
    """Links from the doc to `page.md#anchor` (the doc itself for `#anchor`) whose page has no such heading."""
    found = []
    for number, line in enumerate(without_code(unfenced(doc)), start=1):
        for match in LINK_TARGET.finditer(line):
            target, _, anchor = match.group(1).partition("#")
            page = (doc.parent / target).resolve() if target else doc
            if anchor and page.suffix == ".md" and page.is_file() and anchor not in anchors(page):
                found.append(f"{doc.relative_to(REPO)}:{number}: `{match.group(1)}`: no such heading")
    return found


def findings_in_every_doc(check: Callable[[Path], list[str]]) -> list[str]:
    return [finding for doc in docs() for finding in check(doc)]


def test_every_path_a_doc_names_is_in_the_tree() -> None:
    findings = findings_in_every_doc(missing_paths)
    assert not findings, "\n".join(findings)


def test_every_module_a_doc_names_is_in_the_tree() -> None:
    findings = findings_in_every_doc(missing_modules)
    assert not findings, "\n".join(findings)


def test_every_run_file_setting_a_doc_names_is_a_field() -> None:
    findings = findings_in_every_doc(missing_settings)
    assert not findings, "\n".join(findings)


def test_every_environment_name_a_doc_names_is_read_by_the_code() -> None:
    findings = findings_in_every_doc(unknown_env_names)
    assert not findings, "\n".join(findings)


def test_the_layout_map_is_the_tree() -> None:
    findings = layout_findings(REPO / "docs" / "guide.md")
    assert not findings, "\n".join(findings)


def test_every_anchor_a_doc_links_to_is_a_heading() -> None:
    findings = findings_in_every_doc(broken_anchors)
    assert not findings, "\n".join(findings)


def test_no_page_but_the_results_page_states_a_date() -> None:
    findings = [finding for doc in docs() if doc != RESULTS_PAGE for finding in dated_lines(doc)]
    assert not findings, "\n".join(findings)


def test_a_line_that_links_to_the_results_page_quotes_only_its_figures() -> None:
    findings = [finding for doc in docs() if doc != RESULTS_PAGE for finding in unpublished_figures(doc)]
    assert not findings, "\n".join(findings)
