"""Tests of onnx2fpga's boards package."""
