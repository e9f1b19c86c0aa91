"""The design folder's manifest (``manifest.json``): what the hardware computes, its ports,
folding, cycle figures and resource estimates; and its FuseSoC core and filelist."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json

import numpy as np

from .designdir import design_files
from .ir.dataflow import Design
from .version import __version__

# IMPORTS-END

__all__ = ["make_manifest", "run_fields", "filelist_text", "core_text"]


def _folding_json(df, bottleneck) -> dict:
    """How the folding was chosen and what stopped it from going faster (each layer's
    parallelism is in its own entry)."""
    info = {k: v for k, v in sorted(df.folding_info.items()) if v is not None}
    return {**info, "bottleneck": bottleneck}


def _element_order(port) -> str:
    from .frontend.ir import logical_shape
    from .plan.builder import hwc_order

    if port.order is None:
        return "C order (row-major) over shape, batch dimension bound to 1"
    shape = logical_shape(port.shape)
    hwc = hwc_order(shape)
    if hwc is not None and np.array_equal(port.order, hwc):
        dims = "H, W, C" if len(shape) == 3 else "W, C"
        return (f"channels-last: row-major over ({dims}) of the NCHW tensor, batch dimension "
                f"bound to 1 (stream position p holds C-order element order[p])")
    return "permuted: stream position p holds C-order element order[p] (see design.npz)"


def _port_json(port) -> dict:
    return {
        "tensor": port.name, "shape": list(port.shape),
        "element_order": _element_order(port),
        "type": port.type.name, "bits": port.type.bits, "signed": port.type.signed,
        "scale": port.scale, "zero_point": port.zero_point,
        "lanes": port.lanes, "tdata_width": port.tdata_width, "beats": port.beats,
        "packing": "element j of a beat at tdata bits [j*bits, (j+1)*bits), little-endian",
        "tlast": "high on the last beat of each tensor",
        **({"parts": port.parts} if port.parts else {}),
    }


def _layer_json(ly, figures: dict, fifo_after: int) -> dict:
    """One layer's manifest entry: what it computes, its folding and its figures."""
    from .plan.layers import kind_of

    entry = {
        "name": ly.name, "kind": ly.kind, "onnx_nodes": list(ly.nodes),
        "inputs": list(ly.inputs), "output": ly.output,
        "in_shapes": [list(s) for s in ly.in_shapes], "out_shape": list(ly.out_shape),
        "in_size": ly.in_size, "out_size": ly.out_size,
        "in_type": ly.in_type.name, "out_type": ly.out_type.name,
        "cycles": figures["cycles"], "latency_cycles": figures["latency"],
        "bottleneck": figures["bottleneck"], "fifo_depth_after": fifo_after,
    }
    if "reorder_cycles" in figures:
        entry["reorder_cycles"] = figures["reorder_cycles"]
    entry.update(kind_of(ly).manifest(ly))
    return entry


def _streams_json(df, plan) -> dict:
    """Every tensor crossing a stream inside the accelerator: who writes it, its element
    order, lanes and element type (as the producer's net carries it)."""
    from .frontend.ir import logical_shape
    from .plan.builder import hwc_order

    shapes = {df.input.name: logical_shape(df.input.shape)}
    producers = {df.input.name: "s_axis"}
    for ly in df.layers:
        shapes[ly.output] = tuple(ly.out_shape)
        producers[ly.output] = ly.name
    out = {}
    for tensor, net in plan.tensor_nets.items():
        type_, lanes, size = plan.nets[net]
        order = plan.orders.get(tensor)
        if order is None:
            label = "C order"
        elif len(shapes[tensor]) <= 3 and np.array_equal(order, hwc_order(shapes[tensor])):
            label = "channels-last"
        else:
            label = "permuted"
        out[tensor] = {"producer": producers[tensor], "order": label, "lanes": int(lanes),
                       "type": type_.name, "size": int(size)}
    return out


def make_manifest(design: Design, verilog: str, quant_info: dict, name: str = "top") -> dict:
    """The manifest of ``design`` whose Verilog (top module ``name``) is ``verilog``: ``top``
    names the module, its files (:func:`onnx2fpga.designdir.design_files`), clock and reset."""
    from .plan import cost
    from .plan.graph import plan_graph

    df = design.dataflow
    if df.engine:
        figures, layers, resources = _engine_parts(df)
        streams, bottleneck = {}, []
    else:
        plan = plan_graph(df)
        figures = cost.dataflow_cycles(df, plan)
        per_layer = {f["name"]: f for f in figures["layers"]}
        layers = [_layer_json(ly, per_layer[ly.name], df.fifo_depths[k])
                  for k, ly in enumerate(df.layers)]
        resources = _resources_json(df)
        for k, entry in enumerate(layers):
            entry["resources"] = {fam: {key: v for key, v in r["layers"][k].items()
                                        if key != "name"} for fam, r in resources.items()}
        streams = _streams_json(df, plan)
        bottleneck = [f["name"] for f in figures["layers"] if f["bottleneck"]]
    hw_nodes = [n for ly in df.layers for n in ly.nodes]
    files = design_files(name)
    return {
        "format": "onnx2fpga-manifest", "version": 1, "onnx2fpga_version": __version__,
        "amaranth_version": _amaranth_version(),   # it wrote the Verilog
        "top": {"module": name, "file": files["verilog"], "filelist": files["filelist"],
                "core": files["core"], "clock": "clk",
                "reset": "rst (synchronous, active high)",
                "verilog_sha256": hashlib.sha256(verilog.encode()).hexdigest()},
        "model": {k: v for k, v in design.metadata.items()},
        "inputs": design.inputs, "outputs": design.outputs,
        "ports": {"s_axis": _port_json(df.input), "m_axis": _port_json(df.output)},
        "partition": {
            "host_head": [n.name or n.outputs[0] for n in design.head],
            "hardware": hw_nodes,
            "host_tail": [n.name or n.outputs[0] for n in design.tail],
        },
        "layers": layers,
        "edge_fifos": dict(sorted(df.edge_fifos.items())),
        "streams": streams,
        "architecture": "layer engine" if df.engine else "dataflow",
        "bottleneck": bottleneck,
        "folding": _folding_json(df, bottleneck),
        "cycles_per_inference": figures["cycles_per_inference"],
        "latency_cycles": figures["latency_cycles"],
        "quantization": quant_info,
        "resources": {fam: {key: r[key] for key in ("total", "edges", "wrapper", "board")}
                      for fam, r in resources.items()},
    }


