#!/bin/bash
# session 14, pool variant C dissected: trees of e4f5174 + pool_C_block_claims.patch with
# use_pool() on by default and their own bundle (--head-dims 128) as prebuilt:
#   tree_c8    OSCAR_CUTE_POOL_DIV=8 OSCAR_CUTE_POOL_BLOCK=2 (run 3's b_p8_2)
#   tree_c64   OSCAR_CUTE_POOL_DIV=64 OSCAR_CUTE_POOL_BLOCK=1 (a pool of 1/64: ~1 pair per warp
#              at batch 1, most warps' first claim fails)
#   tree_cnone OSCAR_CUTE_POOL_MIN=100000 (POOL_MIN_CHUNKS env-patched: the pool build's code,
#              prologue and barrier, but never a pool)
cd "$(dirname "$0")/.."
export OSCAR_GIT_COMMIT=$(cat .carry/commit)
bash perf/ab.sh $OUT/ab_dissect.txt "new tree:.carry/tree_c8 tree:.carry/tree_c64 tree:.carry/tree_cnone" 3 --model qwen3-8b --batch 1 8 --context 65536 131072
