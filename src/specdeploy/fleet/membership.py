"""A worker's membership in the fleet's router, steered by the watchdog's verdicts.

The router listens on its host's loopback; the controller reaches its worker API through an SSH
forward. `leave` runs just before an engine is stopped (the rollout's `before_stop`), `join` only
after a READY verdict, so the router never sends a request to an engine that is loading or gone.
The sentinel beside the router re-adds a registered worker that serves but is not a member (after
a router restart); `hold` before the rollout begins keeps it from re-adding this one meanwhile, and
`join` releases it. A rollout that fails without a READY engine leaves its host held: out of the
router until a deploy brings it READY.

The router may restart under a rollout (a crash: systemd brings it back in 2 s, with no workers): its
calls wait for it up to `patience_s`, saying so. If it stays down, the host is given back to the
sentinel before the rollout stops (released), so a proven engine is never left out: the sentinel adds
it once the router answers and the engine answers a completion.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from specdeploy.connection import HostConnection
from specdeploy.errors import SpecdeployError
from specdeploy.fleet.router_api import SENTINEL_PORT, hold_url, members_url, membership_url

TIMEOUT_S = 30.0  # add_worker waits for the worker's /health; a READY engine answers at once
ROUTER_PATIENCE_S = 60.0  # a crashed router is back in seconds (Restart=always, RestartSec=2)


class RouterMembership:
    def __init__(self, router: HostConnection, router_port: int, worker: str, say: Callable[[str], None],
                 sentinel_port: int = SENTINEL_PORT, *, patience_s: float = ROUTER_PATIENCE_S) -> None:  # fmt: skip
        self.router, self.port, self.worker, self.say = router, router_port, worker, say
        self.sentinel_port, self.patience_s = sentinel_port, patience_s

    def _request(self, method: str, call: Callable[[int], str], *, service: str = "router") -> httpx.Response:
        """CALL gives the URL for a local port: the forward's, to the router's (or the sentinel's)
        loopback port on the router host. The router is waited for (see the module's text); the
        sentinel is not: a rollout that cannot hold its host must not begin."""
        deadline = time.monotonic() + (self.patience_s if service == "router" else 0.0)
        while True:
            forward = self.router.forward(self.port if service == "router" else self.sentinel_port)
            forward.start()
            try:
                with httpx.Client(timeout=TIMEOUT_S) as http:
                    return http.request(method, call(forward.local))
            except httpx.HTTPError as exc:
                if time.monotonic() >= deadline:
                    waited = f" for {self.patience_s:.0f} s" if service == "router" else ""
                    raise SpecdeployError(
                        f"the {service} on {self.router} did not answer{waited} ({exc})",
                        hint=f"make status; systemctl status specdeploy-{service} on the router host",
                    ) from exc
                self.say(f"the router on {self.router} did not answer ({type(exc).__name__}); waiting for it "
                         f"(up to {self.patience_s:.0f} s: it restarts under systemd)")  # fmt: skip
                time.sleep(1.0)
            finally:
                forward.stop()

    def _give_back(self) -> None:
        """The router stayed down: the host goes back to the sentinel, which adds its engine once both answer."""
        try:
            self._sentinel("release")
        except SpecdeployError as exc:
            self.say(f"could not release {self.worker} to the sentinel ({exc}): it stays held until a deploy")

    def _sentinel(self, action: str) -> None:
        resp = self._request("POST", lambda port: hold_url(action, self.worker, port), service="sentinel")
        if resp.status_code != 200:
            raise SpecdeployError(
                f"the sentinel refused to {action} {self.worker}: {resp.status_code} {resp.text[:200]}"
            )

    def hold(self) -> None:
        """Before anything changes: the sentinel must not re-add this worker during the rollout."""
        self._sentinel("hold")

    def members(self) -> list[str]:
        resp = self._request("GET", members_url)
        resp.raise_for_status()
        return [str(u) for u in resp.json().get("urls", [])]

    def leave(self) -> None:
        try:
            resp = self._request("POST", lambda port: membership_url("remove", self.worker, port))
        except SpecdeployError:
            self._give_back()  # the engine still runs, proven: nothing was stopped
            raise
        if resp.status_code != 200:
            raise SpecdeployError(f"the router refused to remove {self.worker}: {resp.status_code} {resp.text[:200]}")
        self.say(f"left the router ({self.worker}); in-flight requests finish before the engine stops")

    def join(self) -> bool:
        """Add the worker unless it is a member, then give it back to the sentinel; True when added."""
        try:
            added = self.worker not in self.members()
            resp = self._request("POST", lambda port: membership_url("add", self.worker, port)) if added else None
        except SpecdeployError:
            self._give_back()  # READY and proven: the sentinel adds it when the router is back
            raise
        if resp is not None:
            if resp.status_code != 200:
                raise SpecdeployError(
                    f"the router refused to add {self.worker}: {resp.status_code} {resp.text[:200]}",
                    hint="the router reaches engines at serving_fleet_address:serving_port; check that address",
                )
            self.say(f"joined the router ({self.worker})")
        self._sentinel("release")
        return added