def _amaranth_version() -> str | None:
    try:
        return importlib.metadata.version("amaranth")
    except importlib.metadata.PackageNotFoundError:
        return None


def run_fields(design: Design) -> dict:
    """The manifest's entries that simulation, builds and the host link act on (ports,
    cycles, latency), computed again from ``design``: :func:`onnx2fpga.api.load` refuses a
    manifest whose entries differ."""
    from .plan import cost
    from .plan.graph import plan_graph

    df = design.dataflow
    if df.engine:
        from .plan.engine import engine_cycles, engine_program
        figures = engine_cycles(engine_program(df))
    else:
        figures = cost.dataflow_cycles(df, plan_graph(df))
    return {"ports": {"s_axis": _port_json(df.input), "m_axis": _port_json(df.output)},
            "cycles_per_inference": figures["cycles_per_inference"],
            "latency_cycles": figures["latency_cycles"]}


def _engine_parts(df) -> tuple[dict, list, dict]:
    """The layer engine's cycle figures, layer entries and resource estimates (both
    families, with the board wrapper) for the manifest."""
    from .hw.resources import engine_resources
    from .plan.devices import FAMILIES
    from .plan.engine import engine_cycles, engine_program

    program = engine_program(df)
    figures = engine_cycles(program)
    by_name = {e["name"]: (ly, e) for ly, e in zip(program.layers, figures["layers"])}
    layers = []
    for ly in df.layers:
        eng, fig = by_name.get(ly.name, (None, {"cycles": 0, "req_cycles": 0}))
        layers.append({
            "name": ly.name, "kind": ly.kind, "onnx_nodes": list(ly.nodes),
            "inputs": list(ly.inputs), "output": ly.output,
            "in_shapes": [list(s) for s in ly.in_shapes], "out_shape": list(ly.out_shape),
            "in_size": ly.in_size, "out_size": ly.out_size,
            "in_type": ly.in_type.name, "out_type": ly.out_type.name,
            "cycles": fig["cycles"], "latency_cycles": fig["cycles"], "bottleneck": False,
            "fifo_depth_after": 0,
            "engine": None if eng is None else {
                "products_per_value": eng.taps, "requant_cycles": fig["req_cycles"]}})
    resources = {fam: {**engine_resources(program, fam, df.engine),
                       "edges": {k: 0 for k in ("lut", "ff", "dsp", "bram")}}
                 for fam in FAMILIES}
    return figures, layers, resources


def _resources_json(df) -> dict:
    """:func:`~onnx2fpga.hw.resources.dataflow_resources` for iCE40 and ECP5 (estimates before
    synthesis: DSPs and block RAMs as yosys infers them, LUTs and FFs from a fitted model)."""
    from .hw.resources import dataflow_resources
    from .plan.devices import FAMILIES

    return {fam: dataflow_resources(df, fam, wrapper=True) for fam in FAMILIES}


def filelist_text(manifest: dict) -> str:
    """The filelist ``NAME.f``: the design's Verilog, one path per line, relative to the
    filelist's folder (Verilator's ``-F``, yosys' ``read_verilog -f`` run in the folder)."""
    return f"{manifest['top']['file']}\n"


def core_text(manifest: dict) -> str:
    """The FuseSoC CAPI2 core ``NAME.core`` of the design: VLNV
    ``onnx2fpga:designs:NAME:VERSION`` (``VERSION``: onnx2fpga's), one fileset with the
    Verilog as ``verilogSource``, and targets ``default`` (what a core depending on this one
    gets) and ``sim`` (Verilator, lint only: a testbench core depending on this one runs it),
    both with ``toplevel: NAME``."""
    top = manifest["top"]
    name = top["module"]
    s_axis, m_axis = manifest["ports"]["s_axis"], manifest["ports"]["m_axis"]
    description = (f"onnx2fpga streaming accelerator {name}: AXI4-Stream s_axis "
                   f"({s_axis['tdata_width']} bits) to m_axis ({m_axis['tdata_width']} bits), "
                   f"clock clk, reset rst; Verilog sha256 {top['verilog_sha256'][:16]}")
    return "\n".join([
        "CAPI=2:",
        f"name: onnx2fpga:designs:{name}:{manifest['onnx2fpga_version']}",
        f"description: {json.dumps(description)}",
        "",
        "filesets:",
        "  rtl:",
        "    files:",
        f"      - {top['file']}",
        "    file_type: verilogSource",
        "",
        "targets:",
        "  default:",
        "    filesets:",
        "      - rtl",
        f"    toplevel: {name}",
        "  sim:",
        "    default_tool: verilator",
        "    filesets:",
        "      - rtl",
        "    tools:",
        "      verilator:",
        "        mode: lint-only",
        f"    toplevel: {name}",
        ""])
