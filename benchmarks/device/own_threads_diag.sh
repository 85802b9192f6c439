#!/bin/bash
# On a GPU machine: does the user's own threaded script (field/train_threads.py) finish with
# 3 threads on a warm cache, plainly and under `envbisect probe`? A hang is cut after $2 s
# with SIGABRT, and PYTHONFAULTHANDLER prints every thread's stack.
#   bash benchmarks/device/own_threads_diag.sh OUTDIR [SECONDS]
set -u
R=$(cd "$(dirname "$0")/../.." && pwd); D=$1; T=${2:-90}
export PYTHONPATH=$R/src PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
mkdir -p "$D" && cd "$D" || exit 2
python3 -c "import json;open('p.jsonl','w').writelines(json.dumps({'id':i,'length':1024})+'\n' for i in range(2000))"
cp "$R/benchmarks/device/field/train_threads.py" .
export TORCHINDUCTOR_CACHE_DIR=$D/c1 TRITON_CACHE_DIR=$D/t1
{ time timeout 80 python3 train_threads.py --data p.jsonl --threads 1; } > d1.log 2>&1
cp -r c1 c2; cp -r t1 t2
{ time timeout -s ABRT "$T" python3 train_threads.py --data p.jsonl --threads 3; } > d3.log 2>&1 &
( export TORCHINDUCTOR_CACHE_DIR=$D/c2 TRITON_CACHE_DIR=$D/t2
  { time timeout -s ABRT "$T" python3 -m envbisect probe --timeout 600 --log-dir "$D/pl" -- \
      python3 train_threads.py --data p.jsonl --threads 3; } > dp.log 2>&1 ) &
wait
rm -rf c1 c2 t1 t2
