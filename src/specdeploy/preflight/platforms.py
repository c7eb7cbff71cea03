"""The target platforms specdeploy supports, decided once here and asserted by Ansible.

The roles install NVIDIA's open driver modules, CUDA and the NVIDIA Container Toolkit from
vendor apt repositories, which exist for these releases only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SUPPORTED_RELEASES: dict[str, tuple[str, ...]] = {
    "Debian": ("12",),
    "Ubuntu": ("22.04", "24.04"),
}
SUPPORTED_ARCHITECTURES = ("x86_64",)
# ansible-core 2.19 needs >= 3.8 on the target; the oldest supported release ships 3.10.
MIN_TARGET_PYTHON = (3, 10)


def supported_matrix() -> str:
    return ", ".join(f"{name} {ver}" for name, vers in SUPPORTED_RELEASES.items() for ver in vers)


def _release_matches(distribution: str, major: str, full: str) -> bool:
    releases = SUPPORTED_RELEASES.get(distribution, ())
    return major in releases or full in releases


def platform_problems(facts: Mapping[str, Any]) -> list[str]:
    """What makes this host unsupported, from Ansible's gathered facts; empty when supported."""
    problems: list[str] = []
    distribution = str(facts.get("distribution", "unknown"))
    full = str(facts.get("distribution_version", ""))
    major = str(facts.get("distribution_major_version", ""))
    family = str(facts.get("os_family", "unknown"))
    if not _release_matches(distribution, major, full):
        problems.append(
            f"unsupported OS {distribution} {full or major} (os_family {family}); "
            f"specdeploy supports {supported_matrix()}"
        )
    arch = str(facts.get("architecture", "unknown"))
    if arch not in SUPPORTED_ARCHITECTURES:
        problems.append(f"unsupported CPU architecture {arch}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    python = facts.get("python") or {}
    info = python.get("version_info") or []
    version = tuple(int(part) for part in info[:2]) if len(info) >= 2 else None
    if version is None or version < MIN_TARGET_PYTHON:
        found = ".".join(str(p) for p in version) if version else "unknown"
        executable = python.get("executable", "python3")
        problems.append(
            f"target Python {found} at {executable} is too old; need >= {'.'.join(map(str, MIN_TARGET_PYTHON))}"
        )
    return problems
