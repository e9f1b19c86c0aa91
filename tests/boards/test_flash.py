"""``onnx2fpga flash``: the exact programmer command per board, the checks before it, and a
programmer that fails (no board attached)."""

import hashlib
import json
import os
import stat

import pytest

from onnx2fpga.cli import main

SHA = "ab" * 32

# The command each board's programmer needs (DESIGN.md, "Flashing").
COMMANDS = {
    "icebreaker": ["iceprog", "{bit}"],
    "icesugar": ["icesprog", "{bit}"],
    "ulx3s-12f": ["openFPGALoader", "-b", "ulx3s", "-m", "{bit}"],
    "ulx3s-25f": ["openFPGALoader", "-b", "ulx3s", "-m", "{bit}"],
    "ulx3s-45f": ["openFPGALoader", "-b", "ulx3s", "-m", "{bit}"],
    "ulx3s-85f": ["openFPGALoader", "-b", "ulx3s", "-m", "{bit}"],
    "orangecrab-25f": ["dfu-util", "-a", "0", "-D", "{bit}"],
    "orangecrab-85f": ["dfu-util", "-a", "0", "-D", "{bit}"],
    "tangnano9k": ["openFPGALoader", "-b", "tangnano9k", "{bit}"],
}
SUFFIX = {"icebreaker": ".bin", "icesugar": ".bin", "tangnano9k": ".fs"}


def _design(tmp_path, board, *, built_for=None, design_id=SHA[:16], sha=SHA):
    """A design directory with a (fake) finished build for ``board``."""
    d = tmp_path / "d"
    (d / "build" / board).mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"top": {"verilog_sha256": sha}}))
    bitstream = "top" + SUFFIX.get(board, ".bit")
    (d / "build" / board / bitstream).write_bytes(b"\xff" * 64)
    (d / "build" / board / "report.json").write_text(json.dumps(
        {"board": built_for or board, "bitstream": bitstream, "design_id": design_id}))
    return d, d / "build" / board / bitstream


def _run(capfd, *argv):
    code = main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return code, out, err


def test_every_board_has_a_command():
    from onnx2fpga.boards.targets import list_boards
    assert sorted(COMMANDS) == list_boards()


@pytest.mark.parametrize("board", sorted(COMMANDS))
def test_dry_run_prints_the_exact_command(board, tmp_path, capfd):
    d, bitstream = _design(tmp_path, board)
    code, out, err = _run(capfd, "flash", d, "--board", board, "--dry-run")
    assert (code, err) == (0, "")
    assert out == " ".join(a.format(bit=bitstream) for a in COMMANDS[board]) + "\n"


def test_refuses_a_bitstream_for_another_board(tmp_path, capfd):
    d, _ = _design(tmp_path, "ulx3s-85f", built_for="ulx3s-25f")
    code, out, err = _run(capfd, "flash", d, "--board", "ulx3s-85f", "--dry-run")
    report = d / "build" / "ulx3s-85f" / "report.json"
    assert (code, out) == (2, "")
    assert err == (f"error: {report}: the bitstream was built for ulx3s-25f, not ulx3s-85f; run "
                   f"'onnx2fpga build {d} --board ulx3s-85f' first\n")


def test_refuses_a_stale_bitstream(tmp_path, capfd):
    d, _ = _design(tmp_path, "icebreaker", design_id="00" * 8)
    code, _, err = _run(capfd, "flash", d, "--board", "icebreaker", "--dry-run")
    assert code == 2
    assert err == (f"error: {d / 'build/icebreaker/report.json'}: the bitstream holds design "
                   f"0000000000000000, but {d} now holds {SHA[:16]}; run 'onnx2fpga build {d} "
                   f"--board icebreaker' first\n")


def test_needs_a_build(tmp_path, capfd):
    d, _ = _design(tmp_path, "icebreaker")
    code, _, err = _run(capfd, "flash", d, "--board", "tangnano9k")
    assert code == 2
    assert err == (f"error: {d}: no bitstream built for tangnano9k "
                   f"({d / 'build/tangnano9k/report.json'} is missing); run 'onnx2fpga build "
                   f"{d} --board tangnano9k' first\n")


def test_missing_programmer_says_how_to_install(tmp_path, capfd, monkeypatch):
    d, _ = _design(tmp_path, "ulx3s-85f")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, _, err = _run(capfd, "flash", d, "--board", "ulx3s-85f")
    assert code == 2
    assert err.splitlines()[-1] == ("error: programmer 'openFPGALoader' not found on PATH; "
                                    "install it (apt install openfpgaloader) or name it with "
                                    "OPENFPGALOADER")


@pytest.mark.parametrize("board, var", [("icebreaker", "ICEPROG"), ("icesugar", "ICESPROG"),
                                        ("ulx3s-85f", "OPENFPGALOADER"),
                                        ("orangecrab-25f", "DFU_UTIL")])
def test_programmer_variable_replaces_the_default(board, var, tmp_path, capfd, monkeypatch):
    d, bitstream = _design(tmp_path, board)
    args = [a.format(bit=bitstream) for a in COMMANDS[board][1:]]
    # A path to a program (here with a space in it) ...
    fake = tmp_path / "my tools" / "prog"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > '{tmp_path / 'argv.txt'}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv(var, str(fake))
    code, out, err = _run(capfd, "flash", d, "--board", board, "--dry-run")
    assert (code, err) == (0, "")
    assert out == f"'{fake}' " + " ".join(args) + "\n"
    code, _, err = _run(capfd, "flash", d, "--board", board)
    assert code == 0 and err.startswith(f"$ '{fake}' ")
    assert (tmp_path / "argv.txt").read_text().splitlines() == args
    # ... or a command line.
    monkeypatch.setenv(var, "sudo -E my-programmer --verbose")
    code, out, _ = _run(capfd, "flash", d, "--board", board, "--dry-run")
    assert out == "sudo -E my-programmer --verbose " + " ".join(args) + "\n"


