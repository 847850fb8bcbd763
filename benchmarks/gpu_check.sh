#!/usr/bin/env bash
# The GPU acceptance run: environment, CUDA tests, figures and a learning comparison, each stage under
# 9 minutes on one H100/H200, writing report.md and report.json (see benchmarks/gpu_check.py).
#   bash benchmarks/gpu_check.sh                               # every stage in order, about 25 minutes
#   bash benchmarks/gpu_check.sh --stage tests                 # or figures, learn (--strategy uniform|learned)
#   bash benchmarks/gpu_check.sh --dry-run                     # all of it on a CPU with tiny sizes (a minute)
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 benchmarks/gpu_check.py "$@"
