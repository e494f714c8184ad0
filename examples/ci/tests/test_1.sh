#!/bin/sh
# test shard 1: greet with the default name
set -eu
. ./src/greet.sh
[ "$(greet)" = "hello, world" ] || { echo "FAIL: greet" >&2; exit 1; }
sleep 0.2
echo "test shard 1: ok"
