"""Planning: how the integer IR becomes hardware, without building any.

Folding (each layer's parallelism), the core graph (:func:`graph.plan_graph`: which cores,
connected how, with which parameters), stream orders, FIFO depths, and the models that
decide them: cycles and latency of every core (:mod:`.cost`, with each core kind's geometry in
its own module: :mod:`.window`, :mod:`.reduce`, :mod:`.resize`, :mod:`.joins`,
:mod:`.depthwise`, :mod:`.thresholds`) and the device rules of resource estimates
(:mod:`.devices`: which products take hard multipliers, how yosys maps memories).

Plain Python and numpy: imports the IR, the golden model and the errors, never Amaranth, the
hardware package or the frontend. Both the frontend and :mod:`onnx2fpga.hw` build on it.
"""
