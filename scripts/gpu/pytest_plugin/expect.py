"""Checks the plugin's results files of one run: expect.py LOG_DIR serial|xdist|nocuda.

Prints one `result: NAME PASS|FAIL detail` line per check.
"""
import glob
import json
import sys

MIB = 1 << 20
# test name -> (leaked bytes, leaked count, measured_by); under xdist the
# counters depend on which worker imported cupy first, so measured_by is not checked there.
EXPECTED = {
    "test_a_matmul_clean": (0, 0, "torch"),
    "test_b_leak": (4 * MIB, 1, "torch"),
    "test_c_cache_reuse_clean": (0, 0, "torch"),
    "test_d_cycle_clean": (0, 0, "torch"),
    "test_e_fails_holding": (0, 0, "torch"),
    "test_f_cupy_leak": (2 * MIB, None, "torch+cupy"),
    "test_g_no_cuda": (0, 0, None),
    "test_i_matmul_again_clean": (0, 0, None),
}

log_dir, mode = sys.argv[1], sys.argv[2]
files = [json.load(open(f)) for f in sorted(glob.glob(log_dir + "/cupool-tests.*.json"))]
tests = {t["nodeid"].split("::")[-1]: t for f in files for t in f["tests"]}
if mode == "nocuda":
    ok = list(tests) == ["test_cpu_tensor"] and tests["test_cpu_tensor"]["leaked_bytes"] == 0
    print("result: nocuda-results %s %s" % ("PASS" if ok else "FAIL", sorted(tests)))
    sys.exit(0)
want_files = 2 if mode == "xdist" else 1
print("result: %s-files %s %d file(s), workers %s" % (
    mode, "PASS" if len(files) == want_files and all(f.get("complete") for f in files) else "FAIL",
    len(files), [f["worker"] for f in files]))
print("result: %s-opt-out %s" % (mode, "FAIL" if "test_h_opted_out" in tests else "PASS"))
for name, (size, count, by) in EXPECTED.items():
    t = tests.get(name)
    ok = t is not None and t["leaked_bytes"] == size and t["leaked_count"] == count
    ok = ok and (by is None or mode == "xdist" or t["measured_by"] == by)
    print("result: %s-%s %s %s" % (mode, name, "PASS" if ok else "FAIL", t and (t["leaked_bytes"], t["leaked_count"], t["measured_by"])))
