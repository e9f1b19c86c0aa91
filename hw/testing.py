"""Simulation helpers for stream cores: drive and collect streams with random stalls.

Used by the core tests with :class:`amaranth.sim.Simulator` testbenches (Amaranth 0.5,
``sim.add_testbench(async def tb(ctx): ...)``). Each helper counts clock cycles from the moment
it is called: call them at the start of their testbenches and the cycle numbers of all of them
line up (cycle ``c`` is the clock period that ends with rising edge ``c + 1``).

The receiver checks the stream rules of :mod:`amaranth.lib.stream` on the producer it listens
to: once ``valid`` is high it must stay high, with the same payload, until the transfer.

On top of :func:`stream_send` and :func:`stream_recv`: :func:`simulate` runs testbenches
against a device in a ``sync`` clock domain; :func:`sender` and :func:`receiver` build
testbenches that walk one port through traffic phases (:data:`IDLE_PHASES`,
:data:`STALL_PHASES`), :func:`timed_sender` and :func:`timed_receiver` ones that move data at
full rate and record cycles; :func:`run_stream` and :func:`run_timed` do both for a device with
one ``i_stream`` and one ``o_stream``. :func:`shape_range`, :func:`random_values`,
:func:`random_images`, :func:`to_transfers` and :func:`image_transfers` make test data and put
it in stream order; they are written independently of the cores' own helpers, so that a test
does not check a core against the code it is built from.
"""

from __future__ import annotations

import numpy as np
from amaranth import ClockDomain, Module, Shape
from amaranth.hdl import Fragment
from amaranth.hdl._mem import MemoryInstance
from amaranth.sim import Simulator

from ..ir.types import IntType
from ..plan.devices import NO_RW_CHECK, carries

__all__ = [
    "IDLE_PHASES", "MemoryCollisionError", "STALL_PHASES", "StreamProtocolError",
    "image_transfers", "random_images", "random_values", "receiver", "rotated", "run_stream",
    "run_timed", "sender", "shape_range", "simulate", "split_phases", "stream_recv", "stream_send",
    "timed_receiver", "timed_sender", "to_transfers", "watch_collisions",
]

#: Traffic phases: the probability of an idle input cycle in each phase. A simulation walks
#: through all of them, so each structure sees bursts, trickles and back-to-back traffic.
IDLE_PHASES = [0.0, 0.6, 0.2, 0.9, 0.0]
#: The probability of a stalled output cycle in each phase (see :data:`IDLE_PHASES`).
STALL_PHASES = [0.0, 0.5, 0.9, 0.0, 0.3]


class StreamProtocolError(AssertionError):
    """A producer broke the stream rules (dropped ``valid`` or changed the payload early)."""


def _payload_value(value):
    """A sampled payload as plain Python data: lists of ints for array layouts."""
    if isinstance(value, int):
        return value
    try:
        length = len(value)
    except TypeError:
        return value
    return [_payload_value(value[j]) for j in range(length)]


async def stream_send(ctx, port, items, *, rng=None, idle=0.0, valid=None, payload=None,
                      ready=None):
    """Send ``items`` into ``port``, one transfer each, and return the cycle of each transfer.

    Parameters
    ----------
    ctx : amaranth.sim.TestbenchContext
    port : stream interface
        The device's input stream (its ``valid`` and ``payload`` are driven here). Leave it
        ``None`` and give ``valid``, ``payload`` and ``ready`` signals for a flat port.
    items : iterable
        Payload values (lists of ints for array layouts, ints for flat signals).
    rng : numpy.random.Generator, optional
        Source of idle cycles; none without it.
    idle : float
        Probability of an idle cycle (``valid`` low) before each item, repeated.

    Returns
    -------
    list of int
        The cycle in which each item was transferred.
    """
    if port is not None:
        valid, payload, ready = port.valid, port.payload, port.ready
    times = []
    cycle = 0
    for item in items:
        while rng is not None and idle and rng.random() < idle:
            ctx.set(valid, 0)
            await ctx.tick()
            cycle += 1
        ctx.set(payload, item)
        ctx.set(valid, 1)
        while True:
            _, _, taken = await ctx.tick().sample(ready)
            cycle += 1
            if taken:
                break
        times.append(cycle - 1)
    ctx.set(valid, 0)
    return times


