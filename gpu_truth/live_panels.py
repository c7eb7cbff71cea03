"""The product's dashboard queries asked of a live Prometheus scraping the live engine, on the GPU machine.

No SGLang runs on the test bed, so this is where its panels meet real series (issue 41). The measuring
call starts Prometheus beside the READY engine, runs the gate's traffic, and then asks every query of the
engine's dashboard (`monitoring.dashboards.queries`). It keeps what each query returned in `panels.json`.

- Prometheus is Debian's package at the version roles/monitoring pins. It is carried as a .deb and unpacked
  under the store (`dpkg -x`, never into /).
- Its scrape configuration is the product's own (`monitoring.scrape.prometheus_config`): one engine target,
  labelled with the host `gpu`, scraped every 2 s. It has no rules and no Alertmanager: only the panels are
  asked here.

Test-bed tooling: never shipped, and it imports nothing of the harness (on_device calls it)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PORT = 9490  # beside the engine's 8000; not the product's 9090, which nothing here needs
HOST = "gpu"  # the `host` label every panel sums by
INTERVAL_S = 2  # a rate over the panels' 1-minute window has its samples well within one sweep level


def binary(store: Path) -> Path | None:
    """Prometheus unpacked from the carried .deb under STORE (None when none was carried)."""
    where = store / "tools-root"
    found = where / "usr" / "bin" / "prometheus"
    if not found.is_file():
        debs = sorted((store / "tools").glob("prometheus_*.deb"))  # `receive` keeps what a call carried
        if not debs:
            return None
        subprocess.run(["dpkg", "-x", str(debs[0]), str(where)], check=True)
    return found if found.is_file() else None


def configuration(engine: str, engine_port: int) -> dict[str, Any]:
    """The product's prometheus.yml for the one engine here, without rules and Alertmanager."""
    from specdeploy.monitoring.scrape import Ports, prometheus_config  # noqa: PLC0415
    from specdeploy.monitoring.targets import EngineTarget  # noqa: PLC0415

    target = EngineTarget(host=HOST, engine=engine, address=f"127.0.0.1:{engine_port}", speculative=True)
    config = prometheus_config([target], HOST, Ports(prometheus=PORT), interval_s=INTERVAL_S)
    config["rule_files"] = []
    config.pop("alerting", None)
    config["scrape_configs"] = [j for j in config["scrape_configs"] if j["job_name"] != "alertmanager"]
    return config


def ask(engine: str, base: str = f"http://127.0.0.1:{PORT}") -> dict[str, dict[str, Any]]:
    """Every query of ENGINE's dashboard, asked now: the series each returned (a few kept) or its error."""
    from specdeploy.monitoring import dashboards  # noqa: PLC0415

    answers: dict[str, dict[str, Any]] = {}
    for expr in dashboards.queries(engine):
        url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                result = json.loads(resp.read())["data"]["result"]
            answers[expr] = {"series": len(result), "first": result[:3]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            answers[expr] = {"series": 0, "error": str(exc)}
    return answers


def record(folder: Path, engine: str, answers: dict[str, dict[str, Any]], say: Callable[[str], None]) -> int:
    """FOLDER/panels.json, and one line saying how many queries returned series. Returns that number."""
    answered = sum(1 for a in answers.values() if a["series"] > 0)
    doc = {"engine": engine, "asked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "scrape_interval_s": INTERVAL_S, "answered": answered, "queries": answers}  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "panels.json").write_text(json.dumps(doc, indent=2) + "\n")
    silent = [q for q, a in answers.items() if a["series"] == 0]
    say(f"panels: {answered} of {len(answers)} {engine} dashboard queries returned series"
        + (f"; none from: {' | '.join(silent)}" if silent else ""))  # fmt: skip
    return answered


def stop_left(pidfile: Path) -> None:
    """Ends the Prometheus an earlier call left (its call cut before its own stop: it runs in its own
    session, which outlives the call), so this one gets the port."""
    try:
        pid = int(pidfile.read_text())
        if Path(f"/proc/{pid}/comm").read_text().strip() == "prometheus":  # not a pid since reused
            os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.1)
    except (OSError, ValueError):
        pass  # none left, or already gone


@contextlib.contextmanager
def watching(engine: str, engine_port: int, folder: Path, store: Path,
             say: Callable[[str], None]) -> Iterator[Callable[[], None]]:  # fmt: skip
    """Prometheus scraping the engine while the block runs. The callable it gives asks every panel query
    and writes FOLDER/panels.json. Without a carried Prometheus it says so and the callable does nothing.
    A Prometheus that fails is logged, never fatal to the gate."""
    try:
        found, why = binary(store), "no prometheus carried (make gpu-truth carries Debian's)"
    except (OSError, subprocess.CalledProcessError) as exc:
        found, why = None, f"the carried prometheus could not be unpacked ({exc})"
    if found is None:
        say(f"panels: {why}: the dashboard queries are not asked")
        yield lambda: None
        return
    data = store / "prometheus"
    stop_left(data / "prometheus.pid")
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    (data / "prometheus.yml").write_text(json.dumps(configuration(engine, engine_port), indent=2))  # JSON is YAML
    with (data / "prometheus.log").open("w") as log:
        try:
            proc = subprocess.Popen(
                [str(found), f"--config.file={data / 'prometheus.yml'}", f"--storage.tsdb.path={data / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{PORT}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            say(f"panels: prometheus did not start ({exc}): the dashboard queries are not asked")
            yield lambda: None
            return
        (data / "prometheus.pid").write_text(str(proc.pid))
        say(f"panels: prometheus scraping the engine every {INTERVAL_S} s (pid {proc.pid})")

        def ask_now() -> None:
            record(folder, engine, ask(engine), say)

        try:
            yield ask_now
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(data / "prometheus.log", folder / "prometheus.log")
