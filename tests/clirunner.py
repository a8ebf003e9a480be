"""Run the real `enginecache` entry point in-process and capture its exit code and output."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from enginecache.cli.app import main


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> CliResult:
    argv = sys.argv
    sys.argv = ["enginecache", *args]
    try:
        main()
        code = 0
    except SystemExit as done:
        code = int(done.code or 0)
    finally:
        sys.argv = argv
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)
