#!/usr/bin/env bash
# Lay ../shared/gpu-vllm's kit (.gpu/c*, made by its prepare.sh) out again so that each folder fits
# in one device call beside this working tree. prepare.sh sizes its folders at 52 MiB for a small
# tree; this one's files (the committed results) have grown past the 12 MiB that leaves, and a call
# whose tree and carried folder pass 64 MiB is refused before it runs (2026-12-01). Run from the
# project's root after prepare.sh; it prints the folders in the order to carry them (the first call
# makes /tmp/w, as in prepare.sh's header; the parts may arrive in any order, install.sh joins them).
set -euo pipefail
[ -d .gpu/tools ] || { echo "no .gpu/tools: run ../shared/gpu-vllm/prepare.sh first" >&2; exit 2; }
# the tree as the disk holds it (whole blocks a file): its bytes alone let a 52 MiB folder through
# here (63.6 MiB) that the call refused, its blocks did not (65.3)
tree=$( { git ls-files -z; git ls-files -z -o --exclude-standard; } | xargs -0 du -c --block-size=1 2>/dev/null \
        | awk '$2 == "total" {s += $1} END {print s + 0}')
cap=$(( 64 * 1024 * 1024 - tree - 2 * 1024 * 1024 ))  # 2 MiB for what a session adds before its call
[ "$cap" -gt $(( 8 * 1024 * 1024 )) ] || { echo "the tree ($tree bytes) leaves too little room" >&2; exit 2; }
work=$(mktemp -d .gpu/.fit.XXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/whole" "$work/out"
# every file back in one piece (parts in name order): vllm.whl.partNN is vLLM's wheel, NAME.whl.partNN another's
ls -d .gpu/c*/* | awk -F/ '{print $NF "\t" $0}' | sort | while IFS=$'\t' read -r base path; do
  cat "$path" >> "$work/whole/${base%.part[0-9][0-9]}"
done
n=0 used=0
mkdir "$work/out/c0"
for f in $(ls -S "$work"/whole/*); do
  s=$(stat -c %s "$f") base=$(basename "$f")
  if [ "$s" -gt "$cap" ]; then  # parts of its own, one folder each, named as install.sh expects
    split -b "$cap" -d "$f" "$work/$base.part"
    for p in "$work/$base".part*; do
      [ "$used" -eq 0 ] || { n=$((n+1)); mkdir "$work/out/c$n"; }
      mv "$p" "$work/out/c$n/"; used=$(stat -c %s "$work/out/c$n/$(basename "$p")")
    done
    continue
  fi
  if [ $((used + s)) -gt "$cap" ]; then n=$((n+1)); used=0; mkdir "$work/out/c$n"; fi
  mv "$f" "$work/out/c$n/"; used=$((used + s))
done
rm -rf .gpu/c*
mv "$work"/out/c* .gpu/
du --block-size=1 --max-depth=1 .gpu | sort -k2 | awk -v t="$tree" '$2 ~ /\/c[0-9]+$/ {printf "%s %.1f MiB (with the tree %.1f)\n", $2, $1/1048576, ($1+t)/1048576}'
