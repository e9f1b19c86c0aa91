"""Tests of onnx2fpga's root package: API, CLI, compile steps, report, runtime."""
