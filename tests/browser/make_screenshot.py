"""The report of an example runs tree (example data: host `example-host`), screenshotted in headless Chromium.

    .venv/bin/python tests/browser/make_screenshot.py [docs/report-screenshot.png]

Also the browser test's toolkit: the example tree, and Chromium's rendered DOM and screenshots.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from specdeploy.report.pages import page_name, write_report

EXAMPLE_HOST = "example-host"
WINDOW = (1280, 1600)
CHROMIUM_TIMEOUT_S = 120
IMAGE = "specdeploy/vllm-cpu:{tag}"
STAGES = [("launched", 0.0), ("importing engine", 5.9), ("resolving config", 6.1), ("loading weights", 18.4),
          ("compiling (torch.compile / autotune)", 24.8), ("profiling KV cache", 41.2),
          ("API server up", 43.0)]  # fmt: skip

# Oldest first. Example data, not a measurement: tokens/s, TTFT and ITL p50/p99 (ms), mean acceptance length,
# acceptance per draft position, image tag, the gate's problems; a status alone is a start-up that never got READY.
EXAMPLE_ROLLOUTS: list[dict[str, object]] = [
    {"run": "20261201T090412-4121", "tps": 402.5, "ttft": (38.2, 88.0), "itl": (9.6, 24.1), "len": 2.71,
     "pos": [0.86, 0.64, 0.45], "tag": "1a2b3c4d5e6f"},
    {"run": "20261201T101733-5530", "tps": 415.0, "ttft": (37.5, 84.3), "itl": (9.4, 23.0), "len": 2.78,
     "pos": [0.87, 0.66, 0.47], "tag": "1a2b3c4d5e6f"},
    {"run": "20261201T112058-6012", "status": "FAILED", "tag": "77aa01c0ffee"},
    {"run": "20261201T113540-6388", "tps": 431.8, "ttft": (36.0, 80.9), "itl": (9.1, 22.2), "len": 2.86,
     "pos": [0.88, 0.69, 0.50], "tag": "2b3c4d5e6f70"},
    {"run": "20261201T140211-7102", "tps": 298.4, "ttft": (51.7, 142.6), "itl": (13.8, 41.0), "len": 1.62,
     "pos": [0.55, 0.24, 0.09], "tag": "3c4d5e6f7081",
     "problems": ["mean acceptance length fell from 2.86 to 1.62 (-43%; bench_max_regression 10%)",
                  "output tokens/s fell from 431.8 to 298.4 (-31%; bench_max_regression 10%)"]},
    {"run": "20261201T151907-7744", "status": "STALLED", "tag": "3c4d5e6f7081"},
    {"run": "20261201T162430-8315", "tps": 440.2, "ttft": (35.4, 78.8), "itl": (8.9, 21.5), "len": 2.93,
     "pos": [0.89, 0.71, 0.52], "tag": "4d5e6f708192"},
    {"run": "20261201T193606-9127", "tps": 447.9, "ttft": (34.8, 77.1), "itl": (8.8, 21.0), "len": 2.97,
     "pos": [0.90, 0.72, 0.54], "tag": "5e6f708192a3"},
]  # fmt: skip


def _verdict(spec: dict[str, object], run: Path) -> dict[str, object]:
    """A verdict.json with the watchdog's field names; a failed start-up stops in resolving config."""
    status = str(spec.get("status", "READY"))
    stages = STAGES if status == "READY" else STAGES[:3] if status == "FAILED" else STAGES[:5]
    elapsed = {"READY": 43.6, "FAILED": 15.3}.get(status, 144.8)
    headline = {
        "READY": "model=example-model completion=8 tokens acceptance=75.0% mean_acceptance_length=3.00 noise=2",
        "FAILED": "ValueError: User-specified max_model_len (99999) is greater than the derived max_model_len "
        "(last stage: resolving config, exit 1)",
        "STALLED": "no progress for 120s at stage 'compiling (torch.compile / autotune)' (process running)",
    }[status]
    ready = status == "READY"
    return {
        "status": status, "elapsed_s": elapsed, "stage": stages[-1][0], "headline": headline,
        "root_cause": None if ready else headline, "exit_code": None if status != "FAILED" else 1,
        "noise": {"future-warning": 2}, "noise_catalogue_version": 2, "grammar_version": 3,
        "stages": [{"stage": label, "at_s": at} for label, at in stages],
        "acceptance": {"rate": 0.75, "mean_length": 3.0, "drafts": 2.0, "draft_tokens": 6.0, "accepted_tokens": 4.5}
        if ready else None,
        "completion": {"tokens": 8, "text": "example!"} if ready else None,
        "stack_summary": [], "diagnostics": str(run), "detected_after_exit_s": None, "notes": [],
    }  # fmt: skip


