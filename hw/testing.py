"""Simulation helpers for stream cores: drive and collect streams with random stalls.

Used by the core tests with :class:`amaranth.sim.Simulator` testbenches (Amaranth 0.5,
``sim.add_testbench(async def tb(ctx): ...)``). Each helper counts clock cycles from the moment
it is called: call them at the start of their testbenches and the cycle numbers of all of them
line up (cycle ``c`` is the clock period that ends with rising edge ``c + 1``).

The receiver checks the stream rules of :mod:`amaranth.lib.stream` on the producer it listens
to: once ``valid`` is high it must stay high, with the same payload, until the transfer.
"""

from __future__ import annotations

__all__ = ["StreamProtocolError", "stream_send", "stream_recv"]


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
