"""A worker's membership in the fleet's router, steered by the watchdog's verdicts.

The router listens on its host's loopback; the controller reaches its worker API through an SSH
forward. `leave` runs just before an engine is stopped (the rollout's `before_stop`), `join` only
after a READY verdict, so the router never sends a request to an engine that is loading or gone.
The sentinel beside the router re-adds a registered worker that serves but is not a member (after
a router restart); `hold` before the rollout begins keeps it from re-adding this one meanwhile, and
`join` releases it. A rollout that fails without a READY engine leaves its host held: out of the
router until a deploy brings it READY.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from specdeploy.connection import HostConnection
from specdeploy.errors import SpecdeployError
from specdeploy.fleet.router_api import SENTINEL_PORT, hold_url, members_url, membership_url

TIMEOUT_S = 30.0  # add_worker waits for the worker's /health; a READY engine answers at once


class RouterMembership:
    def __init__(self, router: HostConnection, router_port: int, worker: str, say: Callable[[str], None],
                 sentinel_port: int = SENTINEL_PORT) -> None:  # fmt: skip
        self.router, self.port, self.worker, self.say = router, router_port, worker, say
        self.sentinel_port = sentinel_port

    def _request(self, method: str, call: Callable[[int], str], *, service: str = "router") -> httpx.Response:
        """CALL gives the URL for a local port: the forward's, to the router's (or the sentinel's)
        loopback port on the router host."""
        forward = self.router.forward(self.port if service == "router" else self.sentinel_port)
        forward.start()
        try:
            with httpx.Client(timeout=TIMEOUT_S) as http:
                return http.request(method, call(forward.local))
        except httpx.HTTPError as exc:
            raise SpecdeployError(
                f"the {service} on {self.router} did not answer ({exc})",
                hint=f"make status; systemctl status specdeploy-{service} on the router host",
            ) from exc
        finally:
            forward.stop()

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
        resp = self._request("POST", lambda port: membership_url("remove", self.worker, port))
        if resp.status_code != 200:
            raise SpecdeployError(f"the router refused to remove {self.worker}: {resp.status_code} {resp.text[:200]}")
        self.say(f"left the router ({self.worker}); in-flight requests finish before the engine stops")

    def join(self) -> bool:
        """Add the worker unless it is a member, then give it back to the sentinel; True when added."""
        added = self.worker not in self.members()
        if added:
            resp = self._request("POST", lambda port: membership_url("add", self.worker, port))
            if resp.status_code != 200:
                raise SpecdeployError(
                    f"the router refused to add {self.worker}: {resp.status_code} {resp.text[:200]}",
                    hint="the router reaches engines at serving_fleet_address:serving_port; check that address",
                )
            self.say(f"joined the router ({self.worker})")
        self._sentinel("release")
        return added
