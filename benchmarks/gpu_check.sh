#!/usr/bin/env bash
# The GPU checks and figures of benchmarks/README.md in one go, for a session with a lent H100/H200
# (about 10 minutes). Run from the repository root:  bash benchmarks/gpu_check.sh
# The 147M model's benchmark batch is 8 x 4096 bytes (the training config's 128 sequences run as
# 16 micro-batches of 8; one micro-batch is what a step's kernels see).
set -euo pipefail
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# kernels against their references on the device (the CPU suite runs them in Triton's interpreter)
python -m pytest -q -p no:cacheprovider tests/test_scan.py tests/test_attention.py -k cuda
python benchmarks/scan.py --device cuda --repeats 50
for kernel in blocked flex; do
  python benchmarks/throughput.py --config paper_147m_fineweb --device cuda --bf16 --steps 10 --warmup 3 \
      train.batch_size=8 train.micro_batches=1 model.attention=$kernel
done
python benchmarks/throughput.py --config paper_147m_fineweb --device cuda --bf16 --compile --steps 10 --warmup 5 \
    train.batch_size=8 train.micro_batches=1 model.attention=flex
