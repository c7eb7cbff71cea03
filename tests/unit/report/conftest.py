"""The report tests' runs tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.report.helpers import HOST, REFUSAL, bench, figures, verdict, write_run


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Five rollouts, oldest first: benchmarked, failed start-up, refused by the gate, benchmarked, no gate."""
    host = tmp_path / "runs" / HOST
    write_run(host, "20261201T090000-101", verdict(), bench(400.5, ttft=(41.0, 91.0), itl=(11.0, 31.0)))
    write_run(host, "20261201T100000-202", verdict("FAILED", elapsed_s=15.3))
    write_run(host, "20261201T110000-303", verdict(), bench(250.2, previous=figures(400.5), problems=(REFUSAL,),
                                                            length=1.1, positions=(0.5, 0.3, 0.1)))  # fmt: skip
    write_run(host, "20261201T120000-404", verdict(), bench(410.7, previous=figures(400.5), ttft=(38.0, 80.0)))
    write_run(host, "20261201T130000-505", verdict())  # an older run, or a gate that was not run
    (host / "20261201T085500").mkdir()  # an image build's folder: a log, no verdict, not a rollout
    (host / "20261201T085500" / "image-build.log").write_text("built\n")
    return tmp_path / "runs"
