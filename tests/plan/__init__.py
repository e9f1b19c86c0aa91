"""Tests of onnx2fpga's plan package."""
