#!/usr/bin/env bash
# The checks that need a GPU, in one run (CI has none: there they are skipped, and
# said to be): the probe's step path makes no host/device synchronisation (sampled
# steps included), its pinned buffers and events are reused, and the whole-step ratio
# of (a), (b), (c) trained on the GPU against a bare twin in the same run.
#
#   bash scripts/gpu_checks.sh            (from the repository root; PYTHON=... to pick)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python}
"$python" -c "import torch, sys; ok = torch.cuda.is_available(); print('torch', torch.__version__, 'cuda', ok and torch.cuda.get_device_name(0)); sys.exit(0 if ok else 1)" || {
  echo "no CUDA device here: nothing to check" >&2
  exit 1
}
status=0
"$python" -m pytest -q -p no:cacheprovider -rs tests/runtime/test_cuda.py tests/runtime/test_probe_cost.py || status=1
"$python" tests/bench/probe_overhead.py --quick --default-only --no-frameworks --device cuda || status=1
exit $status