def _figures(spec: dict[str, object]) -> dict[str, object]:
    ttft, itl, pos = spec["ttft"], spec["itl"], spec["pos"]
    assert isinstance(ttft, tuple) and isinstance(itl, tuple) and isinstance(pos, list)
    length = spec["len"]
    assert isinstance(length, float)
    return {
        "completed": 32, "failed": 0, "duration_s": 12.3, "concurrency": 4, "max_tokens": 64,
        "output_tokens_per_s": spec["tps"], "ttft_ms": {"p50": ttft[0], "p99": ttft[1]},
        "itl_ms": {"p50": itl[0], "p99": itl[1]}, "acceptance_rate": round((length - 1) / len(pos), 3),
        "acceptance_length": length, "per_position_acceptance": pos,
    }  # fmt: skip


def write_example_runs(runs_root: Path) -> Path:
    """`runs_root/example-host/<run id>/`: verdict.json, and bench.json where the gate ran. Returns the host folder."""
    host = runs_root / EXAMPLE_HOST
    promoted: dict[str, object] | None = None  # the gate compares with the last version it let through
    for spec in EXAMPLE_ROLLOUTS:
        run = host / str(spec["run"])
        run.mkdir(parents=True)
        (run / "verdict.json").write_text(json.dumps(_verdict(spec, run), indent=2))
        if "tps" not in spec:
            continue
        figures, problems = _figures(spec), spec.get("problems", [])
        run_id = str(spec["run"])
        bench = {
            "schema": 1, "host": EXAMPLE_HOST, "time": f"{run_id[:4]}-{run_id[4:6]}-{run_id[6:8]}T{run_id[9:11]}:"
            f"{run_id[11:13]}:{run_id[13:15]}Z", "image": IMAGE.format(tag=spec["tag"]),
            "image_id": f"sha256:{spec['tag']}{'0' * 52}", "config_digest": f"sha256:{'c0f1' * 16}",
            "hardware": "example: 16 CPU cores, no GPU", "figures": figures, "previous": promoted,
            "gate": {"enabled": True, "passed": not problems, "problems": problems, "seconds": 14.2},
        }  # fmt: skip
        (run / "bench.json").write_text(json.dumps(bench, indent=2))
        if not problems:
            promoted = figures
    return host


def chromium() -> str | None:
    return shutil.which("chromium")


def _run_chromium(args: list[str]) -> subprocess.CompletedProcess[str]:
    # A throw-away profile: no first-run state, and two runs at once never share a profile lock.
    with tempfile.TemporaryDirectory(prefix="specdeploy-chromium-") as profile:
        binary = chromium()
        assert binary, "chromium is not installed"
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
                   f"--user-data-dir={profile}", *args]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=True)


def dump_dom(page: Path) -> str:
    """The DOM Chromium built from the page, serialised: what a browser shows, not the file's text."""
    return _run_chromium(["--dump-dom", page.resolve().as_uri()]).stdout


def screenshot(page: Path, png: Path, window: tuple[int, int] = WINDOW) -> Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    _run_chromium([f"--screenshot={png.resolve()}", f"--window-size={window[0]},{window[1]}", page.resolve().as_uri()])
    return png


def main(argv: list[str]) -> int:
    png = Path(argv[0] if argv else "docs/report-screenshot.png")
    if chromium() is None:
        print("chromium is not installed: apt-get install -y chromium", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="specdeploy-report-example-") as tmp:
        runs = Path(tmp) / "runs"
        write_example_runs(runs)
        write_report(runs, Path(tmp) / "report")
        screenshot(Path(tmp) / "report" / page_name(EXAMPLE_HOST), png)
    print(f"{png} ({png.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
