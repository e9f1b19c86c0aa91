"""Tests of onnx2fpga's frontend package."""
