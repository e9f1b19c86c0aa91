#!/usr/bin/env bash
# The digits CNN end to end: compile the float model with our int8 calibration, check
# accuracy with the golden model, simulate the Verilog in Verilator with random AXI-Stream
# stalls against the golden model on the first 50 test digits, and build a bitstream for the
# ULX3S 85F.
#
#   bash examples/cnn_digits/run.sh [OUT_DIR]      (default: out/cnn_digits; it is replaced)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-out/cnn_digits}"
rm -rf "$out"

onnx2fpga compile "$here/model.onnx" -o "$out" --calibration "$here/calibration.npy" \
    --max-lanes 16
onnx2fpga simulate "$out" --engine golden --inputs "$here/test_x.npy" --outputs "$out/y_golden.npy"
python3 -c "import numpy as np; np.save('$out/x50.npy', np.load('$here/test_x.npy')[:50])"
onnx2fpga simulate "$out" --engine rtl --check --inputs "$out/x50.npy" --outputs "$out/y_rtl.npy"
python3 "$here/../digits/accuracy.py" "$here/model.onnx" "$here/test_x.npy" \
    "$here/test_y.npy" "$out/y_golden.npy" "$out/y_rtl.npy"
onnx2fpga build "$out" --board ulx3s-85f
