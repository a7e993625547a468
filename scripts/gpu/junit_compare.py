"""Compares two pytest JUnit reports of one suite, run plainly and under cupool
(scripts/gpu-suites.sh). A test's id is its pytest node id, rebuilt from the
xunit1 report's file and classname attributes. A test's outcome is passed,
failed (a failure or an error, in setup, call or teardown: the worst of its
entries), or skipped (skips and expected failures).

  junit_compare.py row SUITE PLAIN.xml POOL.xml PLAIN_SECONDS POOL_SECONDS DIFF_IDS_FILE [cut]
      prints one table row; writes the ids whose outcome differs (or that ran
      in one report only) to DIFF_IDS_FILE, one a line, and their details on
      stderr; with "cut" (a run was stopped at its time cap) only the tests in
      both reports are compared
  junit_compare.py outcomes REPORT.xml...
      prints "node_id outcome (first line of the message)" for every test of
      each report (for the re-runs of the differing tests)
"""
import sys
import xml.etree.ElementTree as ET

RANK = {"passed": 0, "skipped": 1, "failed": 2}


def node_id(case):
    file = case.get("file") or ""
    classname = case.get("classname") or ""
    name = case.get("name") or ""
    if not file:
        return f"{classname}::{name}" if classname else name
    # The classname is the test's module and class. The module is the file's
    # path dotted; for a file outside the rootdir (an installed package's
    # tests) pytest writes a tail of it (run with --pyargs) or nothing (run
    # by path: ".Class").
    parts = (file[:-3] if file.endswith(".py") else file).split("/")
    cls = ""
    for i in range(len(parts)):
        module = ".".join(parts[i:])
        if classname.startswith(module + "."):
            cls = classname[len(module) + 1:]
            break
    else:
        if classname.startswith(".") and file.startswith("../"):
            cls = classname[1:]
    return "::".join(p for p in (file, cls, name) if p)


def read(path):
    """{node_id: (outcome, message)}, plus whether pytest was interrupted."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return None, str(e)
    tests = {}
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", child.get("message") or (child.text or "")
            elif child.tag == "skipped" and outcome == "passed":
                outcome, message = "skipped", child.get("message") or ""
        nid = node_id(case)
        message = (message.strip().splitlines() or [""])[0][:160]
        if nid not in tests or RANK[outcome] > RANK[tests[nid][0]]:
            tests[nid] = (outcome, message)
    return tests, None


def counts(tests):
    c = {k: 0 for k in RANK}
    for outcome, _ in tests.values():
        c[outcome] += 1
    return f"{c['passed']}/{c['failed']}/{c['skipped']}"


def row(suite, plain_xml, pool_xml, t_plain, t_pool, diff_file, cut=""):
    plain, err_plain = read(plain_xml)
    pool, err_pool = read(pool_xml)
    times = f"{float(t_plain):7.1f}s {float(t_pool):7.1f}s"
    if plain is None or pool is None:
        open(diff_file, "w").close()
        why = "; ".join(f"{w}: {e}" for w, e in (("plain", err_plain), ("pool", err_pool)) if e)
        print(f"{suite:<22} | {'?':>5} | {'?':>13} | {'?':>13} | NO REPORT ({why}) | {times}")
        return
    ids = set(plain) & set(pool) if cut else set(plain) | set(pool)
    differ = sorted(
        nid for nid in ids if plain.get(nid, ("not run",))[0] != pool.get(nid, ("not run",))[0]
    )
    with open(diff_file, "w") as f:
        f.writelines(nid + "\n" for nid in differ)
    for nid in differ:
        p, q = plain.get(nid, ("not run", "")), pool.get(nid, ("not run", ""))
        print(f"[{suite}] {nid}: plain {p[0]} {p[1]!r} | pool {q[0]} {q[1]!r}", file=sys.stderr)
    verdict = "SAME" if not differ else "DIFFER: " + " ".join(
        f"{nid} ({plain.get(nid, ('not run',))[0]} -> {pool.get(nid, ('not run',))[0]})" for nid in differ
    )
    if cut:
        verdict += f" (cut at the time cap: {len(set(plain) ^ set(pool))} ran in one run only)"
    n = len(ids)
    print(f"{suite:<22} | {n:>5} | {counts(plain):>13} | {counts(pool):>13} | {verdict} | {times}")


def outcomes(paths):
    for path in paths:
        tests, err = read(path)
        if tests is None:
            print(f"{path}: no report ({err})")
            continue
        for nid, (outcome, message) in sorted(tests.items()):
            print(f"{path.rsplit('/', 1)[-1]}: {nid} {outcome} {message!r}")


if __name__ == "__main__":
    if sys.argv[1] == "row":
        row(*sys.argv[2:9])
    elif sys.argv[1] == "outcomes":
        outcomes(sys.argv[2:])
    else:
        sys.exit(__doc__)
