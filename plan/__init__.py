"""Planning: how the integer IR becomes hardware, without building any.

Folding (:mod:`.fold`: each layer's parallelism), the core graph (:func:`.graph.plan_graph`:
which cores, connected how, with which parameters; built with :mod:`.builder`), stream
orders, FIFO depths, and the models that decide them: per layer kind what it becomes
(:mod:`.layers`, one module per kind), per core kind its cycle model (:mod:`.cores` lists
them: :mod:`.matvec`, :mod:`.requant`, :mod:`.thresholds`, :mod:`.window`, :mod:`.reduce`,
:mod:`.depthwise`, :mod:`.joins`, :mod:`.resize`, :mod:`.plumbing`), the figures of a whole
design (:mod:`.cost`), and the device rules of resource estimates (:mod:`.devices`: which
products take hard multipliers, how yosys maps memories).

Plain Python and numpy: imports the IR, the golden model and the errors, never Amaranth, the
hardware package or the frontend. Both the frontend and :mod:`onnx2fpga.hw` build on it.
"""