async def stream_recv(ctx, port, count, *, rng=None, stall=0.0, timeout=100_000, valid=None,
                      payload=None, ready=None, extra=()):
    """Receive ``count`` transfers from ``port`` and return them with their cycles.

    Parameters
    ----------
    ctx : amaranth.sim.TestbenchContext
    port : stream interface
        The device's output stream (its ``ready`` is driven here). Leave it ``None`` and give
        ``valid``, ``payload`` and ``ready`` signals for a flat port.
    count : int
        Number of transfers to wait for.
    rng : numpy.random.Generator, optional
        Source of stall cycles; none without it.
    stall : float
        Probability that ``ready`` is low in a cycle.
    timeout : int
        Cycles to wait at most.
    extra : tuple of signals
        Further signals sampled with each transfer (for example ``tlast``).

    Returns
    -------
    items : list
        The payloads (lists of ints for array layouts), with the ``extra`` samples appended as
        a tuple ``(payload, *extra)`` when ``extra`` is given.
    times : list of int
        The cycle of each transfer.

    Raises
    ------
    StreamProtocolError
        If ``valid`` falls or the payload changes while a transfer is pending.
    TimeoutError
        If fewer than ``count`` transfers arrive within ``timeout`` cycles.
    """
    if port is not None:
        valid, payload, ready = port.valid, port.payload, port.ready
    items, times = [], []
    cycle = 0
    pending = None
    while len(items) < count:
        if cycle >= timeout:
            raise TimeoutError(f"Received {len(items)} of {count} transfers in {timeout} cycles")
        take = not (rng is not None and stall and rng.random() < stall)
        ctx.set(ready, int(take))
        _, _, *sampled = await ctx.tick().sample(valid, payload, *extra)
        is_valid, value = sampled[0], _payload_value(sampled[1])
        rest = tuple(_payload_value(v) for v in sampled[2:])
        if pending is not None:
            if not is_valid:
                raise StreamProtocolError(f"valid fell in cycle {cycle} before a transfer")
            if (value, rest) != pending:
                raise StreamProtocolError(f"payload changed in cycle {cycle} before a transfer")
        if is_valid and take:
            items.append((value, *rest) if extra else value)
            times.append(cycle)
            pending = None
        elif is_valid:
            pending = (value, rest)
        cycle += 1
    ctx.set(ready, 0)
    return items, times


# ---------------------------------------------------------------------------------------------
# Scaffolding: simulation, traffic phases, testbenches


def simulate(dut, *testbenches):
    """Run ``testbenches`` against ``dut`` until all of them return.

    Parameters
    ----------
    dut : Elaboratable
        The device; it is put in a module with a ``sync`` clock domain (also for devices that
        are only wires) and a 1 MHz clock.
    *testbenches : async functions of a :class:`amaranth.sim.TestbenchContext`

    Raises
    ------
    MemoryCollisionError
        A memory that carries :data:`~onnx2fpga.plan.devices.NO_RW_CHECK` read, on a clock
        edge, the address its write port wrote (both enabled): the promise to yosys broken.
    """
    m = Module()
    m.submodules.dut = dut
    m.domains.sync = ClockDomain()
    fragment = Fragment.get(m, None)
    sim = Simulator(fragment)
    sim.add_clock(1e-6)
    watch_collisions(sim, fragment)
    for tb in testbenches:
        sim.add_testbench(tb)
    sim.run()


def watch_collisions(sim, fragment) -> None:
    """Add to ``sim`` (a :class:`~amaranth.sim.Simulator` of ``fragment``, an elaborated
    :class:`~amaranth.hdl.Fragment`) a process per memory below ``fragment`` that carries
    :data:`~onnx2fpga.plan.devices.NO_RW_CHECK`, raising :class:`MemoryCollisionError` as
    :func:`simulate` does; for tests that build their own simulator."""
    for name, read, write in _unchecked_ports(fragment):
        sim.add_process(_collision_watch(name, read, write))


class MemoryCollisionError(AssertionError):
    """A memory that promises yosys no read-write collision (:data:`NO_RW_CHECK`) read the
    word its write port wrote in the same cycle."""


