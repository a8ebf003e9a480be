"""The operator's release path in a real browser (issue 28, point 8): `enginecache serve` (its own
worker) on a free port, headless Debian Chromium through Playwright, one small MLP in two versions
(tests/modelfactory.py), every engine on ONNX Runtime (seconds on a CPU).

Register v1, build it, test-load it (the verdict where the button was), promote it to prod; register
v2 from the dashboard as the name's new version, build it, promote it (the CLI reads prod back at
v2), roll back (prod at v1 again); the Audit view says each move as `prod: old -> new`, and the
jobs record the dashboard's user as their submitter. The Models page with both versions and the
Audit view land in the test's temp dir, and in ENGINECACHE_SCREENSHOTS when set: that is how
docs/screenshots/releases.png and audit.png are made
(`ENGINECACHE_SCREENSHOTS=docs/screenshots pytest tests/test_operator_walk_e2e.py`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlmodel import select

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import expect, sync_playwright

from enginecache.db.models import EngineRecord, EngineStatus, JobRecord
from enginecache.service.context import AppContext
from enginecache.service.models.releases import versions
from tests import browserkit
from tests.browserkit import generous_expect  # noqa: F401 - autouse: expect() waits TIMEOUT_MS
from tests.modelfactory import make_mlp
from tests.test_serve_e2e import (
    POLL_SECONDS,
    READY_SECONDS,
    served,  # noqa: F401 - the fixture: `enginecache serve` on a free port
)

NAME = "walk"
NO_LOGIN = "dashboard (no login)"  # who the dashboard acts as without a login (dashboard.app)
SHOTS = ("audit", "releases")


def _cli_prod(home: Path) -> tuple[int, int]:
    """(version, model id) that `enginecache release list walk --json` says prod points at."""
    command = [sys.executable, "-m", "enginecache.cli", "--home", str(home), "release", "list", NAME, "--json"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout
    [prod] = [a for a in json.loads(out) if a["alias"] == "prod"]
    return prod["version"], prod["model_id"]


def _ready_ort_engine(app: AppContext, model_id: int) -> int:
    """The READY ONNX Runtime engine of `model_id`, once the worker wrote it (another process)."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        with app.catalog.read() as session:
            engines = session.exec(select(EngineRecord).where(EngineRecord.model_id == model_id)).all()
        assert not [e for e in engines if e.status == EngineStatus.FAILED], [(e.id, e.error) for e in engines]
        ready = [e.id for e in engines if (e.status, e.backend) == (EngineStatus.READY, "ort")]
        if ready:
            return int(ready[0] or 0)
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"model {model_id} has no READY ONNX Runtime engine after {READY_SECONDS:.0f} s")


@pytest.mark.slow
def test_register_build_test_load_new_version_promote_and_roll_back_in_chromium(
    served: tuple[str, AppContext],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    url, app = served
    v1_file = make_mlp(tmp_path / "v1" / f"{NAME}.onnx", seed=1)
    v2_file = make_mlp(tmp_path / "v2" / f"{NAME}.onnx", seed=2)  # other bytes, the same file name
    shots = tmp_path / "screenshots"
    shots.mkdir()
    extra = os.environ.get("ENGINECACHE_SCREENSHOTS")

    with sync_playwright() as pw:
        browser = browserkit.launch(pw)
        page = browserkit.open_page(browser)

        def open_view(path: str) -> None:
            page.goto(f"{url}{path}")
            browserkit.wait_for_app_run(page)

        def shot(name: str) -> None:
            browserkit.wait_for_app_run(page)
            browserkit.wait_for_charts(page)
            path = shots / f"{name}.png"
            page.screenshot(path=str(path), full_page=True)
            if extra:
                Path(extra).mkdir(parents=True, exist_ok=True)
                shutil.copy(path, Path(extra) / path.name)

        def build_on_ort(model_id: int) -> int:
            """Build the model's one missing ONNX Runtime fp32 cell from Coverage; its engine id."""
            open_view(f"/coverage?model={model_id}&backend=ort&precision=fp32")
            page.get_by_role("button", name="Build 1 missing or stale cell(s)").click()
            expect(page.get_by_text(re.compile(rf"{NAME} fp32 ONNX Runtime .*: queued job \d+"))).to_be_visible()
            browserkit.expect_once(
                page.get_by_text(re.compile(r"READY 1 · BUILT 0 · .* · MISSING 0")), timeout_ms=READY_SECONDS * 1000
            )
            return _ready_ort_engine(app, model_id)

        def promote(model_id: int, number: int, versions: int) -> None:
            """Promote the version whose page this is (the form's default) to prod."""
            open_view(f"/models?model={model_id}")
            expect(page.get_by_text(f"version {number} of {versions}")).to_be_visible()
            page.get_by_role("button", name="Promote").click()
            expect(page.get_by_text(f"{NAME}@prod now points at version {number}")).to_be_visible()

        # v1: registered, built, test-loaded (the verdict where the button was), promoted to prod
        open_view("/models")
        browserkit.register_upload(page, v1_file)
        expect(page.get_by_text(re.compile(rf"Registered: {NAME} v1 \(id \d+\)"))).to_be_visible()
        [v1] = [m.id or 0 for m in versions(app, NAME)]
        engine = build_on_ort(v1)
        open_view(f"/engines?engine={engine}")
        test_load = page.get_by_role("button", name="Test-load", exact=True)
        expect(test_load).to_be_enabled()
        test_load.click()
        browserkit.expect_once(
            page.get_by_text(re.compile(r"Test-load job \d+ on .*: PASS")), timeout_ms=READY_SECONDS * 1000
        )
        promote(v1, 1, 1)
        assert _cli_prod(app.home) == (1, v1)

        # v2: the same file name with other bytes, registered as the name's new version from Models
        open_view("/models")
        expect(page.get_by_role("button", name="Register upload")).to_be_visible()  # this run's form is drawn
        page.locator("input[type=file]").first.set_input_files(str(v2_file))
        browserkit.wait_for_app_run(page)
        page.get_by_text(f"Register as a new version of {NAME} (v2)").click()
        browserkit.wait_for_app_run(page)
        page.get_by_role("button", name="Register upload").click()
        expect(page.get_by_text(re.compile(rf"Registered: {NAME} v2 \(id \d+\)"))).to_be_visible()
        v2 = [m.id or 0 for m in versions(app, NAME)][1]
        build_on_ort(v2)

        # promote v2: the CLI reads prod at v2; roll back: prod at v1 again
        promote(v2, 2, 2)
        assert _cli_prod(app.home) == (2, v2)
        shot("releases")
        page.get_by_role("button", name="Roll back prod").click()
        expect(page.get_by_text(f"{NAME}@prod now points at version 1")).to_be_visible()
        assert _cli_prod(app.home) == (1, v1)

        # Audit: the newest event (the roll back) whole, as old -> new
        open_view("/audit")
        # (Streamlit's Markdown draws the "->" as an arrow)
        expect(page.get_by_text(re.compile(rf"prod: v2 \(model {v2}\) (->|→) v1 \(model {v1}\)"))).to_be_visible()
        shot("audit")
        browser.close()

    with app.catalog.read() as session:
        jobs = session.exec(select(JobRecord).order_by(JobRecord.id)).all()
    assert [(j.kind, j.submitted_by) for j in jobs] == [
        ("build", NO_LOGIN),
        ("test_load", NO_LOGIN),
        ("build", NO_LOGIN),
    ], "each job names who submitted it"
    assert sorted(p.name for p in shots.iterdir()) == [f"{n}.png" for n in SHOTS]
