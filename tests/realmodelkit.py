"""Measuring the real-model corpus through the product, and rewriting its tables from a measurement.

`Bench` registers every corpus model (tests/corpus.py) in one catalog and runs each cell once: a
build through `service.builds.plan.build_engine` (what `enginecache build` calls), a test-load through
`service.builds.testload.run_test_load` (what `enginecache test-load --here` calls). A cell's verdict is a
`Measured`: `built`; `refused` (the product raised its own error); `raises <Type>` (a library's
exception escaped the product: a bug to fix); for test-loads the run's verdict (`PASS`, `FAIL`,
`ERROR`, `INCOMPATIBLE`, `CORRUPT`); `no engine` where the build made none.

After a change to the product, measure and rewrite tests/test_realmodels.py's `MEASURED` (compact:
`render_expected`, read back by `expand_expected`) and the measured sections of docs/models.md in
place (then review the diff):

    .venv/bin/python tests/realmodelkit.py --write     # or without --write: print only
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from enginecache.errors import EngineCacheError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.testload import run_test_load
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine
from enginecache.service.models.register import get_model, register_model
from tests.corpus import BY_NAME, CORPUS, corpus_path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "models.md"
TEST_FILE = ROOT / "tests" / "test_realmodels.py"
BUILDS = ("rtx fp32", "rtx fp16", "rtx int8", "ort fp32", "ort int8")
LOADS = ("load ort fp32", "load ort int8")
CELLS = BUILDS + LOADS
# A cell's verdict where MEASURED leaves it out: a build `built`, a test-load `PASS`.
DEFAULTS = {**dict.fromkeys(BUILDS, "built"), **dict.fromkeys(LOADS, "PASS")}
TARGETS = {"rtx": ("sm86",)}  # per backend that needs them: one compute capability keeps each build short
LOAD_ITERATIONS = 3
BEGIN, END = "<!-- measured: begin -->", "<!-- measured: end -->"
CODE_BEGIN, CODE_END = "# >>> measured (tests/realmodelkit.py --write)", "# <<< measured"
LINE_LENGTH = 120  # pyproject.toml's: a model's verdicts on one line where they fit


@dataclass(frozen=True)
class Measured:
    kind: str
    message: str = ""
    engine_id: int | None = None
    seconds: float = 0.0

    def matches(self, expected: str) -> bool:
        """`kind` or `kind: fragment` (the fragment somewhere in the message)."""
        kind, _, fragment = expected.partition(": ")
        return self.kind == kind and fragment in self.message

    def expectation(self) -> str:
        """This verdict as an EXPECTED entry: the kind and a stable fragment of the message."""
        return f"{self.kind}: {fragment_of(self.message)}" if self.message and self.kind != "PASS" else self.kind


def fragment_of(message: str, limit: int = 72) -> str:
    """The telling part of a message, without what changes from run to run (engine ids): the
    library's own words where it has them (TensorRT's "Error Code N: ... (<this>", ONNX Runtime's
    last "Status Message: <this>"), else the start."""
    text = re.sub(r"^(?:build \d+ failed|engine \d+ failed to build): ", "", message).split("\n")[0]
    for pattern in (r".*?Error Code \d+: [^(]*\((.+)", r".*Status Message: (.+)"):
        found = re.match(pattern, text)
        if found:
            text = found.group(1)
            break
    # An accuracy failure's counts and worst values move with the CPU's int8 kernels (ISA, library
    # version): the verdict is which outputs fell outside which tolerances, not by how many elements.
    text = re.sub(r"(outside \S+ tolerances): .*", r"\1", text)
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return cut[: cut.rfind(" ")] if " " in cut else cut


class Bench:
    """Runs cells on one catalog, once each (a test-load reuses its build's verdict)."""

    def __init__(self, app: AppContext) -> None:
        self.app = app
        self.done: dict[tuple[str, str], Measured] = {}
        for model in CORPUS:
            register_model(app, corpus_path(model.name), name=model.name)

    def measure(self, model: str, cell: str) -> Measured:
        if (model, cell) not in self.done:
            build = self.measure(model, cell.removeprefix("load ")) if cell in LOADS else None
            started = time.perf_counter()
            got = self._load(build) if build is not None else self._build(model, *cell.split())
            self.done[model, cell] = replace(got, seconds=time.perf_counter() - started)
        return self.done[model, cell]

    def engine_io(self, model: str, cell: str) -> list[dict[str, Any]]:
        """The IO the cell's engine recorded at build."""
        engine_id = self.measure(model, cell).engine_id
        assert engine_id is not None, f"{model} {cell} made no engine"
        return list(get_engine(self.app, engine_id).io)

    def inspection(self, model: str) -> dict[str, Any]:
        """IO (name: dtype[dims]), default-domain opset, whether ModelInfo.quantized says quantized."""
        info = get_model(self.app, model).info
        return {
            "inputs": signature(info["inputs"]),
            "outputs": signature(info["outputs"]),
            "opset": info["opsets"].get("ai.onnx", info["opsets"].get("")),
            "quantized": bool(info.get("quantized")),
        }

    def _build(self, model: str, backend: str, precision: str) -> Measured:
        targets = TARGETS.get(backend, ())
        request = BuildRequest(model=model, backend=backend, targets=targets, precision=precision)
        try:
            result = build_engine(self.app, request)
        except EngineCacheError as err:
            return Measured("refused", str(err))
        except Exception as err:  # noqa: BLE001  a library's exception escaping the product is a verdict too
            return Measured(f"raises {type(err).__name__}", str(err))
        return Measured("built", "", result.engine.id)

    def _load(self, build: Measured) -> Measured:
        if build.engine_id is None:
            return Measured("no engine")
        try:
            run = run_test_load(self.app, build.engine_id, iterations=LOAD_ITERATIONS)
        except EngineCacheError as err:
            return Measured("refused", str(err))
        except Exception as err:  # noqa: BLE001  as above
            return Measured(f"raises {type(err).__name__}", str(err))
        return Measured(run.verdict, run.reason or "")


def signature(tensors: list[dict[str, Any]]) -> str:
    def dim(d: object) -> str:
        text = str(d)
        return text if len(text) <= 32 else text[:15] + "…"

    return "; ".join(f"{t['name']}: {t['dtype']}[{', '.join(dim(d) for d in t['shape'])}]" for t in tensors)


# -- the tables -----------------------------------------------------------------------------------


def verdict_header() -> list[str]:
    return ["| model | source wheel | kind | " + " | ".join(CELLS) + " |", "| --- " * (3 + len(CELLS)) + "|"]


def docs_verdicts(text: str) -> dict[str, list[str]]:
    """The verdict words of the docs' verdict table: rows whose first cell is a corpus model."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in BY_NAME and len(cells) == 3 + len(CELLS):
            rows[cells[0]] = cells[3:]
    return rows


def measured_expectations(bench: Bench) -> dict[str, dict[str, str]]:
    """Every cell's verdict as an EXPECTED entry, measured."""
    return {model: {cell: bench.measure(model, cell).expectation() for cell in CELLS} for model in BY_NAME}


def expand_expected(measured: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    """MEASURED (per model the cells off DEFAULTS, a key naming one cell or several: "rtx fp16, rtx
    int8") as every model's verdict for every cell, in CELLS order."""
    expected: dict[str, dict[str, str]] = {}
    for model, entries in measured.items():
        cells = dict(DEFAULTS)
        named: list[str] = []
        for key, verdict in entries.items():
            for cell in key.split(", "):
                if cell not in cells or cell in named:
                    raise ValueError(f"MEASURED[{model!r}]: {cell!r} is no cell or is named twice")
                named.append(cell)
                cells[cell] = verdict
        expected[model] = cells
    return expected


def render_expected(expected: Mapping[str, Mapping[str, str]]) -> str:
    """MEASURED's source (as ruff formats it) for `expected`, every model's verdict for every cell:
    the cells off DEFAULTS, those with one verdict under one key; a model on one line if it fits."""
    lines = [CODE_BEGIN, "MEASURED: dict[str, dict[str, str]] = {"]
    for model, cells in expected.items():
        groups: dict[str, list[str]] = {}
        for cell in CELLS:
            if cells[cell] != DEFAULTS[cell]:
                groups.setdefault(cells[cell], []).append(cell)
        entries = [f"{json.dumps(', '.join(names))}: {json.dumps(verdict)}" for verdict, names in groups.items()]
        one_line = f"    {json.dumps(model)}: {{{', '.join(entries)}}},"
        if len(one_line) <= LINE_LENGTH:
            lines.append(one_line)
        else:
            lines += [f"    {json.dumps(model)}: {{", *(f"        {entry}," for entry in entries), "    },"]
    return "\n".join([*lines, "}", CODE_END])


def _cell_text(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_docs(bench: Bench) -> str:
    lines = [BEGIN, "", *verdict_header()]
    for name, model in BY_NAME.items():
        verdicts = [bench.measure(name, cell).kind for cell in CELLS]
        lines.append(f"| {name} | {model.requirement} | {model.role} | " + " | ".join(verdicts) + " |")
    lines += ["", "Seconds per cell on this 2-core machine (wall clock, shared with other work):", ""]
    lines += ["| model | " + " | ".join(CELLS) + " | total |", "| --- " * (2 + len(CELLS)) + "|"]
    total = 0.0
    for name in BY_NAME:
        seconds = [bench.measure(name, cell).seconds for cell in CELLS]
        total += sum(seconds)
        lines.append(f"| {name} | " + " | ".join(f"{s:.1f}" for s in seconds) + f" | {sum(seconds):.1f} |")
    lines += [
        "",
        f"All cells: {total:.0f} s.",
        "",
        "Each failure with the product's and the backend's own message:",
        "",
    ]
    lines += ["| model | cell | verdict | message |", "| --- | --- | --- | --- |"]
    for name in BY_NAME:
        for cell in CELLS:
            got = bench.measure(name, cell)
            if got.message and got.kind != "PASS":
                text = _cell_text(re.sub(r"^(?:build \d+ failed|engine \d+ failed to build): ", "", got.message))
                lines.append(f"| {name} | {cell} | {got.kind} | {text[:700]} |")
    return "\n".join([*lines, "", END])


def _between(text: str, begin: str, end: str, new: str) -> str:
    start, stop = text.index(begin), text.index(end) + len(end)
    return text[:start] + new + text[stop:]


def write(bench: Bench) -> None:
    code = render_expected(measured_expectations(bench))
    TEST_FILE.write_text(_between(TEST_FILE.read_text(), CODE_BEGIN, CODE_END, code))
    DOCS.write_text(_between(DOCS.read_text(), BEGIN, END, render_docs(bench)))


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        app = AppContext.from_settings(Path(scratch) / "home")
        try:
            bench = Bench(app)
            print("INSPECT = {")
            for model in BY_NAME:
                print(f"    {json.dumps(model)}: {bench.inspection(model)!r},")
            print("}\n")
            print(render_expected(measured_expectations(bench)) + "\n\n" + render_docs(bench))
            if "--write" in argv:
                write(bench)
                print(f"rewrote MEASURED in {TEST_FILE} and the measured sections of {DOCS}", file=sys.stderr)
        finally:
            app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
