#!/usr/bin/env bash
# The main job on the bundled example: compile the digits MLP (float ONNX + our int8
# calibration), check accuracy with the golden model, simulate the Verilog in Verilator with
# random AXI-Stream stalls against the golden model, and build bitstreams for two boards.
#
#   bash examples/digits/run.sh [OUT_DIR]      (default: out/digits; it is replaced)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-out/digits}"
rm -rf "$out"

onnx2fpga compile "$here/model.onnx" -o "$out" --calibration "$here/calibration.npy"
onnx2fpga simulate "$out" --engine golden --inputs "$here/test_x.npy" --outputs "$out/y_golden.npy"
onnx2fpga simulate "$out" --engine rtl --check --inputs "$here/test_x.npy" --outputs "$out/y_rtl.npy"
python3 "$here/accuracy.py" "$here/model.onnx" "$here/test_x.npy" "$here/test_y.npy" \
    "$out/y_golden.npy" "$out/y_rtl.npy"
onnx2fpga build "$out" --board icebreaker
onnx2fpga build "$out" --board ulx3s-85f
