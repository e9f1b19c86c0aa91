"""Fuzz the frontend with mutated models: count outcomes, find crashes, hangs and foreign
exceptions.

    python benchmarks/fuzz.py [--count 10000] [--seed 0] [--timeout 10] [--jobs 4]
                              [--out fuzz-findings/] [--memory-mb 4096]

Each mutant (``tests/api/test_fuzz.py``: structural mutations of valid seed models and byte-level
damage) runs through the whole frontend of ``onnx2fpga.compile`` (load and check, QDQ
normalization, calibration for float models, lowering, folding) in a worker process with a
memory limit. The parent kills a worker that takes longer than ``--timeout`` seconds on one
model (a hang) and notices a worker that dies (a crash). Outcomes are counted by kind:
``design``, our own error classes, and the findings ``foreign:<Exception>``, ``hang`` and
``crash``. Every finding's mutant is saved to ``--out`` as ``<seed>.onnx`` with a
``<seed>.txt`` traceback; ``python benchmarks/fuzz.py --replay <seed>.onnx`` reruns one.

    python benchmarks/fuzz.py --folders [--count 1000] ...

runs hostile design folders, inputs and option sets through the command line instead
(``tests/api/test_fuzz_folders.py``: damaged, crafted and re-hashed folders, FIFOs, devices,
lying .npy headers, hostile output paths and option values). Outcomes: ``ok``, ``error``,
``failed``, ``usage``, ``build-started`` (every check before a real build passed), and the
findings ``traceback:*``, ``multi-line``, ``touched`` (a file outside the paths named on the
command line changed), ``hang`` and ``crash``; ``<seed>.txt`` holds the command line and
its output, and ``--replay-folder SEED`` reruns one.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))           # the repository: tests.helpers


def _folder_worker(conn, root, memory_mb):
    import resource
    import shutil

    from tests.api.test_fuzz_folders import make_pristine, run_case

    os.makedirs(root, exist_ok=True)
    pristine = make_pristine(tempfile.mkdtemp(prefix="pristine-", dir=root))   # (before the
    # memory limit: yosys reserves much address space)
    if memory_mb:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    while True:
        seed = conn.recv()
        if seed is None:
            return
        conn.send(("started", seed, None))
        sandbox = os.path.join(root, f"s{seed}")
        try:
            outcome, text = run_case(pristine, sandbox, seed)
        except Exception as e:  # noqa: BLE001 - a finding, reported with its traceback
            outcome, text = f"traceback:{type(e).__name__}", traceback.format_exc()
        shutil.rmtree(sandbox, ignore_errors=True)
        conn.send(("done", seed, outcome, text))


def _worker(conn, root, memory_mb, lenient_every, folders=False):
    import resource

    if folders:
        return _folder_worker(conn, root, memory_mb)
    if memory_mb:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from tests.api.test_fuzz import classify, make_folder, mutate, seed_models

    folder = make_folder(root)
    seeds = seed_models()
    path = os.path.join(folder, "m.onnx")
    while True:
        seed = conn.recv()
        if seed is None:
            return
        rng = random.Random(seed)
        data = mutate(rng.choice(seeds), rng)
        with open(path, "wb") as f:
            f.write(data)
        conn.send(("started", seed, data))
        try:
            outcome, tb = classify(path, lenient=seed % lenient_every == 0), ""
        except Exception as e:  # noqa: BLE001 - a finding, reported with its traceback
            outcome, tb = f"foreign:{type(e).__name__}", traceback.format_exc()
        conn.send(("done", seed, outcome, tb))


class _Slot:
    def __init__(self, ctx, root, args):
        self.ctx, self.root, self.args = ctx, root, args
        self.start()

    def start(self):
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(
            child, self.root, self.args.memory_mb, self.args.lenient_every,
            self.args.folders), daemon=True)
        self.proc.start()
        self.seed = self.data = self.t0 = None

    def restart(self):
        self.proc.kill()
        self.proc.join()
        self.start()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0, help="first mutant seed")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per model")
    ap.add_argument("--jobs", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    ap.add_argument("--memory-mb", type=int, default=4096, help="address-space limit")
    ap.add_argument("--lenient-every", type=int, default=3,
                    help="every n-th seed runs in lenient mode")
    ap.add_argument("--out", default="fuzz-findings", help="folder for reproducers")
    ap.add_argument("--replay", help="run one saved mutant in this process and show the "
                                     "outcome")
    ap.add_argument("--folders", action="store_true", help="fuzz hostile design folders, "
                    "inputs and options through the command line instead of models")
    ap.add_argument("--replay-folder", type=int, metavar="SEED",
                    help="run one hostile-folder case in this process and show its outcome")
    args = ap.parse_args(argv)
    if args.folders and args.memory_mb == 4096:
        args.memory_mb = 12288      # the compiles' yosys (WebAssembly) reserves 4.3 GB alone
    if args.replay_folder is not None:
        from tests.api.test_fuzz_folders import make_pristine, run_case
        root = tempfile.mkdtemp(prefix="onnx2fpga-fuzz-")
        outcome, text = run_case(make_pristine(os.path.join(root, "p")),
                                 os.path.join(root, "s"), args.replay_folder)
        print(f"{outcome}\n{text}")
        return 0
    if args.replay:
        from tests.api.test_fuzz import classify
        print(classify(args.replay))
        return 0
    ctx = mp.get_context("fork")
    root = tempfile.mkdtemp(prefix="onnx2fpga-fuzz-")
    counts = collections.Counter()
    findings = []
    t_start = time.monotonic()
    slowest = (0.0, None)
    todo = list(range(args.seed, args.seed + args.count))[::-1]
    slots = [_Slot(ctx, os.path.join(root, f"w{k}"), args) for k in range(args.jobs)]
    done = 0

    def finding(seed, data, kind, text):
        findings.append((seed, kind))
        os.makedirs(args.out, exist_ok=True)
        if data is not None:
            with open(os.path.join(args.out, f"{seed}.onnx"), "wb") as f:
                f.write(data)
        with open(os.path.join(args.out, f"{seed}.txt"), "w") as f:
            f.write(f"seed {seed}: {kind}\n{text}")

    for s in slots:
        if todo:
            s.seed = todo.pop()
            s.t0 = time.monotonic()
            s.conn.send(s.seed)
    while any(s.seed is not None for s in slots):
        for s in slots:
            if s.seed is None:
                continue
            if s.conn.poll(0.01):
                try:
                    msg = s.conn.recv()
                except EOFError:
                    msg = None
                if msg is not None and msg[0] == "started":
                    s.data = msg[2]
                    s.t0 = time.monotonic()      # a worker's setup is not the case's time
                    continue
                if msg is None:
                    kind, text = "crash", f"worker exit code {s.proc.exitcode}"
                else:
                    kind, text = msg[2], msg[3]
                elapsed = time.monotonic() - s.t0
                if elapsed > slowest[0]:
                    slowest = (elapsed, s.seed)
            elif not s.proc.is_alive():
                kind, text = "crash", f"worker exit code {s.proc.exitcode}"
            elif time.monotonic() - s.t0 > args.timeout:
                kind, text = "hang", f"no result after {args.timeout} s"
            else:
                continue
            counts[kind] += 1
            done += 1
            if kind in ("crash", "hang") or kind.startswith(("foreign:", "traceback:")) \
                    or kind in ("multi-line", "touched"):
                finding(s.seed, s.data, kind, text)
                print(f"seed {s.seed}: {kind}\n{text}", file=sys.stderr)
            if kind in ("crash", "hang"):
                s.restart()
            if done % (100 if args.folders else 1000) == 0:
                print(f"{done} {'cases' if args.folders else 'models'}, "
                      f"{time.monotonic() - t_start:.0f} s: "
                      f"{dict(counts)}", file=sys.stderr, flush=True)
            if todo:
                s.seed = todo.pop()
                s.t0 = time.monotonic()
                s.conn.send(s.seed)
            else:
                s.seed = None
    for s in slots:
        if s.proc.is_alive():
            s.conn.send(None)
            s.proc.join(5)
    wall = time.monotonic() - t_start
    what = "cases" if args.folders else "models"
    print(f"{what}: {done} (seeds {args.seed}..{args.seed + args.count - 1}), "
          f"{args.jobs} workers, {wall:.1f} s wall, slowest model {slowest[0]:.2f} s "
          f"(seed {slowest[1]})")
    for kind, n in counts.most_common():
        print(f"  {kind:32s} {n}")
    print(f"findings: {len(findings)}" + (f" (reproducers in {args.out}/)" if findings
                                          else ""))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