@pytest.mark.parametrize("board, message", [
    ("icebreaker", "Can't find iCE FTDI USB device (vendor_id 0x0403, device_id 0x6010 or "
                   "0x6014)."),
    ("ulx3s-85f", "unable to open ftdi device: -3 (device not found)"),
    ("orangecrab-25f", "dfu-util: No DFU capable USB device available"),
])
def test_failing_programmer_shows_its_message(board, message, tmp_path, capfd, monkeypatch):
    d, bitstream = _design(tmp_path, board)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = COMMANDS[board][0]
    fake = bin_dir / tool
    fake.write_text(f"#!/bin/sh\necho \"$0 $*\" > {tmp_path / 'argv.txt'}\n"
                    f"echo 'probing...'\necho \"{message}\" >&2\nexit 2\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    code, _, err = _run(capfd, "flash", d, "--board", board)
    assert code == 2
    lines = err.splitlines()
    assert lines[0] == "$ " + " ".join(a.format(bit=bitstream) for a in COMMANDS[board])
    assert lines[1:3] == ["probing...", message]
    assert lines[-1] == f"error: {tool} failed with exit status 2: {message}"
    # The programmer got exactly the arguments of the dry run.
    assert (tmp_path / "argv.txt").read_text().split()[1:] == [
        a.format(bit=bitstream) for a in COMMANDS[board][1:]]


@pytest.mark.parametrize("name", ["../../../outside.bin", "/etc/passwd", "..", "-h",
                                  "sub/top.bin", "link.bin"])
def test_takes_the_bitstream_only_from_inside_the_build_folder(name, tmp_path, capfd):
    """A report.json naming a path, ``..``, an option or a link out of the build folder is
    refused (before: ``flash`` handed an absolute or ``..`` path to the programmer)."""
    d, bitstream = _design(tmp_path, "icebreaker")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"\x00" * 64)
    (d / "build" / "icebreaker" / "sub").mkdir()
    (d / "build" / "icebreaker" / "sub" / "top.bin").write_bytes(b"\x00")
    (d / "build" / "icebreaker" / "link.bin").symlink_to(outside)
    (d / "build" / "icebreaker" / "-h").write_bytes(b"\x00")
    report = d / "build" / "icebreaker" / "report.json"
    doc = json.loads(report.read_text())
    doc["bitstream"] = name
    report.write_text(json.dumps(doc))
    code, out, err = _run(capfd, "flash", d, "--board", "icebreaker", "--dry-run")
    assert code == 2 and out == "" and err.count("\n") == 1, (out, err)
    assert err.startswith(f"error: {report}: bitstream {name!r} ")


# -- the weight image of a design with weights in SPRAM ----------------------------------------

IMAGE = b"O2FW" + bytes(range(40))


def _spram_design(tmp_path, board="icebreaker", image=IMAGE, **spram):
    d, bitstream = _design(tmp_path, board)
    (d / "weights.bin").write_bytes(image)
    entry = {"file": "weights.bin", "flash_offset": 0x100000, "bytes": len(IMAGE),
             "sha256": hashlib.sha256(IMAGE).hexdigest(), "memories": ["matvec_0/w_mem"]}
    entry.update(spram)
    (d / "manifest.json").write_text(json.dumps({"top": {"verilog_sha256": SHA},
                                                 "spram": entry}))
    return d, bitstream


def test_the_weight_image_follows_the_bitstream(tmp_path, capfd, monkeypatch):
    d, bitstream = _spram_design(tmp_path)
    code, out, err = _run(capfd, "flash", d, "--board", "icebreaker", "--dry-run")
    assert (code, err) == (0, "")
    assert out == f"iceprog {bitstream}\niceprog -o 1048576 {d / 'weights.bin'}\n"
    # Run: both commands, in order (a programmer that records its arguments).
    fake = tmp_path / "bin" / "iceprog"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> '{tmp_path / 'calls.txt'}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("ICEPROG", str(fake))
    code, _, err = _run(capfd, "flash", d, "--board", "icebreaker")
    assert code == 0
    assert (tmp_path / "calls.txt").read_text().splitlines() == [
        str(bitstream), f"-o 1048576 {d / 'weights.bin'}"]


@pytest.mark.parametrize("change, message", [
    ({"image": b"O2FW" + bytes(40)}, "{img}: the weight image is not the one manifest.json "
                                     "records; compile the model again"),
    ({"flash_offset": 0}, "{d}: manifest.json's weight image is not weights.bin at 0x100000; "
                          "compile the model again"),
])
def test_a_wrong_weight_image_is_not_flashed(tmp_path, capfd, change, message):
    d, _ = _spram_design(tmp_path, **change)
    code, out, err = _run(capfd, "flash", d, "--board", "icebreaker", "--dry-run")
    assert (code, out) == (2, "")
    assert err == "error: " + message.format(d=d, img=d / "weights.bin") + "\n"


def test_a_weight_image_needs_iceprog(tmp_path, capfd):
    d, _ = _spram_design(tmp_path, "icesugar")
    code, _, err = _run(capfd, "flash", d, "--board", "icesugar", "--dry-run")
    assert code == 2
    assert err == (f"error: icesugar: its programmer icesprog cannot write the weight image "
                   f"at an offset here; write {d / 'weights.bin'} at byte 0x100000 of the "
                   f"flash yourself\n")
