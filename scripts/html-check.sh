#!/usr/bin/env bash
# Opens a page `cupool report --html` wrote in a real headless Chromium and
# checks that its script ran without a console error and drew every plot with
# its maximum at the recorded peak.
#
# The test suite does the same and more through Chromium's DevTools protocol
# (tests/html_browser.rs: every process and device, the flame graphs and the
# pool, a page of a million events in at most 3 s); this script is for a page
# made elsewhere, with nothing but the browser. Debian: apt-get install -y chromium.
#
#   scripts/html-check.sh PAGE.html [LOG]
#
# What it checks, from the DOM after the script ran (--dump-dom):
#   - <body data-cupool-drawn="1">: the script reached its end;
#   - no "Uncaught" or console error line on Chromium's stderr;
#   - on each plot's canvas, data-plot-max (the largest value the script
#     plotted) equals data-peak (the peak of the views model), and the same
#     for reserved;
#   - with LOG (one process's complete log, plain or .gz), the plotted maxima
#     equal the end record's peak_bytes of each device.
# Also writes a screenshot beside the page (PAGE.png) to look at.
# Exit status: 0 all good, 1 a check failed, 77 no Chromium here (skipped).
set -eu
page=${1:?usage: scripts/html-check.sh PAGE.html [LOG]}
log=${2:-}
browser=
for b in chromium chromium-browser google-chrome google-chrome-stable; do
  if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
if [ -z "$browser" ]; then
  echo "html-check: no chromium, chromium-browser or google-chrome here: skipped" >&2
  exit 77
fi
url="file://$(realpath "$page")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
       --disable-component-update --disable-sync --user-data-dir="$tmp/profile" --hide-scrollbars
       --allow-file-access-from-files --enable-logging=stderr --v=0 --virtual-time-budget=10000)
"$browser" "${flags[@]}" --dump-dom "$url" >"$tmp/dom.html" 2>"$tmp/stderr" || true
"$browser" "${flags[@]}" --window-size=1300,2400 --screenshot="${page%.html}.png" "$url" >/dev/null 2>>"$tmp/stderr" || true
fail=0
if grep -E 'Uncaught|CONSOLE.*[Ee]rror' "$tmp/stderr"; then
  echo "html-check: console errors (above)" >&2; fail=1
fi
if ! grep -q 'data-cupool-drawn="1"' "$tmp/dom.html"; then
  echo "html-check: the script did not reach its end (no data-cupool-drawn on <body>)" >&2; fail=1
fi
python3 - "$tmp/dom.html" "$log" <<'EOF' || fail=1
import json, re, sys
dom = open(sys.argv[1], encoding="utf-8").read()
canvases = [dict(re.findall(r'(data-[a-z-]+)="([^"]*)"', c)) for c in re.findall(r"<canvas[^>]*>", dom)]
if not canvases:
    sys.exit("html-check: no plot was drawn")
bad = 0
for c in canvases:
    if c.get("data-view") != "timeline":
        continue
    for got, want in [("data-plot-max", "data-peak"), ("data-plot-max-reserved", "data-peak-reserved"),
                      ("data-bands-max", "data-peak")]:
        if c.get(got) is None or c.get(got) != c.get(want):
            print(f"html-check: device {c.get('data-device')}: {got}={c.get(got)} but {want}={c.get(want)}")
            bad = 1
if sys.argv[2]:
    import gzip
    opener = gzip.open if sys.argv[2].endswith(".gz") else open
    with opener(sys.argv[2], "rt", encoding="utf-8") as f:
        end = json.load(f).get("end") or {}  # a complete log is one JSON object
    peaks = {str(d["device"]): d["peak_bytes"] for d in end.get("devices", [])}
    for c in [c for c in canvases if c.get("data-view") == "timeline"]:
        want = peaks.get(c.get("data-device"))
        if want is not None and str(want) != c.get("data-plot-max"):
            print(f"html-check: device {c.get('data-device')}: plotted {c.get('data-plot-max')}, the log's end record says {want}")
            bad = 1
print(f"html-check: {len(canvases)} plot(s) checked")
sys.exit(bad)
EOF
if [ "$fail" = 0 ]; then echo "html-check: $page: OK ($browser; screenshot ${page%.html}.png)"; fi
exit "$fail"
