#!/bin/bash
# usage: run.sh ROUNDS COLS ITERS bin...   interleaved; prints max and median GOP/s per binary
R=$1; C=$2; I=$3; shift 3
for r in $(seq $R); do for b in "$@"; do echo "$b $(/tmp/ic/$b $I $C | tail -1 | awk '{print $2}')"; done; done | python3 -c "
import sys,statistics as st,collections
d=collections.defaultdict(list)
for l in sys.stdin: k,v=l.split(); d[k].append(float(v))
for k in d: print(f'{k:12s} max {max(d[k]):6.1f} med {st.median(d[k]):6.1f} n={len(d[k])}')"
