"""Move images between Docker engines without a registry (none is reachable)."""

from __future__ import annotations

from docker.client import DockerClient
from docker.errors import ImageNotFound

from specdeploy.errors import SpecdeployError


def ensure_image_on(destination: DockerClient, source: DockerClient, tag: str) -> bool:
    """Copy `tag` from source to destination (docker save | docker load) unless it is there with
    the same id. Returns True when it copied."""
    try:
        wanted = source.images.get(tag)
    except ImageNotFound as exc:
        raise SpecdeployError(f"image {tag} is not on the source engine") from exc
    try:
        if destination.images.get(tag).id == wanted.id:
            return False
    except ImageNotFound:
        pass
    loaded = destination.images.load(wanted.save(named=True))
    if not any(tag in image.tags for image in loaded):
        raise SpecdeployError(f"loading {tag} on the destination engine did not produce that tag")
    return True
