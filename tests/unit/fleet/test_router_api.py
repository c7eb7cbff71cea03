from __future__ import annotations

import pytest

from specdeploy.fleet.router_api import hold_url, members_url, membership_url, worker_url


def test_membership_requests_and_worker_urls():
    assert worker_url("172.17.0.3", 8000) == "http://172.17.0.3:8000"
    assert worker_url("fd00::1", 8000) == "http://[fd00::1]:8000"
    call = membership_url("remove", "http://172.17.0.3:8000", 8080)
    assert call == "http://127.0.0.1:8080/remove_worker?url=http%3A%2F%2F172.17.0.3%3A8000"
    assert members_url(8080) == "http://127.0.0.1:8080/list_workers"
    with pytest.raises(ValueError, match="add or remove"):
        membership_url("drop", "http://172.17.0.3:8000", 8080)
    assert (
        hold_url("hold", "http://172.17.0.3:8000", 8081)
        == "http://127.0.0.1:8081/hold?worker=http%3A%2F%2F172.17.0.3%3A8000"
    )
    with pytest.raises(ValueError, match="hold or release"):
        hold_url("add", "http://172.17.0.3:8000", 8081)
