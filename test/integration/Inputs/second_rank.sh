#!/bin/bash
# second_rank.sh HFLOW_RUN HFLOW_TESTPLAN DATA_DIR PLAN PREFIX
# A 2-rank job joined torchrun-style; once both ranks joined (rank 0 trains),
# a third process joins the same port as rank 1. Prints each exit status and
# the intruder's error. (timeout 500: a guard against a hang, not a bound on
# the time: the job's 150 iterations take what a loaded machine takes.)
run=$1 testplan=$2 dir=$3 plan=$4 out=$5
P=$("$testplan" --free-port)
export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P
RANK=0 timeout 500 "$run" --timeout 20 --data-dir "$dir" "$plan" > "$out.r0" 2>&1 &
R0=$!
RANK=1 timeout 500 "$run" --timeout 20 --data-dir "$dir" "$plan" > "$out.r1" 2>&1 &
R1=$!
for _ in $(seq 600); do grep -q '^\[grpo' "$out.r0" 2>/dev/null && break; sleep 0.05; done
RANK=1 timeout 500 "$run" --timeout 20 --data-dir "$dir" "$plan" > "$out.x" 2>&1
X=$?
wait $R0; echo "job rank 0 exit=$?"
wait $R1; echo "job rank 1 exit=$?"
echo "intruder exit=$X"
cat "$out.x"