def _unchecked_ports(fragment, path=("top",)):
    """``(name, read port, write port)`` of every memory below ``fragment`` that carries
    :data:`NO_RW_CHECK`: each synchronous read port with each write port of its domain."""
    if isinstance(fragment, MemoryInstance) and carries(fragment._attrs, NO_RW_CHECK):
        for read in fragment._read_ports:
            for write in fragment._write_ports:
                if read._domain == write._domain != "comb":
                    yield ".".join(path), read, write
    for sub, name, *_ in fragment.subfragments:
        yield from _unchecked_ports(sub, (*path, str(name)))


def _collision_watch(name, read, write):
    """A process that raises :class:`MemoryCollisionError` on the first clock edge at which
    ``read`` and ``write`` are both enabled at the same address."""
    async def process(ctx):
        cycle = 0
        async for _, _, r_addr, r_en, w_addr, w_en in ctx.tick(read._domain).sample(
                read._addr, read._en, write._addr, write._en):
            if r_en and w_en and r_addr == w_addr:
                raise MemoryCollisionError(
                    f"memory {name}: cycle {cycle} reads address {r_addr} while writing it, "
                    f"but the memory carries {NO_RW_CHECK} (no read-write collision)")
            cycle += 1
    return process


def split_phases(items, phases):
    """Cut ``items`` into ``len(phases)`` consecutive chunks, each with its probability.

    Returns
    -------
    list of (sequence, float)
        ``(chunk, probability)`` pairs in order; the chunks together are ``items``.
    """
    bounds = np.linspace(0, len(items), len(phases) + 1).astype(int)
    spans = zip(bounds[:-1], bounds[1:], strict=True)
    return [(items[a:b], p) for (a, b), p in zip(spans, phases, strict=True)]


def rotated(phases, k):
    """``phases`` rotated left by ``k`` places, so that ports with their own ``k`` stall at
    different times."""
    return phases[k % len(phases):] + phases[:k % len(phases)]


def sender(port, items, rng, phases, times=None):
    """A testbench that sends ``items`` into ``port`` through the traffic ``phases``.

    Parameters
    ----------
    port : stream interface
        The device's input stream.
    items : sequence
        Payload values, cut into one chunk per phase (:func:`split_phases`).
    rng : numpy.random.Generator
        Source of idle cycles.
    phases : list of float
        Probability of an idle cycle before each item, one per phase.
    times : list, optional
        Receives the transfer cycles of each chunk (a list per phase, as :func:`stream_send`
        returns them; each counted from the start of its chunk).
    """
    async def tb(ctx):
        for chunk, p in split_phases(items, phases):
            t = await stream_send(ctx, port, chunk, rng=rng, idle=p)
            if times is not None:
                times.append(t)
    return tb


def receiver(port, n, rng, phases, result, *, timeout=100_000):
    """A testbench that receives ``n`` transfers from ``port`` through the traffic ``phases``.

    Parameters
    ----------
    port : stream interface
        The device's output stream.
    n : int
        Transfers to receive, cut into one count per phase (:func:`split_phases`).
    rng : numpy.random.Generator
        Source of stall cycles.
    phases : list of float
        Probability that ``ready`` is low in a cycle, one per phase.
    result : list
        Receives the payloads, in order.
    timeout : int
        Cycles to wait at most in each phase (see :func:`stream_recv`).
    """
    async def tb(ctx):
        for chunk, p in split_phases(list(range(n)), phases):
            got, _ = await stream_recv(ctx, port, len(chunk), rng=rng, stall=p, timeout=timeout)
            result.extend(got)
    return tb


def timed_sender(port, items, times, key):
    """A testbench that sends ``items`` into ``port`` at full rate and stores the cycle of
    each transfer as ``times[key]``."""
    async def tb(ctx):
        times[key] = await stream_send(ctx, port, items)
    return tb


