#!/bin/sh
# test shard 3: shout
set -eu
. ./src/greet.sh
[ "$(shout ci)" = "HELLO, CI" ] || { echo "FAIL: shout" >&2; exit 1; }
sleep 0.2
echo "test shard 3: ok"
