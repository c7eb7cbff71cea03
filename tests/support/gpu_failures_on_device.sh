#!/usr/bin/env bash
# On the lent GPU machine (device tool): each scenario of gpu_failures.py judged by the watchdog.
# Logs, verdicts and the watch's first lines go to $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:src
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader > "$OUT/gpu.txt"
python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' >> "$OUT/gpu.txt"
for s in ${SCENARIOS:-oom device-assert wrong-arch nccl-no-peer}; do
  python3 -c 'import argparse, sys; from specdeploy.watch import cli
p = argparse.ArgumentParser(); cli.add_arguments(p); sys.exit(cli.run(p.parse_args()))' \
    --no-progress --stall-timeout 120 --timeout 300 --log-file "$OUT/$s.log" --json "$OUT/$s.verdict.json" \
    --diagnostics /tmp/diag -- python3 tests/support/gpu_failures.py "$s" > "$OUT/$s.watch.txt" 2>&1
  echo "$s rc=$? $(head -1 "$OUT/$s.watch.txt")"
done
tar -C "$OUT" -czf /tmp/gpu-failures.tgz . && rm -f "$OUT"/* && mv /tmp/gpu-failures.tgz "$OUT/"
