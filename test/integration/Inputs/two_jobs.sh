#!/bin/bash
# two_jobs.sh HFLOW_RUN DATA_DIR LONG_PLAN PLAN OUT
# Starts a job writing OUT/m.jsonl and OUT/ck (checkpoints); once it holds
# their locks, a second job with the same --metrics and then one with the
# same --checkpoint-dir are started: each must be refused naming the first.
# The first job is then stopped. Prints the second and third jobs' exit
# codes and errors. (timeout: a guard against a hang, not a time bound.)
run=$1 dir=$2 long=$3 plan=$4 out=$5
timeout 500 "$run" --quiet --data-dir "$dir" --metrics "$out/m.jsonl" \
  --checkpoint-dir "$out/ck" --checkpoint-every 100000 "$long" > "$out/first.log" 2>&1 &
A=$!
for _ in $(seq 6000); do [ -e "$out/ck/.hflow-lock" ] && [ -s "$out/.m.jsonl.hflow-lock" ] && break; sleep 0.05; done
timeout 500 "$run" --quiet --data-dir "$dir" --steps 1 --metrics "$out/m.jsonl" "$plan" > "$out/second.log" 2>&1
echo "second exit=$?"
cat "$out/second.log"
timeout 500 "$run" --quiet --data-dir "$dir" --steps 1 --checkpoint-dir "$out/ck" --checkpoint-every 1 "$plan" > "$out/third.log" 2>&1
echo "third exit=$?"
cat "$out/third.log"
kill $A
wait $A
echo "first job stopped"
# Its lock is gone with it: the folder can be used (with --resume or --overwrite).
"$run" --quiet --data-dir "$dir" --steps 1 --checkpoint-dir "$out/ck" --checkpoint-every 1 --overwrite "$plan" > "$out/fourth.log" 2>&1
echo "fourth exit=$?"
