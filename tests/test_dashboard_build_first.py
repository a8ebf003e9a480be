"""The Build page opens on the form (issue 28, point 13): New builds comes before the job list,
which ten job cards used to push some 1,800 px down."""

from __future__ import annotations

from enginecache.db.models import JobRecord, JobStatus
from tests.dashboardkit import Seeded, view


def test_the_build_form_comes_before_the_job_list(seeded: Seeded) -> None:
    with seeded.app.catalog.write() as session:
        for i in range(10):
            session.add(JobRecord(kind="build", status=JobStatus.FAILED, payload={}, error=f"failed {i}"))
    at = view("build").run()
    assert not at.exception, at.exception
    headings = [s.value for s in at.subheader]
    assert headings.index("New builds") < headings.index("Jobs"), headings
    assert at.multiselect(key="build_targets") is not None, "the form is drawn"
