#!/usr/bin/env bash
# Regenerate the screenshots of the HTML report in docs/reports.md with headless Chromium
# (Debian's chromium; pngquant, when installed, makes them smaller). Run from the repository root
# with ../shared/data beside it.
set -euo pipefail
OUT=docs/img
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
shot() {  # shot NAME INPUT HEIGHT
  hermes advise "$2" --format html -o "$WORK/$1.html" 2>/dev/null
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$WORK/profile" \
    --window-size=1100,"$3" --screenshot="$OUT/$1.png" "file://$WORK/$1.html" >/dev/null 2>&1
  if command -v pngquant >/dev/null; then pngquant --force --skip-if-larger --quality=70-95 --output "$OUT/$1.png" "$OUT/$1.png"; fi
}
shot html_report_example examples/traces/cpu_dataloader_bound.json.gz 1500
shot html_report_dlrm ../shared/data/param/dlrm_kineto_8rank 1500
shot html_report_run_dir benchmarks/scenarios/recorded/checkpoint_stalls/bad 1150
hermes diff ../shared/data/kineto_2021/resnet50_num_workers_0.pt.trace.json.gz \
  ../shared/data/kineto_2021/resnet50_num_workers_4.pt.trace.json.gz --format html -o "$WORK/diff.html" 2>/dev/null
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$WORK/profile" \
  --window-size=1100,1100 --screenshot="$OUT/html_diff_kineto_2021.png" "file://$WORK/diff.html" >/dev/null 2>&1
if command -v pngquant >/dev/null; then pngquant --force --skip-if-larger --quality=70-95 --output "$OUT/html_diff_kineto_2021.png" "$OUT/html_diff_kineto_2021.png"; fi
ls -la "$OUT"
