"""One device run of the usual GPU checks: each stage's log in an output folder, a table last.

A session has little device time and a machine start costs minutes, so the checks a change
needs go into one command (the device tool's `run`), not many. This runs the named stages in
order, each under its own time limit, and starts none that the time left in --budget cannot
hold; then prints one line a stage (its exit status, seconds, and the line of its log that
says how it went) and the GPU's name.

    python tools/gpu_run.py [STAGE ...] [--out DIR] [--budget 540] [--tests FILE ...]
        [--dry-run]

Stages (default: tests memcheck bench-bf16 bench-f32):
    tests       pytest -m gpu (every gpu test, or --tests FILE ...)
    verify      numba-flash verify (every dtype, forward and backward, against float64)
    memcheck    compute-sanitizer memcheck over tools/sanitize.py (every pair, small odd cases:
                float32 and float64, then the 16-bit pairs in bfloat16) and over the call
                plans' gpu tests (tests/test_replay.py: torch tensors, replays)
    racecheck   compute-sanitizer racecheck over tools/sanitize.py: wgmma, then the 16-bit
                pairs in bfloat16
    bench-bf16  numba-flash bench in bfloat16: wgmma16, torch flash (FlashAttention-2), cuDNN
                (issue 24's grid)
    bench-f16   the same in float16
    bench-f32   numba-flash bench in float32: wgmma, torch efficient (issue 25's grid)
    host        tools/host_pieces.py (host µs of a call, replayed and in full)
    recall      examples/recall.py, 150 steps: bf16 with SDPA beside, float32

Each stage's time allowed is in STAGES; the default stages take more than one command's 600 s
(the gpu tests alone can): split them over two commands, or narrow the tests with --tests.
--out defaults to $OUT (what the device tool brings back), else ./gpu-run; where the stages leave
more than 8 files there (the most the device tool brings back), they end up in one
gpu-run.tgz. Run from the
repository's root with numba_flash importable (on the H200 machine: PYTHONPATH, after the numpy
wheel: ../shared/gpu/README.md).
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time

PY = sys.executable
SANITIZE = ["compute-sanitizer", "--report-api-errors", "no", "--error-exitcode", "1"]
HALF_PAIRS = ["wgmma16", "mma16", "wgmma16-tf32bwd"]


def half_bench(dtype):
    """The bench's arguments for issue 24's grid in a 16-bit dtype, beside FA2 and cuDNN."""
    return ["-m", "numba_flash", "bench", "--dtype", dtype, "--mode", "both", "--n", "1024",
            "4096", "16384", "--impl", "numba-flash wgmma16", "--impl", "torch flash",
            "--impl", "torch cudnn"]


F32 = ["-m", "numba_flash", "bench", "--dtype", "float32", "--mode", "both", "--n", "1024",
       "4096", "16384", "--impl", "numba-flash wgmma", "--impl", "torch efficient"]

# name: (seconds allowed, the line of the log that says how it went: the last one matching)
PYTEST = r"\d+ (passed|failed|errors?|skipped|deselected)\b.* in [\d.]+s"    # its last line
STAGES = {
    "tests": (300, PYTEST),
    "verify": (300, r" rows?: |Error"),
    "memcheck": (420, r"ERROR SUMMARY|" + PYTEST),
    "racecheck": (300, r"RACECHECK SUMMARY|ERROR SUMMARY"),
    "bench-bf16": (200, r"^all figures: |Error"),
    "bench-f16": (200, r"^all figures: |Error"),
    "bench-f32": (220, r"^all figures: |Error"),
    "host": (60, r"^\s*API forward\s+[\d.]+$"),
    "recall": (150, r"ms/step|Error"),
}
DEFAULT = ("tests", "memcheck", "bench-bf16", "bench-f32")


def commands(stage, out, tests=()):
    """The commands (argument lists) of a stage, writing any JSON into folder out."""
    if stage == "tests":
        return [[PY, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *tests]]
    if stage == "verify":
        return [[PY, "-m", "numba_flash", "verify"]]
    if stage == "memcheck":
        sanitizer = [SANITIZE[0], "--tool", "memcheck", *SANITIZE[1:]]
        return [[*sanitizer, PY, "tools/sanitize.py"],
                [*sanitizer, PY, "tools/sanitize.py", *HALF_PAIRS, "--dtype", "bfloat16"],
                [*sanitizer, PY, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                 "tests/test_replay.py"]]
    if stage == "racecheck":
        sanitizer = [SANITIZE[0], "--tool", "racecheck", *SANITIZE[1:]]
        return [[*sanitizer, PY, "tools/sanitize.py", "wgmma"],
                [*sanitizer, PY, "tools/sanitize.py", *HALF_PAIRS, "--dtype", "bfloat16"]]
    if stage in ("bench-bf16", "bench-f16"):
        dtype = "bfloat16" if stage == "bench-bf16" else "float16"
        return [[PY, *half_bench(dtype), "--json", os.path.join(out, f"{stage}.json")]]
    if stage == "bench-f32":
        return [[PY, *F32, "--json", os.path.join(out, "bench-f32.json")]]
    if stage == "host":
        return [[PY, "tools/host_pieces.py"]]
    if stage == "recall":
        return [[PY, "examples/recall.py", "--attention", "both", "--steps", "150", "--dtype",
                 "bfloat16", "--json", os.path.join(out, "recall-bf16.json")],
                [PY, "examples/recall.py", "--attention", "numba-flash", "--steps", "150",
                 "--json", os.path.join(out, "recall-f32.json")]]
    raise ValueError(f"unknown stage {stage!r}; the stages: {', '.join(STAGES)}")


def _run(argv, log, seconds):
    """Exit status of argv, its output appended to the open file log; 124 past `seconds`,
    when its whole process group is killed (a sanitizer's or pytest's children too, which
    would otherwise hold the GPU into the next stage)."""
    log.write("+ " + " ".join(argv) + "\n")
    log.flush()
    try:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    except FileNotFoundError as e:
        log.write(f"{e}\n")
        return 127
    try:
        return process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        log.write(f"\n[stopped after {seconds} s]\n")
        return 124


def summary_line(text, pattern):
    """The last line of text matching pattern (progress bars' carriage returns split lines),
    stripped, or ''."""
    found = ""
    for line in text.replace("\r", "\n").splitlines():
        if re.search(pattern, line):
            found = line.strip()
    return found


def run_stages(stages, out, budget, tests=(), run=_run, clock=time.monotonic):
    """Run the stages in order within `budget` seconds (a stage whose time allowed exceeds what
    is left is skipped); rows (stage, status, seconds, summary), status an exit code or
    'skipped'. Each stage's log: out/STAGE.txt."""
    start, rows = clock(), []
    for stage in stages:
        seconds, pattern = STAGES[stage]
        left = budget - (clock() - start)
        if seconds > left:
            rows.append((stage, "skipped", 0.0, f"{seconds} s allowed, {left:.0f} s left"))
            continue
        path, began, status = os.path.join(out, f"{stage}.txt"), clock(), 0
        with open(path, "w") as log:
            for argv in commands(stage, out, tests):
                status = run(argv, log, max(1, int(seconds - (clock() - began)))) or status
        with open(path) as log:
            line = summary_line(log.read(), pattern)
        if stage == "tests" and status == 0 and " passed" not in line:
            status = "no pass"      # (every test skipped or deselected: pytest exits 0)
        rows.append((stage, status, clock() - began, line))
    return rows


def bundle(out, limit=8):
    """Where out holds more than `limit` files (the device tool brings back at most 8 from
    $OUT: more are left on the machine and lost with it, as on 2026-12-08), pack them all into
    out/gpu-run.tgz and delete the loose ones; the archive's path, or None when they fit."""
    files = [os.path.join(folder, name) for folder, _, names in os.walk(out) for name in names]
    if len(files) <= limit:
        return None
    path = os.path.join(out, "gpu-run.tgz")
    with tarfile.open(path, "w:gz") as tar:
        for f in sorted(files):
            tar.add(f, arcname=os.path.relpath(f, out))
    for f in files:
        os.unlink(f)
    return path


def gpu_name():
    """nvidia-smi's name of the GPU, or why there is none."""
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi"
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stages", nargs="*", default=list(DEFAULT), metavar="STAGE",
                    help=f"of: {', '.join(STAGES)} (default: {' '.join(DEFAULT)})")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-run")
    ap.add_argument("--budget", type=float, default=540.0,
                    help="seconds for all the stages (the device's limit a command is 600)")
    ap.add_argument("--tests", nargs="+", default=(), metavar="FILE",
                    help="the tests stage's files (default: every gpu test)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = ap.parse_args(argv)
    for stage in args.stages:
        if stage not in STAGES:
            ap.error(f"unknown stage {stage!r}; the stages: {', '.join(STAGES)}")
    if args.dry_run:
        for stage in args.stages:
            for command in commands(stage, args.out, args.tests):
                print(f"{stage:11} {STAGES[stage][0]:4d} s  {' '.join(command)}")
        return 0
    os.makedirs(args.out, exist_ok=True)
    print(f"{gpu_name()}; {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    rows = run_stages(args.stages, args.out, args.budget, args.tests)
    for stage, status, seconds, line in rows:
        print(f"{stage:11} {status!s:>7} {seconds:6.0f} s  {line}")
    packed = bundle(args.out)
    if packed:
        print(f"every file of {args.out} is in {packed} (more than the device tool brings back)")
    ran = [status for _, status, _, _ in rows if status != "skipped"]
    return 0 if ran and all(status == 0 for status in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
