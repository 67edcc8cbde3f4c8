"""The lab tools' parts that need no GPU and no CUDA toolkit (tools/ is not a package: loaded
by path)."""

import importlib.util
import os

import pytest

from numba_flash import cuda_gpu_present

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# a made-up listing in cuobjdump's form: a loop without products (staging, the longer one),
# the main loop (two HGMMA, shorter; closed by a branch with a second predicate, as ptxas
# closed the lean float32 forward's), an EXIT, then a subroutine past it
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/                   IADD3 R0, R0, 0x1, RZ ;                /* 0x0000000100007810 */
        /*0020*/                   LDGSTS.E.BYPASS.128 [R5], desc[UR4][R6.64] ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R5+0x10], desc[UR4][R6.64+0x10] ;
        /*0040*/                   ISETP.GE.U32.AND P0, PT, R0, R9, PT ;
        /*0050*/               @P0 BRA 0x10 ;                             /* 0x0000000000000947 */
        /*0060*/                   CALL.REL.NOINC 0xf0 ;                  /* 0x0000000000007944 */
        /*0070*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0080*/                   NOP ;
        /*0090*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*00a0*/               @P1 BRA !P3, 0x70 ;                        /* 0x0000000000009947 */
        /*00b0*/                   MUFU.EX2 R2, R2 ;                      /* 0x0000000000027308 */
        /*00c0*/                   STG.E.128 desc[UR4][R2.64], R4 ;      /* 0x000000040200798e */
        /*00d0*/                   EXIT ;                                 /* 0x000000000000794d */
        /*00e0*/                   BRA 0xe0 ;                             /* 0x0000000000007947 */
        /*00f0*/                   IMAD R3, R2, R2, RZ ;                  /* 0x0000000202037224 */
        /*0100*/                   RET.REL.NODEC R4 0x0 ;                 /* 0x0000000004007950 */
