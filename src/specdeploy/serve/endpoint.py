"""`specdeploy endpoint`: the deployed engine's API on this machine. Engines bind the host's
loopback (no API key needed, nothing exposed), so the way in is an SSH forward with the inventory's
own key and known_hosts; it is restarted if its session drops, and closed on Ctrl-C."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from specdeploy import names
from specdeploy.connection import HostConnection
from specdeploy.errors import SpecdeployError
from specdeploy.targets import Forward

DEFAULT_LOCAL_PORT = 8000


@dataclass(frozen=True)
class Endpoint:
    host: str  # inventory hostname
    url: str  # http://127.0.0.1:PORT/v1 on this machine
    model: str
    api_key_set: bool
    answering: bool

    def example(self) -> list[str]:
        """Two lines for the `openai` client (the key is never printed; it comes from the environment)."""
        key = 'os.environ["OPENAI_API_KEY"]' if self.api_key_set else '"EMPTY"'
        return [
            "from openai import OpenAI" + ("; import os" if self.api_key_set else ""),
            f'print(OpenAI(base_url="{self.url}", api_key={key}).chat.completions.create(model="{self.model}", '
            'messages=[{"role": "user", "content": "Hello"}]).choices[0].message.content)',
        ]


def _describe(name: str, hostvars: Mapping[str, Any], forward: Forward) -> Endpoint:
    base = f"http://127.0.0.1:{forward.local}"
    model, answering = str(hostvars.get("serving_served_model_name") or "model"), False
    try:
        resp = httpx.get(f"{base}/v1/models", timeout=10)
        answering = resp.status_code in (200, 401)
        if resp.status_code == 200 and resp.json().get("data"):
            model = str(resp.json()["data"][0]["id"])
    except httpx.HTTPError:
        pass
    return Endpoint(name, f"{base}/v1", model, bool(hostvars.get("serving_api_key")), answering)


def open_endpoints(hosts: Mapping[str, Mapping[str, Any]], local_port: int) -> list[tuple[Endpoint, Forward]]:
    """One forward per host, on LOCAL_PORT, LOCAL_PORT+1, ... (0: any free port)."""
    opened: list[tuple[Endpoint, Forward]] = []
    try:
        for i, (name, hostvars) in enumerate(hosts.items()):
            forward = HostConnection.from_hostvars(hostvars).forward(
                int(hostvars.get("serving_port") or names.SERVING_PORT), local_port + i if local_port else 0
            )
            forward.start()
            opened.append((_describe(name, hostvars, forward), forward))
    except BaseException:
        close(opened)
        raise
    if not opened:
        raise SpecdeployError("the inventory has no hosts", hint="make deploy first")
    return opened


def close(opened: list[tuple[Endpoint, Forward]]) -> None:
    for _, forward in opened:
        forward.stop()
