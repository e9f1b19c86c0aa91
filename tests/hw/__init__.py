"""Tests of onnx2fpga's hw package."""