"""


def test_sass_sections_split_a_kernel_at_its_product_loop():
    sass = _tool("sass")
    ops = [op for _, op, _ in sass.instructions(SASS)]
    assert ops[:3] == ["MOV", "IADD3", "LDGSTS"] and "NOP" not in ops
    # the loop is the one with the products (0x70..0xa0, the NOP not counted: 3), not the
    # longer staging loop (0x10..0x50), which is "before" with MOV and CALL (7); after: MUFU,
    # STG, EXIT; past the last EXIT: BRA (to itself), IMAD, RET
    assert sass.sections(SASS) == {"before": 7, "loop": 3, "after": 3, "subroutines": 3,
                                   "loop_tensor_ops": 2, "calls": 1}
    with pytest.raises(ValueError, match="no SASS"):
        sass.sections("nothing here")


def test_gpu_time_compare_matches_rows_and_reports_speedups():
    gpu_time = _tool("gpu_time")

    def row(d, n, causal, ours, peer):
        return dict(d=d, N=n, causal=causal, mode="fwd", ours_ms=ours, peer_ms=peer)
    base = dict(kernel="wgmma16", rows=[row(64, 1024, False, 0.6, 0.47),
                                        row(64, 4096, False, 2.0, 1.8)])
    new = dict(kernel="wgmma16", rows=[row(64, 4096, False, 2.5, 1.81),   # out of order
                                       row(64, 1024, False, 0.5, 0.48),
                                       row(128, 1024, True, 0.4, 0.3)])  # not in base
    base.update(device="NVIDIA H200", date="2026-12-05 17:20 UTC")
    new.update(device="NVIDIA H200", date="2026-12-05 17:21 UTC")
    lines = gpu_time.compare(base, new)
    assert len(lines) == 4                       # GPUs, the header and the two shared points
    assert lines[0] == ("base: NVIDIA H200, 2026-12-05 17:20 UTC; "
                        "new: NVIDIA H200, 2026-12-05 17:21 UTC")
    assert "2.000 -> 2.500 (0.800x)" in lines[2] and lines[2].endswith("0.72")
    assert "0.600 -> 0.500 (1.200x)" in lines[3] and "0.470 / 0.480" in lines[3]
    new["device"] = "NVIDIA H100 80GB HBM3"      # runs on two kinds of GPU: said, not hidden
    assert "different GPUs" in gpu_time.compare(base, new)[1]
    del base["device"]                           # a file from before devices were recorded
    assert "GPU not recorded" in gpu_time.compare(base, new)[0]
    base["device"] = new["device"] = "NVIDIA H200"
    new["deterministic"] = True                  # the backward's other path: said, not hidden
    lines = gpu_time.compare(base, new)
    assert "deterministic=True, the other not" in lines[1] and "deterministic" in lines[2]
    base["deterministic"] = True
    assert not any("WARNING" in line for line in gpu_time.compare(base, new)[1:])


# a made-up ncu source page (--page source --csv --print-source sass) of one kernel, the
# columns the summary reads among others: two phases split by a BAR, conflicted LDS
NCU_CSV = '''"Kernel Name","ns::dkdv_wgmma_wide[abi:v1,cw5](Array<float>, float)"
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_barrier","stall_wait","stall_mio","L1 Wavefronts Shared Excessive","L1 Wavefronts Shared"
"0x10","      HGMMA.64x64x8.F32.TF32 R24, gdesc[UR4], RZ","10","4","0","10","0","0","0"
"0x20","  @!P0 LDS.64 R2, [R4]","30","8","0","5","25","6","8"
"0x30","      BAR.SYNC.DEFER_BLOCKING 0x0","0","4","0","0","0","0","0"
"0x40","      MUFU.EX2 R2, R2","40","8","30","10","0","0","0"
"0x50","      STS [R6], R2","20","8","0","0","20","0","8"
'''


def test_ncu_source_sums_samples_by_reason_op_and_phase(tmp_path):
    ncu_source = _tool("ncu_source")
    path = tmp_path / "sass.csv"
    path.write_text(NCU_CSV)
    (name, header, rows), = ncu_source.read(str(path))
    assert ncu_source.short_name(name) == "dkdv_wgmma_wide"
    assert ncu_source.op_of("  @!P0 LDS.64 R2, [R4]") == "LDS"
    lines = ncu_source.summarize(header, rows, top=3)
    text = "\n".join(lines)
    assert lines[0] == "5 instructions, 100 stall samples, 32 warp instructions executed"
    assert "stall reasons (share of samples): mio 0.45, barrier 0.30, wait 0.25" in text
    assert "  MUFU        0.400  0.250     1  [barrier 0.75, wait 0.25]" in lines
    # phase 0: HGMMA, LDS and the BAR (40 samples); phase 1: MUFU and STS (60)
    phases = [ln for ln in lines if ln.startswith("    ")]
    assert len(phases) == 2 and "0.400" in phases[0] and "HGMMA 1 LDS 1" in phases[0]
    assert "0.600" in phases[1] and "MUFU 1 STS 1" in phases[1]
    assert "LDS 0.75 of 8, STS 0.00 of 8" in lines[-1]
    with pytest.raises(ValueError, match="not an ncu source page"):
        ncu_source.summarize(["Address", "Source"], [])


def test_gpu_run_runs_the_stages_that_fit_and_sums_each_up(tmp_path):
    gpu_run = _tool("gpu_run")
    from numba_flash.bench import table
    assert gpu_run.commands("tests", "o", ["tests/test_api.py"])[0][-1] == "tests/test_api.py"
    assert ["--json", os.path.join("o", "bench-bf16.json")] == gpu_run.commands(
        "bench-bf16", "o")[0][-2:]
    assert len(gpu_run.commands("recall", "o")) == 2
    memcheck = gpu_run.commands("memcheck", "o")    # the 16-bit pairs and the replays too
    assert ["bfloat16", "tests/test_replay.py"] == [c[-1] for c in memcheck[1:]]
    with pytest.raises(ValueError, match="unknown stage"):
        gpu_run.commands("bench", "o")
    records = [dict(impl=impl, mode="fwd", d=64, causal=False, N=1024, tflops=t, peak_bytes=1e8)
               for impl, t in (("numba-flash wgmma", 42.7), ("torch efficient", 34.3))]
    outputs = {     # the last lines each program prints (a command "takes" 100 s)
        "compute-sanitizer": "8 passed in 9.10s\n========= ERROR SUMMARY: 0 errors\n",
        "pytest": "12 passed in 1s\r 3 passed, 1 failed in 2.00s\n",
        "bench": table(records) + "\n\nall figures: o/bench-f32.json\n",
        "host_pieces": "host us a call, wgmma16 bf16 B=1 H=2 N=128 d=64 causal, on H100\n"
                       "  API forward                           50.8\n"
                       "  API forward in full, plans off       200.5\n"}
    now, ran = [0.0], []

    def run(argv, log, seconds):
        ran.append((argv[-1], seconds))
        now[0] += 100
        program = next(k for k in outputs if k in " ".join(argv[:4]))   # (not the paths)
        log.write(outputs[program])
        return 1 if "tools/sanitize.py" in argv else 0
    rows = gpu_run.run_stages(["tests", "memcheck", "bench-f32", "host"], str(tmp_path),
                              budget=560, run=run, clock=lambda: now[0])
    # tests (300 s allowed) at 0, memcheck (420; three commands) at 100; bench-f32 (220) at
    # 400 could end past 560: skipped; host (60) at 400 runs
    assert [r[:2] for r in rows] == [("tests", 0), ("memcheck", 1), ("bench-f32", "skipped"),
                                     ("host", 0)]
    assert rows[0][3] == "3 passed, 1 failed in 2.00s"
    assert rows[1][2] == 300 and rows[1][3] == "========= ERROR SUMMARY: 0 errors"
    assert rows[2][3] == "220 s allowed, 160 s left"
    assert rows[3][3] == "API forward                           50.8"
    assert ran[0][1] == 300 and ran[2][1] == 320       # (a stage's commands share its time)
    assert (tmp_path / "memcheck.txt").read_text().count("ERROR SUMMARY") == 3
    bench = gpu_run.run_stages(["bench-f32"], str(tmp_path), budget=600, run=run,
                               clock=lambda: now[0])
    assert bench[0][1:2] == (0,) and bench[0][3] == "all figures: o/bench-f32.json"
    # gpu tests that all skip pass nothing: not a pass
    outputs["pytest"] = "33 skipped, 400 deselected in 3.10s\n"
    (row,) = gpu_run.run_stages(["tests"], str(tmp_path), 600, run=run, clock=lambda: now[0])
    assert row[1] == "no pass" and row[3] == "33 skipped, 400 deselected in 3.10s"
    # nothing run at all (no stage fits the budget) is not a pass either
    assert gpu_run.main(["host", "--budget", "1", "--out", str(tmp_path)]) == 1


def test_gpu_run_bundles_more_files_than_the_device_tool_brings_back(tmp_path):
    import tarfile
    gpu_run = _tool("gpu_run")
    for i in range(8):
        (tmp_path / f"stage{i}.txt").write_text(str(i))
    assert gpu_run.bundle(str(tmp_path)) is None                # 8 files come back as they are
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "bench.json").write_text("{}")
    path = gpu_run.bundle(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["gpu-run.tgz", "sub"]
    with tarfile.open(path) as tar:
        names = sorted(tar.getnames())
        assert names == ["stage0.txt", "stage1.txt", "stage2.txt", "stage3.txt", "stage4.txt",
                         "stage5.txt", "stage6.txt", "stage7.txt", "sub/bench.json"]
        assert tar.extractfile("sub/bench.json").read() == b"{}"


def test_gpu_run_stops_a_stage_and_its_children_at_its_time(tmp_path):
    # a sanitizer or pytest past its time is killed with its whole process group: a child
    # left running would hold the GPU into the next stage
    import sys
    import time
    gpu_run = _tool("gpu_run")
    child = tmp_path / "child"
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(child)!r}, 'w').write(str(c.pid)); time.sleep(60)")

    def alive(pid):             # (a zombie, killed but not reaped, is not)
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
    began = time.monotonic()
    with open(tmp_path / "log.txt", "w") as log:
        assert gpu_run._run([sys.executable, "-c", code], log, 3) == 124
    assert time.monotonic() - began < 30 and child.exists()
    pid = int(child.read_text())
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)
    assert "[stopped after 3 s]" in (tmp_path / "log.txt").read_text()


def test_tree_ab_packs_two_commits_and_compares_their_runs(tmp_path):
    import json
    import tarfile
    tree_ab = _tool("tree_ab")
    paths = tree_ab.pack("HEAD", "HEAD~1", str(tmp_path), git=("git", "-C", ROOT))
    assert [os.path.basename(p) for p in paths] == ["ab-base.tar", "ab-new.tar"]
    with tarfile.open(paths[1]) as tar:
        assert "tools/gpu_time.py" in tar.getnames()
    ran = []

    def runs(status=0, complete=True):
        """A stand-in for gpu_time.py in each tree: ms 2.0, then 1.6; `status` its exit
        status, `complete` what its --json file says."""
        def call(argv, cwd, env, stdout, stderr):
            ran.append((cwd, env["PYTHONPATH"].split(os.pathsep)[0], argv[1:]))
            ms = 2.0 if len(ran) % 2 else 1.6
            row = dict(d=64, N=1024, causal=False, dtype="float32", mode="fwd", ours_ms=ms,
                       ours_tflops=1.0, peer_ms=3.0, peer_tflops=1.0)
            result = dict(kernel="wgmma", peer="efficient", device="H", date="now",
                          deterministic=False, rows=[row], complete=complete)
            if complete is None:
                del result["complete"]
            with open(argv[-1], "w") as f:
                json.dump(result, f)
            return status
        return call
    lines = tree_ab.run(["--mode", "fwd"], str(tmp_path / "out"), str(tmp_path), call=runs())
    assert [r[0] == r[1] for r in ran] == [True, True]          # each tree imports its own
    assert ran[0][2][:3] == [os.path.join("tools", "gpu_time.py"), "--mode", "fwd"]
    assert "(1.250x)" in lines[-1] and "1.88" in lines[-1]
    assert not any("exited" in line for line in lines)
    # every row written, then an abort at exit: the rows are used, a line says so
    lines = tree_ab.run([], str(tmp_path / "o3"), str(tmp_path), call=runs(status=-6))
    assert lines[0].startswith("base: gpu_time.py exited -6 after writing every row")
    assert lines[1].startswith("new: gpu_time.py exited -6") and "(1.250x)" in lines[-1]
    # a run that stopped part way (its file marked incomplete) fails, exit 0 or not
    for status in (0, -6):
        assert tree_ab.run([], str(tmp_path / "o4"), str(tmp_path),
                           call=runs(status, complete=False)) == [
            f"base: gpu_time.py exited {status} before writing every row "
            f"(log: {tmp_path / 'o4' / 'ab-base.log'})"]
    # an older tree's gpu_time.py writes no mark: its exit status decides
    assert "(1.250x)" in tree_ab.run([], str(tmp_path / "o5"), str(tmp_path),
                                     call=runs(0, complete=None))[-1]
    assert tree_ab.run([], str(tmp_path / "o6"), str(tmp_path),
                       call=runs(-6, complete=None))[0].startswith("base: gpu_time.py exited -6 (")
    assert tree_ab.run([], str(tmp_path / "o2"), str(tmp_path),
                       call=lambda *a, **k: 3)[0].startswith("base: gpu_time.py exited 3")


def test_tree_ab_packs_a_patch_file_applied_to_the_new_tree(tmp_path):
    import subprocess
    import tarfile
    tree_ab = _tool("tree_ab")
    first = subprocess.run(["git", "-C", ROOT, "show", "HEAD:tools/tree_ab.py"],
                           capture_output=True, text=True, check=True).stdout.splitlines()[0]
    patch = tmp_path / "x.patch"          # a line added above HEAD's first line
    patch.write_text("--- a/tools/tree_ab.py\n+++ b/tools/tree_ab.py\n@@ -1 +1,2 @@\n"
                     f"+# patched\n {first}\n")
    base, new = tree_ab.pack("HEAD", "HEAD", str(tmp_path), git=("git", "-C", ROOT),
                             patch=str(patch))
    texts = []
    for path in (base, new):
        with tarfile.open(path) as tar:
            texts.append(tar.extractfile("tools/tree_ab.py").read().decode())
            assert "numba_flash/api.py" in tar.getnames()
    assert texts[1] == "# patched\n" + texts[0]
    bad = tmp_path / "bad.patch"
    bad.write_text("--- a/nowhere.py\n+++ b/nowhere.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(subprocess.CalledProcessError):
        tree_ab.pack("HEAD", "HEAD", str(tmp_path / "b"), git=("git", "-C", ROOT),
                     patch=str(bad))


def test_block_schedule_orders_and_the_tail_they_leave():
    schedule = _tool("block_schedule")
    # a causal forward at n = 300, 128-row query blocks, 64-key blocks: 2, 4, 5 key blocks
    assert schedule.forward_work(300) == [2, 4, 5]
    assert schedule.backward_work(200) == [4, 3, 2, 1]
    work = [5, 4, 2]                                        # heaviest first
    assert schedule.launch_order(work, 2, "head by head") == [5, 4, 2, 5, 4, 2]
    assert schedule.launch_order(work, 2, "round the heads") == [5, 5, 4, 4, 2, 2]
    assert schedule.launch_order(work, 2, "round the heads", 2) == [5, 4, 5, 4, 2, 2]
    with pytest.raises(ValueError, match="unknown order"):
        schedule.launch_order(work, 2, "by size")
    # two slots: 5 | 4, then 2 -> 4 + 2 = 6, 5 -> 5 + 5 = 10, 4 -> 6 + 4 = 10, 2 -> 12
    assert schedule.makespan([5, 4, 2, 5, 4, 2], 2) == 12
    assert schedule.makespan([5, 5, 4, 4, 2, 2], 2) == 11       # the even share
    assert schedule.past_even_share([5, 5, 4, 4, 2, 2], 2) == 0
    # the d = 128 grid (docs/experiments.md row 44): the forward's tail at 4k head by head
    # 7.0 %, round the heads 0.4 %
    rows = {(name, n): f for name, n, f in schedule.table(128, (4096,))}
    forward = rows["forward", 4096]
    assert 0.069 < forward["head by head"] < 0.071
    assert 0.003 < forward["round the heads, chunks of 1"] < 0.005


GPU_ONLY = [("ab.py", "wgmma"), ("call_time.py",), ("host_pieces.py",), ("cache_times.py",),
            ("gpu_time.py",), ("kernel_split.py", "run"), ("mma_probe.py",),
            ("wgmma_probe.py",)]


@pytest.mark.skipif(cuda_gpu_present(), reason="the case of a machine without a GPU")
@pytest.mark.parametrize("argv", GPU_ONLY, ids=lambda a: a[0])
def test_gpu_only_tools_refuse_at_once_without_a_gpu(argv):
    # on the simulator they would run for minutes (cache_times printed nothing for 120 s) or
    # end in a traceback; they say what they need and exit 2
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tools", argv[0]), *argv[1:]],
                         env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"tools/{argv[0]}" in run.stderr and "needs a CUDA GPU" in run.stderr
    assert "Traceback" not in run.stderr
