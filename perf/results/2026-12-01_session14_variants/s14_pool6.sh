#!/bin/bash
# session 14, pool variant C without claims (timing only: the pool's chunks are never
# attended): trees of e4f5174 + pool_C_block_claims.patch, use_pool() on by default,
#   tree_c8       OSCAR_CUTE_POOL_DIV=8 OSCAR_CUTE_POOL_BLOCK=2
#   tree_noclaim  the same with OSCAR_CUTE_POOL_NOCLAIM=1 at build time (claiming starts at
#                 0 in _pool_loop: every joined warp runs its last 10 chunks in the second
#                 loop, no atomics)
cd "$(dirname "$0")/.."
export OSCAR_GIT_COMMIT=$(cat .carry/commit)
bash perf/ab.sh $OUT/ab_noclaim.txt "new tree:.carry/tree_c8 tree:.carry/tree_noclaim" 3 --model qwen3-8b --batch 1 8 --context 65536
