#!/bin/bash
# tools/ds_plot turns a csv_monitor folder (DeepSpeed's files: "step,<name>" headers, \r\n line
# ends, a second header where a second run appended) into a PNG of the three curves.
# Exit 77 (skipped) without gnuplot.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
command -v gnuplot >/dev/null || { echo "SKIPPED: gnuplot not installed (apt-get install gnuplot-nox)"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
csv=$dir/runs/gpt_train
mkdir -p "$csv"
write() {  # write TAG NAME FORMULA: 40 rows "samples,value" in DeepSpeed's layout
  awk -v name="$2" 'BEGIN { printf "step,%s\r\n", name;
    for (i = 1; i <= 40; i++) { if (i == 21) printf "step,%s\r\n", name; x = 8 * i; printf "%d,%s\r\n", x, '"$3"' } }' \
    > "$csv/Train_Samples_$1.csv"
}
write train_loss train_loss '5.5 * exp(-i / 15) + 1'
write lr lr '(i < 10 ? i / 10 : 1) * 0.001'
write tokens_per_second tokens_per_second '12000 + 500 * sin(i)'
"$src/tools/ds_plot/ds_plot" -o "$dir/out.png" "$csv"
sig=$(head -c 8 "$dir/out.png" | od -An -tx1 | tr -d ' \n')
[ "$sig" = 89504e470d0a1a0a ] || { echo "FAIL: not a PNG (signature $sig)"; exit 1; }
size=$(stat -c %s "$dir/out.png")
# Three panels of curves, axes and labels: tens of kilobytes; an empty canvas is a few.
[ "$size" -gt 15000 ] || { echo "FAIL: PNG of $size bytes looks empty"; exit 1; }
# The default output goes into the folder; a folder without the files is an error naming them.
"$src/tools/ds_plot/ds_plot" "$csv" >/dev/null
[ -s "$csv/curves.png" ] || { echo "FAIL: no $csv/curves.png"; exit 1; }
mkdir "$dir/empty"
if msg=$("$src/tools/ds_plot/ds_plot" "$dir/empty" 2>&1); then echo "FAIL: empty folder accepted"; exit 1; fi
grep -q "Train_Samples_" <<<"$msg" || { echo "FAIL: error does not name the files: $msg"; exit 1; }
echo "ok: $size bytes"
