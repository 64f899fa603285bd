#!/usr/bin/env bash
# What runs on a machine with one NVIDIA GPU (CI has none): the CUDA tests that skip elsewhere,
# a GPU-side stall and its verdict, and the per-call cost of a 1-rank NCCL all_reduce untraced,
# with PyTorch's recorder and with FLIGHTREC=1, interleaved. Run from the repository root with
# flightrec installed (pip install .) into a Python whose torch has CUDA.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
python setup.py -q build_ext --inplace
echo "== the CUDA tests"
python -m pytest -n 0 -q -p no:cacheprovider -rfEs tests/integration/test_recorder_hooks.py \
    tests/integration/test_recorder_layout.py tests/unit/test_gpu_events.py
echo "== a GPU-side stall (FLIGHTREC_TIMEOUT=3)"
dumps=$(mktemp -d)
FLIGHTREC=1 FLIGHTREC_DIR="$dumps" FLIGHTREC_TIMEOUT=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \
    python benchmarks/nccl_job.py stall
flightrec analyze "$dumps"
echo "== per-call cost, 1-rank NCCL all_reduce of 256 floats"
for round in 1 2 3; do
    for cfg in untraced torch-recorder flightrec; do
        case $cfg in
            untraced) env=(TORCH_FR_BUFFER_SIZE=0) ;;
            torch-recorder) env=(TORCH_FR_BUFFER_SIZE=2000) ;;
            flightrec) env=(TORCH_FR_BUFFER_SIZE=0 FLIGHTREC=1 FLIGHTREC_DIR="$dumps/cost") ;;
        esac
        env "${env[@]}" LABEL=$cfg MASTER_ADDR=127.0.0.1 MASTER_PORT=2952$round \
            python benchmarks/nccl_job.py cost
    done
done
