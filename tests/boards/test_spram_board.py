"""Weights in SPRAM on the iCEBreaker: the board build joins the accelerator's flash ports to
the configuration flash's pins and instantiates the hard SPRAMs (the build plan, no tools)."""

import re

from amaranth_boards.icebreaker import ICEBreakerPlatform

from onnx2fpga.boards.wrapper import UartBridge
from onnx2fpga.hw.top import Accelerator
from tests.hw.test_spram_top import SPRAM, spram_dataflow


def _plan_files(df):
    acc = Accelerator(df)
    bridge = UartBridge(acc, df.input.tdata_width, df.output.tdata_width, df.input.beats,
                        df.output.beats, clk_freq=12_000_000)
    plan = ICEBreakerPlatform().prepare(bridge, name="top")
    return {name: (text.decode() if isinstance(text, bytes) else text)
            for name, text in plan.files.items()}


def test_flash_pins_and_hard_sprams():
    files = _plan_files(spram_dataflow(SPRAM))
    pcf, rtlil = files["top.pcf"], files["top.il"]
    pins = dict(re.findall(r"set_io (?:-nowarn )?(\S*spi_flash\S*) (\d+)", pcf))
    assert sorted(pins.values()) == ["12", "13", "14", "15", "16", "17"]
    assert len(re.findall(r"cell \\SB_SPRAM256KA ", rtlil)) == 4


def test_no_flash_without_weights_in_spram():
    files = _plan_files(spram_dataflow())
    assert "spi_flash" not in files["top.pcf"]
    assert "SB_SPRAM256KA" not in files["top.il"]
