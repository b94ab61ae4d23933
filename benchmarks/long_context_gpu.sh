#!/usr/bin/env bash
# A long-context scan on one GPU: a random-init 1B Llama (`poslens train --preset 1b --steps 0`)
# scanned at 32,768 tokens in bf16 with every statistic, --map-size 1024 block maps and three
# per-head maps of one layer; then the closed-form checks of check_block_scan.py on the result
# (every query's weights sum to 1, so each block row of `probs` and of each head's map sums to
# its rows; key 0's weights lie in [0, 1]; the slash profile at offset 0 is the mean self-weight).
#
#   bash benchmarks/long_context_gpu.sh [WORKDIR]
#
# Environment: SEQ_LEN (32768), NUM_SEQS (8), MAP_SIZE (1024), PRESET (1b), DEVICE (cuda), HEADS,
# DTYPE (bf16). Writes WORKDIR/model, WORKDIR/scan; prints the scan's throughput and peak GPU
# memory (summary.json: throughput.peak_gpu_memory_bytes).
set -euo pipefail
WORK=${1:-long_context}
S=${SEQ_LEN:-32768}
mkdir -p "$WORK"
here=$(dirname "$0")
t0=$(date +%s)
python -m poslens train --preset "${PRESET:-1b}" --steps 0 --max-positions "$S" --device "${DEVICE:-cuda}" \
    --out "$WORK/model" --overwrite --quiet
t1=$(date +%s)
echo "train --steps 0: $((t1 - t0)) s"
python -m poslens scan "$WORK/model" --data random --seq-len "$S" --num-seqs "${NUM_SEQS:-8}" --batch-size 1 \
    --map-size "${MAP_SIZE:-1024}" --heads "${HEADS:-5.3,5.7,5.31}" --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bf16}" \
    --out "$WORK/scan" --overwrite --quiet
t2=$(date +%s)
echo "scan: $((t2 - t1)) s wall (load, forward and capture, finalize)"
python "$here/check_block_scan.py" "$WORK/scan"
