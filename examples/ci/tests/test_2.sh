#!/bin/sh
# test shard 2: greet with a name
set -eu
. ./src/greet.sh
[ "$(greet ci)" = "hello, ci" ] || { echo "FAIL: greet ci" >&2; exit 1; }
sleep 0.2
echo "test shard 2: ok"
