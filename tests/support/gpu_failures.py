"""Real CUDA failures, made on a real GPU (the lent H200), for the watchdog's corpus.

    python tests/support/gpu_failures.py oom|device-assert|wrong-arch|nccl-no-peer

Each scenario is a short PyTorch program that fails the way engines fail at start-up; their
output is what PyTorch, CUDA and NCCL print. Not an engine: the corpus marks these logs
`made_here` with the machine they ran on. Run under `specdeploy watch -- ...` there.
"""

from __future__ import annotations

import os
import sys

import torch


def oom() -> None:
    print("Loading weights onto cuda:0", flush=True)
    _free, total = torch.cuda.mem_get_info()
    torch.empty(int(total * 1.5), dtype=torch.uint8, device="cuda")


def device_assert() -> None:
    table = torch.arange(8, device="cuda")
    index = torch.tensor([3, 11], device="cuda")  # 11 is out of bounds: IndexKernel's assert
    print(table[index].sum().item(), flush=True)


def wrong_arch() -> None:
    """A kernel built only for sm_80 (no PTX to JIT), run on a newer GPU."""
    from torch.utils.cpp_extension import load_inline  # noqa: PLC0415

    cuda = r"""
#include <c10/cuda/CUDAException.h>
__global__ void add_one(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1; }
torch::Tensor run(torch::Tensor x) {
  add_one<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), x.numel());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return x;
}
"""
    os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0"
    ext = load_inline("sm80_only", cpp_sources="torch::Tensor run(torch::Tensor x);", cuda_sources=cuda,
                      functions=["run"], extra_cuda_cflags=["-gencode=arch=compute_80,code=sm_80"],
                      extra_include_paths=[], verbose=True)  # fmt: skip
    ext.run(torch.zeros(1024, device="cuda"))
    torch.cuda.synchronize()


def nccl_no_peer() -> None:
    """Rank 0 of 2 waits for a peer that never comes."""
    import datetime  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415

    print("Init torch distributed begin.", flush=True)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29511", world_size=2, rank=0,
                            timeout=datetime.timedelta(seconds=20))  # fmt: skip


SCENARIOS = {"oom": oom, "device-assert": device_assert, "wrong-arch": wrong_arch, "nccl-no-peer": nccl_no_peer}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
