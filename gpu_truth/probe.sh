#!/usr/bin/env bash
# What the lent GPU machine holds (run there, under the device tool): its Python packages, GPU,
# CUDA and disk. The payload builder reads the freeze (gpu_truth/machines/<kind>.txt).
set -u
out=${OUT:-/tmp/probe}; mkdir -p "$out"
{ echo "# python3: $(command -v python3) $(python3 -V 2>&1); date: $(date -u +%FT%TZ)"; python3 -m pip freeze --all 2>/dev/null; } > "$out/pip-freeze.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
{ uname -a; nproc; free -g; df -h / /tmp /root 2>&1; command -v py-spy nvcc gdb; nvcc --version | tail -2; } > "$out/machine.txt" 2>&1
python3 -c 'import torch, sys; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_capability(), sys.version)' >> "$out/machine.txt" 2>&1
wc -l "$out/pip-freeze.txt"; cat "$out/machine.txt"
