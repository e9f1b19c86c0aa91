"""Tests of onnx2fpga's sim package."""
