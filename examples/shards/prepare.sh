#!/bin/sh
# prepare-data: make a fresh work folder with one input file per shard.
# Starting from an empty folder is what lets the pipeline run again and behave
# the same way (the flaky shard's marker file lives in here too).
set -eu
rm -rf work
mkdir -p work
for shard in 1 2 3 4; do
  seq $(( (shard - 1) * 250 + 1 )) $(( shard * 250 )) > "work/input-$shard.txt"
done
sleep 0.2
echo "prepared 4 shards of 250 numbers in $(pwd)/work"