def timed_receiver(port, n, times, key, *, delay=0, timeout=100_000):
    """A testbench that receives ``n`` transfers from ``port`` at full rate.

    Parameters
    ----------
    port : stream interface
        The device's output stream.
    n : int
        Transfers to receive.
    times : dict
        Receives the cycle of each transfer as ``times[key]`` and the payloads as
        ``times[key + "_items"]``.
    key : str
    delay : int
        Cycles with ``ready`` low before receiving; the cycles stored count from the start of
        the testbench.
    timeout : int
        Cycles to wait at most after ``delay`` (see :func:`stream_recv`).
    """
    async def tb(ctx):
        ctx.set(port.ready, 0)
        if delay:
            await ctx.tick().repeat(delay)
        items, t = await stream_recv(ctx, port, n, timeout=timeout)
        times[key] = [c + delay for c in t]
        times[key + "_items"] = items
    return tb


def run_stream(dut, items, n_out, seed, *, idle=IDLE_PHASES, stall=STALL_PHASES,
               timeout=100_000):
    """Send ``items`` into ``dut.i_stream`` and collect ``n_out`` transfers of
    ``dut.o_stream``, through the traffic phases.

    Parameters
    ----------
    dut : Elaboratable with ``i_stream`` and ``o_stream``
    items : sequence
        Input payloads.
    n_out : int
        Output transfers to collect.
    seed : int
        Seeds the idle cycles (``default_rng([seed, 1])``) and the stall cycles
        (``default_rng([seed, 2])``).
    idle, stall : list of float
        The traffic phases of the input and of the output.
    timeout : int
        Cycles the output may take at most in each phase.

    Returns
    -------
    list
        The output payloads.
    """
    result = []
    simulate(dut,
             sender(dut.i_stream, items, np.random.default_rng([seed, 1]), idle),
             receiver(dut.o_stream, n_out, np.random.default_rng([seed, 2]), stall, result,
                      timeout=timeout))
    return result


def run_timed(dut, items, n_out, *, delay=0, timeout=100_000):
    """Full-rate traffic through ``dut.i_stream`` and ``dut.o_stream``: the cycles of every
    input and output transfer.

    Parameters
    ----------
    dut : Elaboratable with ``i_stream`` and ``o_stream``
    items : sequence
        Input payloads, sent whenever the device takes them.
    n_out : int
        Output transfers to collect.
    delay : int
        Cycles the output starts late, with ``ready`` low (see :func:`timed_receiver`).
    timeout : int
        Cycles the output may take at most.

    Returns
    -------
    dict
        ``"in"`` and ``"out"``: the cycle of each input and output transfer;
        ``"out_items"``: the output payloads.
    """
    times = {}
    simulate(dut, timed_sender(dut.i_stream, items, times, "in"),
             timed_receiver(dut.o_stream, n_out, times, "out", delay=delay, timeout=timeout))
    return times


# ---------------------------------------------------------------------------------------------
# Test data


def shape_range(shape):
    """The smallest and largest value of an element shape.

    Parameters
    ----------
    shape : IntType or Amaranth integer shape

    Returns
    -------
    (int, int)
    """
    shape = Shape(shape.bits, shape.signed) if isinstance(shape, IntType) else Shape.cast(shape)
    if shape.signed:
        return -(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1
    return 0, (1 << shape.width) - 1


def random_values(rng, shape, size):
    """Uniform random values of the element ``shape`` (both ends included), an array of
    ``size``."""
    lo, hi = shape_range(shape)
    return rng.integers(lo, hi, size=size, endpoint=True)


def random_images(rng, shape, n, channels, height, width):
    """``n`` random images ``x[n, c, h, w]`` of the element ``shape``, the first element its
    smallest value and the last its largest, so that the extremes occur."""
    lo, hi = shape_range(shape)
    x = rng.integers(lo, hi, size=(n, channels, height, width), endpoint=True)
    x.flat[0], x.flat[-1] = lo, hi
    return x


def to_transfers(x, lanes):
    """Any integer array, flattened in C order, as a list of per-transfer lane lists."""
    return [[int(v) for v in row] for row in np.asarray(x).reshape(-1, lanes)]


def image_transfers(x, lanes):
    """Images ``x[n, c, h, w]`` as a stream: channels-last, ``lanes`` per transfer."""
    return [[int(v) for v in row] for row in x.transpose(0, 2, 3, 1).reshape(-1, lanes)]
