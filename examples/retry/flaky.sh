#!/bin/sh
# usage: flaky.sh NAME SUCCEED_ON_ATTEMPT EXIT_CODE
# Counts its attempts in work/NAME.attempts; exits EXIT_CODE until attempt
# SUCCEED_ON_ATTEMPT, which succeeds.
set -eu
name=$1 succeed_on=$2 code=$3
count_file="work/$name.attempts"
attempt=$(( $(cat "$count_file" 2>/dev/null || echo 0) + 1 ))
echo "$attempt" > "$count_file"
if [ "$attempt" -lt "$succeed_on" ]; then
  echo "$name: attempt $attempt fails with exit $code" >&2
  exit "$code"
fi
echo "$name: attempt $attempt succeeds"
