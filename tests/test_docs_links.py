"""The docs cite only what the repository holds: every file path and module the README and docs/*.md
name exists here, and no design citation points outside the repository (the design's reasons live
in docs/design-decisions.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

# A repository path: a top-level folder, or a package of enginecache/ named from inside it
# (`core/store.py`), not part of a longer path or URL (`/run/enginecache/...`, `user@db/name`).
_PATH = re.compile(
    r"(?<![\w./@$~:-])((?:enginecache|docs|bench|tests|deploy|core|db|service|cli|dashboard)/[\w.*/<>-]*)"
)
# A module named by its dotted path: `enginecache.service.serving.hitpath`, `core.filelease`.
_MODULE = re.compile(r"(?<![\w./@$-])((?:enginecache\.)?(?:core|db|service|cli|dashboard)(?:\.[A-Za-z_]\w*)+)")
_PACKAGES = ("core", "db", "service", "cli", "dashboard")


def _citations(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """(where, what) for each match in the docs: `docs/runtime.md:12`."""
    found = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            found.extend((f"{doc.relative_to(ROOT)}:{number}", m.group(1)) for m in pattern.finditer(line))
    return found


def path_exists(cited: str) -> bool:
    """Whether a cited path names something here. `<name>` and `*` are wildcards; a path given from
    inside the package (`service/...`) is looked up under enginecache/."""
    path = cited.rstrip(".,;:-/")
    if path.split("/")[0] in _PACKAGES:
        path = f"enginecache/{path}"
    pattern = re.sub(r"<[^>/]*>", "*", path)
    if "*" in pattern:
        return any(ROOT.glob(pattern))
    return (ROOT / pattern).exists()


def top_level_names(source: Path) -> set[str]:
    """The names a module defines at its top level (also under an `if`, such as `if TYPE_CHECKING:`)."""
    names: set[str] = set()
    body = list(ast.parse(source.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If):
            body.extend(node.body + node.orelse)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def module_exists(cited: str) -> bool:
    """Whether a dotted name is a module or package of ours below its layer, and the name after it,
    if any, is defined there: `service.engines.records.host_verdict` needs
    enginecache/service/engines/records.py defining `host_verdict`, say."""
    parts = cited.split(".")
    if parts[0] != "enginecache":
        parts.insert(0, "enginecache")
    if len(parts) < 3:
        return True  # a layer itself
    for end in range(len(parts), 2, -1):
        base = ROOT.joinpath(*parts[:end])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            return end == len(parts) or parts[end] in top_level_names(source)
    return False


def test_the_pattern_finds_repository_paths_and_leaves_others_alone() -> None:
    line = (
        "see `enginecache/service/serving/hitpath.py`, core/store.py, tests/test_*.py and docs/x.md; "
        "not /run/enginecache/serving.json, postgresql://u@db/engines or $HOME/enginecache/x.json"
    )
    assert [m.group(1) for m in _PATH.finditer(line)] == [
        "enginecache/service/serving/hitpath.py",
        "core/store.py",
        "tests/test_*.py",
        "docs/x.md",
    ]
    assert path_exists("enginecache/service/serving/hitpath.py")
    assert path_exists("core/backends/<name>/")
    assert not path_exists("enginecache/service/runtime.py")
    assert module_exists("service.serving.engineload._load_in_place")
    assert module_exists("enginecache.service.serving")
    assert not module_exists("service.coverage")
    assert not module_exists("service.engines.records.no_such_function")


@pytest.mark.parametrize("kind", ["path", "module"])
def test_every_cited_path_and_module_exists(kind: str) -> None:
    if kind == "path":
        missing = [f"{where}: {cited}" for where, cited in _citations(_PATH) if not path_exists(cited)]
    else:
        missing = [f"{where}: {cited}" for where, cited in _citations(_MODULE) if not module_exists(cited)]
    assert missing == [], "the docs cite what the repository does not hold:\n" + "\n".join(missing)


# A section of a doc cited by its title: `docs/runtime.md, "Exports"` or `docs/performance.md ("Verified read"`.
_SECTION = re.compile(r'(docs/[\w-]+\.md),? \(?"([^"]+)"')


def section_titles(doc: Path) -> list[str]:
    """A doc's headings and the bold words that open its paragraphs and items, lower case, no backticks.
    docs/performance.md is written by `make bench` from the sections bench modules declare, so a title
    a bench module writes counts there before the page is next regenerated."""
    text = doc.read_text(encoding="utf-8")
    titles = re.findall(r"^#+ (.+)$", text, re.MULTILINE) + re.findall(r"\*\*(.+?)\*\*", text)
    if doc == ROOT / "docs" / "performance.md":
        for module in sorted((ROOT / "bench").glob("*.py")):
            tree = ast.parse(module.read_text(encoding="utf-8"))
            titles += [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return [title.replace("`", "").lower() for title in titles]


def test_every_cited_section_exists() -> None:
    sources = [*DOCS, *sorted((ROOT / "enginecache").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]
    missing = []
    for source in sources:
        for doc, title in _SECTION.findall(source.read_text(encoding="utf-8")):
            titles = section_titles(ROOT / doc) if (ROOT / doc).is_file() else []
            title = " ".join(title.split())  # a title may wrap onto the next line
            if not any(title.lower() in candidate for candidate in titles):
                missing.append(f"{source.relative_to(ROOT)}: {doc}, {title!r}")
    assert missing == [], "no such section:\n" + "\n".join(missing)


def test_no_design_citation_points_outside_the_repository() -> None:
    sources = [*DOCS, *sorted((ROOT / "enginecache").rglob("*.py"))]
    citing = [str(path.relative_to(ROOT)) for path in sources if "DESIGN.md" in path.read_text(encoding="utf-8")]
    assert citing == [], "cite docs/design-decisions.md instead of DESIGN.md in: " + ", ".join(citing)
