"""tests/support/alert_cases.yml as promtool's own test files: the rules written as specdeploy writes them
for the cases' context, and one `promtool test rules` test per case."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from specdeploy.monitoring import alerts
from specdeploy.monitoring.targets import EngineTarget, RecordedAcceptance

CASES = Path(__file__).with_name("alert_cases.yml")
RULES_NAME = "specdeploy-rules.yml"


def rules_for(context: dict[str, Any]) -> dict[str, Any]:
    targets = [EngineTarget(**t) for t in context["targets"]]
    records = {h: RecordedAcceptance(host=h, **r) for h, r in context["records"].items()}
    doc, _ = alerts.rule_file(targets, records, alerts.AlertSettings(), router=bool(context["router"]))
    return doc


def _annotations(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """The rule's annotations with `{{ $labels.X }}` expanded from LABELS (they name no `$value`)."""
    return {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m[1], ""), v)
            for k, v in rule["annotations"].items()}  # fmt: skip


def write(folder: Path, cases_file: Path = CASES) -> Path:
    """FOLDER/specdeploy-rules.yml and FOLDER/specdeploy-rules.test.yml; returns the test file."""
    spec = yaml.safe_load(cases_file.read_text())
    rules = rules_for(spec["context"])
    by_alert: dict[str, list[dict[str, Any]]] = {}
    for rule in rules["groups"][0]["rules"]:
        by_alert.setdefault(rule["alert"], []).append(rule)
    tests = []
    for case in spec["cases"]:
        expected = []
        for fired in case["fires"]:
            labels = {k: str(v) for k, v in fired.items()}
            # The rule this alert comes from: the one whose own labels it carries (one per engine).
            rule = next(r for r in by_alert[case["alert"]] if all(labels.get(k) == v for k, v in r["labels"].items()))
            expected.append({"exp_labels": labels, "exp_annotations": _annotations(rule, labels)})
        tests.append({
            "name": case["name"], "interval": spec["interval"],
            "input_series": [{"series": s, "values": str(v)} for s, v in case["series"].items()],
            "alert_rule_test": [{"eval_time": case["at"], "alertname": case["alert"], "exp_alerts": expected}],
        })  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RULES_NAME).write_text(yaml.safe_dump(rules, sort_keys=False, width=1000))
    test_file = folder / "specdeploy-rules.test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": [RULES_NAME], "evaluation_interval": spec["interval"],
                                         "tests": tests}, sort_keys=False, width=1000))  # fmt: skip
    return test_file


def covered(cases_file: Path = CASES) -> dict[str, set[bool]]:
    """Alert name -> the outcomes its cases expect (True: fires): each rule needs both."""
    spec = yaml.safe_load(cases_file.read_text())
    out: dict[str, set[bool]] = {}
    for case in spec["cases"]:
        out.setdefault(case["alert"], set()).add(bool(case["fires"]))
    return out
