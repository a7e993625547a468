#!/usr/bin/env bash
# Screenshots of the HTML report's views for the README (docs/img/), made
# from logs with a headless Chromium (Debian: apt-get install -y chromium):
# one log directory per view, so each picture can come from the run that
# shows that view best.
#
#   scripts/html-shots.sh TIMELINE_LOGS FLAME_LOGS POOL_LOGS [OUT_DIR] [TOP_TEXT]
#
# Each *_LOGS is a directory (or file) `cupool report` reads; the page of
# each is opened at #p=0&d=0&only=VIEW at 1000x580 CSS pixels and kept as
# OUT_DIR/report-VIEW.png (OUT_DIR defaults to docs/img). TOP_TEXT, when
# given, is a screen of `cupool top` as text (tmux capture-pane -p), drawn in
# a terminal's colours as OUT_DIR/top.png. Set PROCESS=N or DEVICE=D to pick
# another process (by its place in the selector) or device. Needs the CLI
# built (cargo build --release).
set -eu
cd "$(dirname "$0")/.."
timeline=${1:?usage: scripts/html-shots.sh TIMELINE_LOGS FLAME_LOGS POOL_LOGS [OUT_DIR] [TOP_TEXT]}
flame=${2:?flame logs}
pool=${3:?pool logs}
out=${4:-docs/img}
top_text=${5:-}
cupool=${CUPOOL:-target/release/cupool}
browser=
for b in chromium chromium-browser google-chrome google-chrome-stable; do
  if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
[ -n "$browser" ] || { echo "html-shots: no Chromium here (apt-get install -y chromium)" >&2; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
shot() {  # URL PNG WIDTH HEIGHT
  "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$tmp/profile" --hide-scrollbars \
    --window-size="$3,$4" --screenshot="$2" "$1" >/dev/null 2>&1
  [ -s "$2" ] || { echo "html-shots: no screenshot of $1" >&2; exit 1; }
}
for view in timeline flame pool; do
  case $view in timeline) logs=$timeline ;; flame) logs=$flame ;; pool) logs=$pool ;; esac
  "$cupool" report --html "$tmp/$view.html" "$logs" 2>/dev/null
  shot "file://$tmp/$view.html#p=${PROCESS:-0}&d=${DEVICE:-0}&only=$view" "$out/report-$view.png" 1000 580
  echo "html-shots: $out/report-$view.png (from $logs)"
done
if [ -n "$top_text" ]; then
  python3 - "$top_text" "$tmp/top.html" <<'PY'
import html, sys
text = open(sys.argv[1], encoding="utf-8").read().rstrip("\n")
open(sys.argv[2], "w", encoding="utf-8").write(
    "<!DOCTYPE html><meta charset=utf-8><body style='margin:0;background:#1e1e1e'>"
    "<pre style='margin:0;padding:10px;color:#e8e8e8;font:13px/1.35 monospace'>" + html.escape(text) + "</pre>")
PY
  lines=$(wc -l < "$top_text")
  shot "file://$tmp/top.html" "$out/top.png" 1000 $(( lines * 18 + 24 ))
  echo "html-shots: $out/top.png (from $top_text)"
fi
