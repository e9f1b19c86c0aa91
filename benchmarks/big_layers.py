"""Wall time and peak memory of ``onnx2fpga compile`` on one large int8 MatMul, with and
without a board: what the size checks refuse and what a large layer costs.

    python benchmarks/big_layers.py [--cases 256:none,256:icebreaker,...] [--limit-gb 8]
                                    [--timeout 600] [--work DIR]

Each case ``N:BOARD`` compiles an ``N`` x ``N`` int8 MatMul in QDQ form
(:func:`tests.helpers.models.qdq_matmul`, random weights) with ``--board BOARD`` (``none``:
no board) in a child process under ``/usr/bin/time -v``; a watchdog kills the child at
``--limit-gb`` of resident memory or after ``--timeout`` seconds. The compile is the one on
``PYTHONPATH`` (run it with a worktree's or an older checkout's path to compare). Prints
one row per case: exit status, wall seconds, peak resident memory, and the outcome (the
design's folding, the ``error:`` line, or what killed it).

Measured on a shared 2-core machine (8 GB and 600 s limits), before the size checks
(9809e30) and after (issue 20, point 5):

=========== ========== ======================================== =========================
case        board      before                                   after
=========== ========== ======================================== =========================
256x256     none       5.6 s, 146 MB, design                    5.0 s, 146 MB, design
256x256     icebreaker 276 s, 3.4 GB, "nothing fits" design     1.5 s, 68 MB, refused
256x256     ulx3s-85f  440 s, 2.1 GB, design                    485 s, 2.1 GB, design
1024x1024   none       94 s, 1.1 GB, design                     57 s, 1.1 GB, design
1024x1024   icebreaker killed at 8 GB after 356 s               1.5 s, 101 MB, refused
1024x1024   ulx3s-85f  killed after 600 s (2.0 GB)              1.5 s, 101 MB, refused
4096x4096   none       killed at 8 GB after 597 s               3.0 s, 637 MB, refused
=========== ========== ======================================== =========================

256 x 256 on the ULX3S fits the board's memory; its folding's time goes into the netlists
of its candidate foldings' products (up to 256 lanes of LUT products), not its weights.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.helpers.models import qdq_matmul, save  # noqa: E402

#: The cases of issue 20's measurements: 256 and 1024 with and without the two boards,
#: 4096 without.
CASES = ("256:none,256:icebreaker,256:ulx3s-85f,1024:none,1024:icebreaker,"
         "1024:ulx3s-85f,4096:none")


def _tree_rss(pid: int) -> int:
    """Resident bytes of process ``pid`` and its descendants (Linux ``/proc``)."""
    children = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(p))
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def run_case(model: str, board: str | None, out: str, limit: int, timeout: float) -> dict:
    """Compile ``model`` into ``out`` under ``/usr/bin/time -v``; the row of the table."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-P", "-m", "onnx2fpga", "compile", model,
           "-o", out, "--force"] + (["--board", board] if board else [])
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    killed, peak = [], [0]

    def watch():
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            if peak[0] > limit:
                killed.append(f"killed at {limit / (1 << 30):.0f} GB")
            elif time.monotonic() - t0 > timeout:
                killed.append(f"killed after {timeout:.0f} s")
            if killed:
                os.killpg(proc.pid, 9)
                return
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stdout, stderr = proc.communicate()
    watcher.join()
    wall = time.monotonic() - t0
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    limited = [ln.strip() for ln in stdout.splitlines() if "folding limited by" in ln]
    outcome = killed[0] if killed else errors[0] if errors else \
        limited[0] if limited else stdout.strip().splitlines()[0] if stdout.strip() else ""
    # /usr/bin/time's figure (the largest process), or the watchdog's (killed: no figure).
    return {"status": proc.returncode, "seconds": wall,
            "rss_mb": int(rss.group(1)) // 1024 if rss else peak[0] >> 20, "outcome": outcome}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=CASES, help="comma-separated N:BOARD (BOARD: none)")
    ap.add_argument("--limit-gb", type=float, default=8.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--work", default=None, help="folder for the models and designs")
    args = ap.parse_args(argv)
    cases = [(int(n), None if b == "none" else b)
             for n, b in (c.split(":") for c in args.cases.split(","))]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or tmp
        os.makedirs(work, exist_ok=True)
        print(f"{'size':>11s} {'board':12s} {'exit':>4s} {'wall s':>7s} {'peak MB':>8s}  outcome",
              flush=True)
        for n, board in cases:
            model = os.path.join(work, f"matmul{n}.onnx")
            if not os.path.exists(model):
                save(qdq_matmul(n, n), model)
            row = run_case(model, board, os.path.join(work, "design"),
                           int(args.limit_gb * (1 << 30)), args.timeout)
            print(f"{n:>5d}x{n:<5d} {board or 'none':12s} {row['status']:>4d} "
                  f"{row['seconds']:7.1f} {row['rss_mb']:>8d}  {row['outcome']}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
