"""The test suites, one folder per package of ``onnx2fpga`` (``ir``/``sim``, ``plan``,
``frontend``, ``hw``, ``boards``, and ``api`` for the root package: API, CLI, compile steps,
report, runtime), with the shared helpers in :mod:`tests.helpers`."""
