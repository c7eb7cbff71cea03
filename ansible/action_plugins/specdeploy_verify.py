"""Action `specdeploy_verify`: run the shipped testinfra checks (specdeploy.verify) against this host.

The checks run on the controller over real SSH with the inventory's own settings; of the host's variables,
only those the checks read are templated, so no secret is resolved. The task fails with each failing check
named and the first reasons; it never changes the host. No options: what is checked follows from the
host's variables. Thin: the logic is in specdeploy.verify.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from specdeploy import verify
from specdeploy.actions import SpecdeployAction

# check_serving.py::test_api_port_answers[ssh://testbed-1] PASSED [ 85%]
_OUTCOME = re.compile(r"^(?P<node>check_\w+\.py::\w+)(?:\[[^\]]*\])? (?P<outcome>PASSED|FAILED|SKIPPED|ERROR)")
_SUMMARY = re.compile(r"^=+ (?P<summary>.*(?:passed|failed|error|skipped).*) =+$")


class ActionModule(SpecdeployAction):
    CHANGES_HOSTS = False  # reads and checks only (check mode runs it)
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {}

    def act(self, args: dict[str, Any]) -> dict[str, Any]:
        # Only the names the checks read are templated: a secret is never resolved here.
        names = verify.checked_variables(dict.fromkeys(self.task_vars))
        variables = {k: self._templar.template(self.task_vars[k]) for k in names}
        proc = verify.run([verify.HostUnderCheck(self.host_name, self.connection, variables)], capture=True)
        lines = proc.stdout.splitlines()
        outcomes = {m["node"]: m["outcome"] for line in lines if (m := _OUTCOME.match(line))}
        summary = next((m["summary"] for line in reversed(lines) if (m := _SUMMARY.match(line))), "no summary")
        failed = [node for node, outcome in outcomes.items() if outcome in ("FAILED", "ERROR")]
        reasons = [line[2:] for line in lines if line.startswith("E ")][:10]
        if proc.returncode not in (0, 5) or failed:
            return {"failed": True, "changed": False, "checks": outcomes,
                    "msg": f"verify: {summary}; failed: {', '.join(failed) or proc.stderr[-500:]}",
                    "reasons": reasons}  # fmt: skip
        self.say(f"verify: {summary}")
        return {"changed": False, "checks": outcomes, "msg": f"verify: {summary}"}
