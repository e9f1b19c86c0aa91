"""``design.component()``: the accelerator inside an Amaranth design, joined with
``wiring.connect`` to ``lib.stream`` producers and consumers, simulated by amaranth.sim."""

import numpy as np
import pytest
from amaranth import Module, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

import onnx2fpga
from onnx2fpga.hw.top import stream_signature
from onnx2fpga.sim.model import run_design
from tests.helpers.models import float_mlp, save


def never_elaborated(*objs):
    """Silence Amaranth's UnusedElaboratable warning for objects built only to be looked at
    or refused (the flag ``amaranth._unused.MustUse`` checks)."""
    for obj in objs:
        obj._MustUse__used = True


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """A tiny float MLP compiled with our own calibration: 8 inputs in 2 transfers of 4
    lanes, 4 outputs in 4 transfers of 1 lane (tensors span several beats both ways)."""
    d = tmp_path_factory.mktemp("component")
    path = save(float_mlp((8, 6, 4), softmax=False, seed=3), d / "mlp.onnx")
    cal = np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)
    return onnx2fpga.compile(path, d / "design", calibration=cal)


class Producer(wiring.Component):
    """A stream source whose signals the testbench drives."""

    def __init__(self, signature):
        super().__init__({"o": Out(signature)})

    def elaborate(self, platform):
        return Module()


class Consumer(wiring.Component):
    """A stream sink whose ``ready`` the testbench drives."""

    def __init__(self, signature):
        super().__init__({"i": In(signature)})

    def elaborate(self, platform):
        return Module()


def amaranth_engine(design, *, stall=0.3, seed=0):
    """A :func:`~onnx2fpga.sim.model.run_design` engine: the hardware part run by
    ``design.component()`` in amaranth.sim, between a producer and a consumer joined to it by
    ``wiring.connect``, each stalling with probability ``stall``. Records the ``last`` flags."""
    seen = {}

    def engine(dataflow, x_int):
        inp, out = dataflow.input, dataflow.output
        accel = design.component()
        producer = Producer(stream_signature(inp))
        consumer = Consumer(stream_signature(out))
        m = Module()
        m.submodules.producer, m.submodules.accel = producer, accel
        m.submodules.consumer = consumer
        wiring.connect(m, producer.o, accel.i_stream)
        wiring.connect(m, accel.o_stream, consumer.i)

        beats_in = inp.to_stream(x_int).reshape(-1, inp.lanes)
        total_out = len(x_int) * out.beats
        got, lasts = [], []
        rng = np.random.default_rng(seed)

        async def produce(ctx):
            for k, beat in enumerate(beats_in):
                while rng.random() < stall:
                    await ctx.tick()
                ctx.set(producer.o.payload, {"data": [int(v) for v in beat],
                                             "last": int(k % inp.beats == inp.beats - 1)})
                ctx.set(producer.o.valid, 1)
                await ctx.tick().until(producer.o.ready)
                ctx.set(producer.o.valid, 0)

        async def consume(ctx):
            while len(got) < total_out:
                ready = rng.random() >= stall
                ctx.set(consumer.i.ready, ready)
                _, _, valid, payload = await ctx.tick().sample(consumer.i.valid,
                                                               consumer.i.payload)
                if ready and valid:
                    got.append([int(v) for v in payload.data])
                    lasts.append(int(payload.last))

        sim = Simulator(m)
        sim.add_clock(1e-6)
        sim.add_testbench(produce)
        sim.add_testbench(consume)
        sim.run_until(1e-6 * (200 * len(x_int) + 1000))
        assert len(got) == total_out, f"{len(got)} of {total_out} output transfers"
        seen["last"] = lasts
        return out.from_stream(np.array(got).reshape(len(x_int), out.size))

    return engine, seen


def test_component_in_an_amaranth_design_equals_the_golden_model(mlp):
    x = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    engine, seen = amaranth_engine(mlp, stall=0.3, seed=2)
    got = run_design(mlp.design, x, engine=engine)
    np.testing.assert_array_equal(got, mlp.simulate(x, engine="golden"))
    beats = mlp.manifest["ports"]["m_axis"]["beats"]
    assert beats == 4
    assert seen["last"] == [int(k % beats == beats - 1) for k in range(6 * beats)]


def test_component_members_are_stream_signatures(mlp):
    """The members as the manifest's ports describe them: lanes of the port's type, signed
    where it is, and a ``last`` bit."""
    def signature(port):
        elem = (signed if port["signed"] else unsigned)(port["bits"])
        return stream.Signature(data.StructLayout({"data": data.ArrayLayout(elem, port["lanes"]),
                                                   "last": 1}))
    ports = mlp.manifest["ports"]
    accel = mlp.component()
    never_elaborated(accel)
    assert accel.signature == wiring.Signature({
        "i_stream": In(signature(ports["s_axis"])), "o_stream": Out(signature(ports["m_axis"]))})


def test_connecting_another_payload_is_refused_by_wiring(mlp):
    accel = mlp.component()
    producer = Producer(stream.Signature(32))        # the four bytes alone, without ``last``
    m = Module()
    never_elaborated(accel, producer, m)
    with pytest.raises(wiring.ConnectionError, match=(
            r"^Cannot connect the member 'arg1\.payload' with shape unsigned\(33\) .* to the "
            r"member 'arg0\.payload' with shape unsigned\(32\) because the shape widths "
            r"\(33 and 32\) do not match$")):
        wiring.connect(m, producer.o, accel.i_stream)
