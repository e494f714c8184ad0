#!/bin/sh
# analyze-N: sum one shard's numbers into work/result-N.txt.
# usage: analyze.sh --shard N
set -eu
[ "${1:-}" = --shard ] && [ -n "${2:-}" ] || { echo "usage: analyze.sh --shard N" >&2; exit 2; }
shard=$2
input="work/input-$shard.txt"
[ -f "$input" ] || { echo "missing $input: did prepare-data run?" >&2; exit 2; }

if [ "${FAIL_FIRST_ATTEMPT:-0}" = 1 ] && [ ! -e "work/shard-$shard.failed-once" ]; then
  : > "work/shard-$shard.failed-once"
  echo "shard $shard: simulated transient failure (exit 1); the retry will succeed" >&2
  exit 1
fi

total=0
while read -r n; do total=$((total + n)); done < "$input"
sleep 0.3
echo "$total" > "work/result-$shard.txt"
echo "shard $shard: sum=$total"
