"""roles/monitoring on the test bed, beside a READY engine (test_serving.py calls it while its engine
serves): Debian's Prometheus and Alertmanager installed and bound to loopback, the engine scraped, every
generated rule fired and kept quiet by promtool, every dashboard query answered by the live Prometheus,
and a rerun that changes nothing. Grafana itself is not installed or run anywhere."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from specdeploy.monitoring import consoles, dashboards
from specdeploy.playbook import parse_recap, run_playbook
from specdeploy.serve import hosts as serving_hosts
from specdeploy_testbed import testbed
from tests.support import promtool_cases

PROMETHEUS = "http://127.0.0.1:9090"


def listening(container: Any) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket on the host, from /proc/net/tcp{,6}."""
    out = container.exec_run(["sh", "-c", "cat /proc/net/tcp /proc/net/tcp6"]).output.decode()
    found = set()
    for line in out.splitlines()[1:]:
        cells = line.split()
        if len(cells) < 4 or cells[3] != "0A":  # 0A: LISTEN
            continue
        address, port = cells[1].split(":")
        if len(address) == 8:
            ip = ".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0))
        else:
            ip = (
                "::1" if address == "00000000000000000000000001000000" else ("::" if set(address) == {"0"} else address)
            )
        found.add((ip, int(port, 16)))
    return found


def query(container: Any, expr: str) -> str:
    """`promtool query instant` on the host: one line per series returned."""
    done = container.exec_run(["promtool", "query", "instant", PROMETHEUS, expr])
    assert done.exit_code == 0, (expr, done.output.decode())
    return str(done.output.decode()).strip()


def put(container: Any, folder: Path, dest: str) -> None:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        tar.add(folder, arcname=Path(dest).name)
    container.exec_run(["mkdir", "-p", str(Path(dest).parent)])
    assert container.put_archive(str(Path(dest).parent), data.getvalue())


def deploy_monitoring(tmp_path: Path, *extra: str) -> tuple[int, str]:
    """The site's monitoring play on testbed-1, put in a `monitoring` group by a second inventory."""
    group = tmp_path / "monitoring.yml"
    group.write_text(f"all:\n  children:\n    monitoring:\n      hosts:\n        {testbed.host_name(1)}: {{}}\n")
    run = run_playbook(testbed.paths().inventory, "-i", str(group), "--tags", "monitoring", *extra)
    return run.returncode, run.output


def check(container: Any, tmp_path: Path, traffic: Any) -> None:
    code, output = deploy_monitoring(tmp_path, "-e", "monitoring_alert_kv_saturated=1.5")
    assert code != 0 and "monitoring_alert_kv_saturated must be in (0, 1]" in output, output[-3000:]
    assert "Install Debian's prometheus" not in output  # refused before anything changed on the host
    code, output = deploy_monitoring(tmp_path)
    assert code == 0, output[-4000:]
    ports = listening(container)
    assert ("127.0.0.1", 9090) in ports and ("127.0.0.1", 9093) in ports, ports
    assert not {p for p in ports if p[1] in (9090, 9093, 9094, 9100) and p[0] not in ("127.0.0.1", "::1")}, ports

    deadline = time.monotonic() + 90
    while "=> 1 @" not in query(container, 'up{job="engine"}') and time.monotonic() < deadline:
        time.sleep(2)
    assert "=> 1 @" in query(container, 'up{job="engine"}'), query(container, "up")
    traffic()  # real completions, so the engine's counters and histograms move
    time.sleep(12)  # two more scrapes (5 s apart): a rate has its two samples
    for expr in dashboards.queries("vllm"):
        assert "=>" in query(container, expr), f"no series for the panel query {expr}"

    assert container.exec_run(["promtool", "check", "rules", "/etc/prometheus/specdeploy-rules.yml"]).exit_code == 0
    put(container, promtool_cases.write(tmp_path / "promtool").parent, "/tmp/specdeploy-promtool")
    tested = container.exec_run(["promtool", "test", "rules", "/tmp/specdeploy-promtool/specdeploy-rules.test.yml"])
    assert tested.exit_code == 0 and "SUCCESS" in tested.output.decode(), tested.output.decode()[-4000:]

    check_consoles()
    # A change to Prometheus's arguments restarts Prometheus only, and so does putting it back.
    for extra in (["-e", "monitoring_retention=14d"], []):
        code, output = deploy_monitoring(tmp_path, *extra)
        assert code == 0 and "RUNNING HANDLER [monitoring : Restart Prometheus]" in output, output[-3000:]
        assert "Restart Alertmanager" not in output, output[-3000:]
    code, output = deploy_monitoring(tmp_path)
    assert code == 0 and parse_recap(output)[testbed.host_name(1)]["changed"] == 0, output[-3000:]


def check_consoles() -> None:
    """`specdeploy monitor`'s forwards reach both loopback-only parts from here, over real SSH; the
    test bed's own inventory has no monitoring group, and the command says so before any SSH."""
    hostvars = serving_hosts.inventory_hostvars(testbed.paths().inventory)
    opened = consoles.open_consoles(hostvars, [testbed.host_name(1)], 0)
    try:
        said = {console.part: console.state for console, _ in opened}
        assert re.fullmatch(r"(\d+) of \1 scrape targets up", said["prometheus"]), said
        assert said["alertmanager"] == "answering", said
    finally:
        for _, forward in opened:
            forward.stop()
    done = subprocess.run([sys.executable, "-m", "specdeploy.cli", "monitor"], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode != 0 and "no `monitoring` group" in done.stderr, done.stderr[-2000:]
