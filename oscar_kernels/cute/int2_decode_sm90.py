"""INT2 paged decode attention for Hopper (sm_90a), written in the CuTe Python DSL.

What it computes
----------------
One query per sequence over the mixed INT2/BF16 paged cache of docs/format.md, in the
rotated space, for every (sequence ``b``, KV head ``h``, query head ``g`` of its group)::

    score_t = s_t (q'_g . c_t) + z_t sum(q'_g)          INT2 token t (scale s_t, zero z_t)
    score_t = q'_g . k'_t                                 BF16 sink/recent token
    o'_g    = sum_t p_t s^v_t c^v_t + (sum_t p_t z^v_t) 1  (+ BF16 tokens: p_t v'_t)

Kernels (specialized per ``head_dim`` in {64, 128}, for the decode per GQA class and, at
head_dim 128, per CTA width; everything else is a runtime argument, so the ahead-of-time
bundle holds 3 small libraries per head_dim plus the 2 wide decode builds at 128):

* :class:`Int2PagedDecodeSm90` the whole decode in one launch, split over KV: grid
  ``(num_splits, num_kv_heads, batch_size)``, 4 warps per CTA (4 CTAs per SM), or in the
  wide build (``Int2DecodeConfig(warps=8)``, head_dim 128) 8 warps per CTA (2 per SM),
  whose grid is split-major, ``(num_kv_heads, batch_size, num_splits)``, with at most
  ``RANK_MAX_SPLITS`` (8) splits (sessions 9-10, below). ``decode_pair``
  (``Int2DecodeConfig(pair=True)``, GQA ratios <= 4, e.g. Qwen3-8B/4B) runs two chunks per
  softmax pass (below); ``decode`` (ratios 5-8, e.g. Llama-3-70B TP8) one.
  ``oscar_kernels.cute.plan`` picks the width and the split count from the shapes.

  1. Prologue: L2 prefetch of ``R_K[h]`` and ``R_V[h]`` from split 0; the CTA's loads of
     the query rotation (its warp's A fragments of ``R_K[h]^T``, 16-byte loads, and q in
     its own dtype through its strides) and of the sequence geometry, then the page-table
     block, then the rotation on the tensor cores (``q'^T = R_K^T q^T``, fp16 ``m16n8k16``,
     bf16 result in shared memory; one memory round trip), then the first 6 chunks of the
     cp.async ring -- no separate rotation launch, no ``q.float()`` copy. ``R_K`` and
     ``R_V`` arrive as fp16 operands in MMA-fragment order, prepared once per rotation
     tensor on the host (``oscar_kernels.cute.mma_operand``, cached).
  2. Warp ``w`` of split ``s`` owns a contiguous range of 16-token INT2 chunks (one page
     lookup per chunk: ``page_size % 16 == 0``; a 32-entry block of page ids lives in
     registers, one per lane) plus every ``warps * num_splits``-th BF16 window chunk: the
     first of those (chunk ``wsplit``) runs before the INT2 loop, right after the ring
     prologue is issued; the rest after the loop. The ranges are balanced by bytes: a
     window chunk counts as ``WINDOW_CHUNK_COST`` (7) INT2 chunks, so warps with window
     chunks get shorter INT2 ranges (session 8: qwen3-8b batch 1-8 0.5-3 % faster,
     llama3-70b-tp8 batch 32 2-4 %). In the wide build with a split-major grid, one wave
     and at least ``RANK_MIN_CHUNKS`` (8) chunks per warp (and twice its window work: 14 with
     one window chunk), the shares are also weighted by dispatch rank: CTA ``L`` of a single
     wave is the ``L // #SMs``-th CTA dispatched to its SM, the first of an SM's two CTAs gets
     more issue slots (its INT2 loop ran 1.2-1.25x faster with equal shares), so rank-0
     splits take ``RANK0_WEIGHT / RANK_WEIGHT`` (3/2) the work (session 9, 5/4 with at most 4
     splits and 32 chunks: qwen3-8b batch 8 / 16 2.5-3.5 %, llama3-70b-tp8 batch 64 / 128
     0.5-2 % faster, perf/results/2026-11-29_h200_s9_ab_ranked3_*.txt; session 10, 3/2 with
     up to 8 splits and 8 chunks: another 1-4.5 % at 32K-128K, 3-7 % slower for 8 splits at
     8K-16K, ..._s10_ab_rank_*.txt; the constants in ``oscar_kernels.cute`` say where).
     Not in a full wave (every slot of the SMs taken, e.g. 264 CTAs on 132 SMs): the
     dispatch order differs there (session 22's traces: 8 SMs got two CTAs of rank 0 by
     index and 8 others two of rank 1, 6:4 work instead of 5:5), and equal shares were
     10-15 % faster (llama3-70b-tp8 batch 33 / 44 / 66 / 88 / 132, qwen3-8b batch 11 at
     32K-128K, perf/results/2026-12-02_h200_s22_*).
  3. The CTA's warps are combined through shared memory; each CTA writes one normalized
     partial and its base-2 log-sum-exp. In the 4-warp builds, when there is one split or
     the merge kernel runs next, the CTA applies ``R_V[h]^T`` to its partial itself (tensor
     cores, the same fp16 operand; session 12): one split stores ``o`` in q's dtype and the
     natural-log lse directly (no partial store, ticket or reload), and the merge kernel
     gets partials in the model's space. The fused tail below keeps the rotation after the
     merge: in every CTA it was one more exposed round trip (``R_V``'s fragments) before the
     ticket, 0.6-2 us slower at qwen3-8b batch 1-8 (``perf/results/
     2026-11-30_h200_s12_ab_r1_*``), and the wide builds keep their session-11 code (the
     same change moved their main loops: 149.5 -> 151.5 and 176.5 -> 179 SASS per chunk).
  4. When ``num_splits * group <= FUSED_TAIL_ROWS`` (128; in the 4-warp builds and more than
     one split): an atomic ticket per (sequence, KV head) (CTA barrier, then thread 0's
     ``fence.acq_rel.gpu`` + ``atom.add`` + ``fence.acq_rel.gpu``, the cooperative-groups
     grid-barrier pattern; every thread fenced before session 12, qwen3-8b batch 1 0.2-0.4
     us slower); the CTA that draws the last one merges the partials, applies
     ``R_V[h]^T`` on the tensor cores, stores ``o`` in q's dtype through the output strides
     (straight into ``out``) and the natural-log lse, and resets the ticket to 0 (so
     CUDA-graph replays start clean). One memory round trip for up to 32 partial rows (64
     in the wide pair build, session 12: qwen3-8b batch 1's 16 splits x 4 heads): the
     rows by ``cp.async.cg`` into the free ring, the lse partials and ``R_V``'s fragments
     (prefetched into L2 by split 0) in flight with them (session 8; before: lse, o rows and
     ``R_V`` in three dependent round trips).
* :class:`Int2DecodeMergeSm90` for more partials than that (batch 1-16 with few KV
  heads; 4-warp builds only): the weighted sum of the partials (in the model's space) +
  store, one CTA per (sequence, query head). One CTA cannot pull 128 splits x 8 heads x
  512 B of partials fast enough (measured llama3-70b-tp8 batch 1 at 8K: 47 us fused vs
  37 us with this kernel).

Graph safety: ``num_splits`` depends on shapes only, never on lengths; no host
synchronization; the tickets are a persistent zeroed buffer per (device, stream) for eager
calls, and a zeroed slice of their own for every call captured into a CUDA graph (since
session 16; graphs may then be replayed concurrently on different streams).

Data movement: each warp is its own producer: ``cp.async`` (LDGSTS) of whole chunks (K and
V codes 2 x 16 x D/4 bytes, 2 x 16 scale/zero pairs) into a private 8-stage shared-memory
ring (36 KB per CTA at D = 128; 4 stages in the merge-CTA build, below). The main loop takes two chunks per iteration: one
``cp.async.commit_group`` for the two chunks it issues, one ``cp.async.wait_group`` +
``bar.warp.sync``, one set of ring bookkeeping per 32 tokens (an odd last chunk is a
phantom whose positions are masked by the warp's range end). Chunk rows come in blocks of
32: lane ``l`` holds the (page, slot, head) row of the warp's chunk ``32 k + l`` and the page
id of chunk ``32 (k + 1) + l`` (loaded one block ahead), so an issue is one shuffle, one
``mad.wide.u32`` per source (64-bit per-lane bases hoisted) and the copies; copies past the
warp's range read nothing (``cp.async`` src-size 0). Chunks entirely inside ``[sink,
int2_end)`` (all but the first/last of a range) take a path without position masks and
selects. No TMA: on NHD pages a chunk is 16 scattered 32-byte rows of one head; on HND
pages 1D bulk copies were tried and lost (below). BF16 window chunks use plain vector
loads (few per sequence).

Any page size (``Int2DecodeConfig.any_page``, the ``*_anypage`` builds, 4 warps; session
12): with pages that are not a multiple of 16 tokens a chunk's tokens may lie in several
pages, so the chunk grid, the ring and the compute stay as above and only the issue
changes: lane ``l`` computes the page of token ``l % 16`` of a chunk (``floor(x / page_size)``
by a float reciprocal and one correction each way, a predicated page-id load) one chunk
pair ahead of the chunk's issue (``_page_row_any``), and the code pieces' token rows come by
shuffle (``_issue_rows``). 168.5 / 198 SASS per chunk at D = 128 (pair / decode), 134.5 /
150.5 at D = 64, no spills; the kernels for multiples of 16 compile byte-identically.

Tensor cores (``mma.sync``, 32-bit accumulate): ``S^T = K Q^T`` with 16 tokens as M, the
(up to 8) query heads of the KV head as N and the channels as K; at head_dim 128 on the
int8 tensor cores (IMMA ``m16n8k32`` u8 x s8 -> s32, 8 per 16 tokens: 4 channel quarters x
the query's high and low int8 parts), at head_dim 64 and for BF16 window chunks on HMMA
``m16n8k16`` (fp16 subnormal INT2 codes, resp. bf16). ``O^T = V^T P^T`` on HMMA with 16
channels as M, heads as N, the 16 tokens as K (fp16 for INT2 chunks). The S^T accumulator
reaches the P^T operand through a per-warp 256-byte shared-memory tile: two
``st.shared.b32`` of the packed (head 2q, 2q+1) pairs, one ``ldmatrix.x2.trans`` (before:
4 shuffles, 2 ``prmt`` and a per-lane selector, ~5 ALU instructions more per chunk).

Chunk pairs (``decode_pair``, GQA ratio <= 4): with at most 4 query heads the S^T
accumulator's columns 4-7 would be padding, and the lanes holding them (quad 2, 3) would
run the softmax on nothing -- half of the scale / max / exp / sum / pack instructions per
chunk. So the query fragment holds the group's heads in columns 0-3 and again in 4-7; of an
iteration's two chunks A and B, chunk A's scores are taken from columns 0-3 and chunk B's
from 4-7 (one select per score), and one softmax pass covers both (each lane's params
come from its chunk's stage). Columns 4-7 carry a second running (m, l, O)
per head, merged with columns 0-3 in the CTA combine like another warp's partial. The
pair kernel's P tile has 32-byte token rows ``[0 | P_B (columns 4-7) | P_A (columns 0-3) |
0]`` (the zero bytes written once): one ``ldmatrix.x4.trans`` with rows at byte 16 (lanes
0-15) and byte 0 (lanes 16-31) hands out chunk A's B fragment with columns 4-7 already zero
and chunk B's with columns 0-3 zero (before: an ``x2`` and four selects per chunk pair).
BF16 window chunks (one at a time) use columns 0-3 only. Fast path per 16 tokens and warp:
204 -> 178 SASS at head_dim 128, 151 -> 126.5 at 64; qwen3-8b batch 128 at 128K 2.97 ->
2.66 ms (83 % of the read ceiling). (This is the head_dim-64 pair kernel; head_dim 128
uses the layout below.)

High and low query parts in adjacent columns (``decode_pair`` at head_dim 128, "hl",
session 7): the int8 QK needs two parts per query element, and with the heads twice in
the columns above each chunk ran two IMMA chains of which half the columns were wasted.
Instead column ``2 h`` holds head h's high part and ``2 h + 1`` its low part, so one
chain (4 IMMA per chunk instead of 8) leaves in lane (g, q) the high and low s32 sums of
head q and ``256 hi + lo`` is formed in-lane; the query fragment is 8 registers instead of
16. Every lane then runs head q's softmax: the K rows of the MMA are permuted so that
rows g, g + 8 are tokens 2g, 2g + 1, which makes a lane's two scores per chunk adjacent
tokens (one 64-bit load of their scale/zero pairs, one b32 store of their P pair), and
both chunks of an iteration share one running state per head (4 scores per lane and
pass). P goes through two [head][token] tiles (rows 4-7 zero, written once) and one
non-transposed ``ldmatrix.x4`` hands out both chunks' B fragments; both chunks' PV
accumulate into columns 0-3, whose rescale factors come from the lanes of quads 2q, 2q + 1
(one shuffle each, only when the max moves). BF16 window chunks use the same mapping with
each head in both columns of its pair. With the warp index marked warp-uniform
(``make_warp_uniform``: the ring bookkeeping, range and page-block arithmetic moved to
the uniform datapath and the divergence guards around the shuffles went away) the fast
path is 150.5 SASS per chunk (167.5 before; 161.5 with only the uniform hint; 147.5 since
3f8f063, see the history below), 4 IMMA;
qwen3-8b batch 8 / 32 at 64K-128K 6-8 % faster, batch 50 at 100K under sustained load
7 % (perf/results/2026-11-29_h200_session7_ab_wu.txt, ..._sustain_wu.txt). Without the
uniform hint the same layout spilled l and the correction through local memory and gained
nothing (perf/results/2026-11-29_session7_variants/).

QK on the int8 tensor cores (head_dim 128): each code byte holds its channel quarters'
2-bit fields at bits 0-1, 2-3, 4-5, 6-7, so ``(w * 4^(3 - i)) & 0xC0C0C0C0`` is 64 x the
quarter-i codes of four channels as u8 -- one multiply (IMAD, FMA pipe, where ptxas keeps
it there) and one LOP3 per four codes, no shift; all quarters land on the same scale, so
one s32 chain per query part suffices. The query of a head is split into
``q' ~ a (hi + lo / 256)`` with ``a = max|q'| / 127`` (int8 hi, lo: ~16-bit fixed point,
error <= max|q'| / 65024 per channel, far below bf16 rounding), and the scores are
``s * a * scale_log2 / 16384 * float(256 * S_hi + S_lo) + z * scale_log2 * sum(q')``:
exact integer dot products, no offset to cancel (|256 S_hi + S_lo| < 2^30).

Unmasked K operands (session 20, :func:`k_operand_form`): the ``& 0xC0C0C0C0`` is not
needed. Without it byte ``j`` of ``w * 4^(3 - i)`` is ``64 c_ij`` plus the lower quarters of
byte ``j`` and the upper quarters of byte ``j - 1`` (shifted in from below; nothing enters a
word's byte 0), all linear in the codes, so the IMMA chain over the four quarters computes
``sum Q_ij byte_j(u_i)`` -- and a query ``Q`` exists that makes it exactly ``64 sum q'_ij
c_ij``: a triangular system per 32-bit word (16 elements, each ``q'`` minus multiples <= 1/4
of ones already solved; :func:`oscar_kernels.cute.unmasked_k_query`), solved once per CTA
in the query fragments before the int8 split. u8 operands now reach 255 (192 before):
``|256 S_hi + S_lo| <= 128 * 255 * 127 * 257 < 2^30`` still, and the split's error bound
becomes ``D * 255 / 64 * max|Q| / 65024`` (tests/cute/test_cute_numerics.py checks both and
the exact cancellation over all byte values). 16 LOP3 per chunk fewer (12 with quarter 3
kept masked, the ``"top"`` form: its operand is then a fresh register, not the loaded word,
which the IMMA's register quad otherwise needs copied); which build takes which form was
measured (``k_operand_form``): the pair builds unmasked (merge-CTA build 147.5 -> 134.5
SASS per chunk), ``decode`` / ``decode_w8`` / ``decode_anypage`` top (unmasked, the latter
two spilled in their main loops), ``decode_pair_w8`` masked (137.0 SASS per chunk unmasked,
but qwen3-8b batch 8-16 1-2 % slower).

fp16 operands (V always, K at head_dim 64) are exact fp16 *subnormals*: one
``and`` (LOP3) per fp16 pair, ``w & mask_i`` = ``m_i code 2^-24`` with the 2-bit field of
channel quarter ``i`` at mantissa bits ``2i`` (``m_i`` = 1, 4, 16, 64: all four quarters of
a byte fit in the 10 mantissa bits, a 32-bit word needs one ``shr`` by 8 for its odd
bytes). The V operand pairs (token 2q | token 2q + 1) come straight out of one
``ldmatrix.x4.trans`` per chunk (rows = tokens, 16-bit columns = code byte pairs; x2 at
head_dim 64) instead of four shared loads and four ``prmt`` (fast path 173.5 -> 168 SASS
per chunk at head_dim 128, ``decode`` 201.5 -> 195). The tensor cores take subnormal fp16
inputs exactly (the GPU tests compare with
the reference), so there is no magic offset to remove: no ``-1024 sum(q)`` term for K, no
``sub.f16x2`` for V (the previous magic-number version, 0x6400 = 1024, needed both), and no
cancellation in the O accumulators. ``2^24`` is folded into the score scale
(``score = s 2^24 scale_log2 raw + z scale_log2 sum(q')``) and into the final
normalization; window probabilities are packed as ``p 2^-24`` (bf16 has the range). The
query is pre-divided by ``m_i`` (exact), window operands are multiplied by ``m_i`` in bf16
(``64 v`` could overflow fp16, so window chunks keep bf16 MMAs and their own bf16 query
fragments, rebuilt from shared memory after the INT2 loop). The byte layout (channels
``j + iD/4`` in byte ``j``) makes the MMA K/M index a fixed channel permutation; the query
is loaded and the output written through it, so no data is shuffled. Softmax: online per
head column, running max initialized finite (no -inf guards); the 8-lane max reduction
and the O/l rescale run in one warp-uniform branch only when some lane's scores exceed
the running max.

Why these roles and tiles (measured, perf/results/2026-11-29_h200_*): the kernel is
SM-bound, not memory-bound. Nsight Compute at 5c97ebd (``decode_pair``, qwen3-8b batch 128
at 128K, HND, 2.68 ms): issue slots 63 % busy, integer ALU pipe 61 % of peak, tensor 33 %,
FMA-heavy 24 %, DRAM 77 %, 3.6 of 4 warps per scheduler active; per issued instruction 1.59
cycles stalled on fixed-latency dependencies, 1.14 not selected, 1.05 on the busy math
pipes (at 584d9d9, one chunk per pass: ALU 55 %, DRAM 69 %, 2.98 ms). Executed SASS per
16-token chunk and warp on the fast path (D = 128): 317 (b12a836) -> 293 (52e59d6: two
chunks per iteration, fp16 magic operands) -> 211 (3c9c141: subnormal operands, 32-chunk
row blocks: the issue path went from 146 to 67 instructions per 2 chunks) -> 209.5
(zero-fill copies) -> 205.5 (f187341: int8 QK; integer ALU 103.5 -> 86) -> 204 (c6dfa37: P
through shared memory; ALU 83) -> 178 (5c97ebd: chunk pairs for GQA <= 4; the ALU part,
82.5, is now the K/V unpack) -> 173.5 (30e4949: no source change in the loop; with the
rotation and tail on the tensor cores ptxas keeps more of the issue path's 64-bit bases
in registers; ``decode`` 204 -> 201.5) -> 168 (V operand pairs by ``ldmatrix.trans``;
``decode`` 195) -> 167.5 (session 7: the pair kernel's zero-padded P tile and one ``I2F``
per score; 119.5 at head_dim 64; qwen3-8b batch 8 / 32 at 64K-128K 1.4-1.8 % faster,
perf/results/2026-11-29_h200_session7_ab_*) -> 150.5 (hi / lo query columns and the
warp-uniform hint, above; ``decode`` 186.5, head_dim 64 114.5 / 141.5) -> 147.5 (3f8f063:
hl scores as ``qh2 (s raw + z sum(q') / qh2)`` with ``qh2`` applied inside the exp2 and
once for the lane max, l / correction as FMA chains, full chunks multiply the P pair by
the fp16 ``(s_v, s_v')`` pair in one ``mul.f16x2``; 0.5-1 % at batch 8 / 32; session 8 gave
``decode`` the same three changes: 186.5 -> 180.5 at head_dim 128, 141.5 -> 137 at 64,
llama3-70b-tp8 batch 128 at 64K / 128K 1.1 / 1.3 % faster,
perf/results/2026-11-29_h200_s8_ab_exp2_llama.txt; the head_dim-64 pair kernel keeps its
scaling: there the change measured ~1 % slower, ..._s8_ab_exp2_smollm2.txt) -> 150 (session 8: a
warp's first BF16 window chunk before the INT2 loop instead of after it; no source change
in the loop, but ptxas allocates it without the two spills it had off the fast path and
with 2.5 more SASS on it; ``decode`` 181.5; qwen3-8b batch 128 at 64K / 128K 1.5 % faster,
batch 8-32 at 128K 0.6-0.8 %, batch 1-32 at 32K-64K within +-1 %, llama3-70b-tp8 unchanged;
perf/results/2026-11-29_h200_s8_ab_window_first_*.txt, variant ``v0``. Moving all window
chunks before the loop (``vall``) was slower at batch 8-128, up to 3 % at batch 32 / 32K, and
1 us faster for llama3-70b-tp8 batch 1-8; a separate bf16 query fragment for that chunk
(``p2``) 0.5-2 % slower everywhere) -> 149.5 (session 8: the merge tail in one round trip,
below; the tail's o-row registers were what pushed the loop into spills: no decode kernel
has a stack since; ``decode`` 180.5; qwen3-8b batch 8 at 32K / 64K / 128K 4 / 2.6 / 1.7 %
faster, batch 32 at 32K 2 %, batch 128 1-2 %, llama3-70b-tp8 batch 32 3.5-5 %, batch 128
1.3-1.8 %; batch 1-2 (the merge kernel, or several rounds of 32 rows) unchanged;
perf/results/2026-11-29_h200_s8_ab_tail1_*.txt; then the warps' ranges balanced by bytes
with the window chunks, above: qwen3-8b batch 1 / 32K-128K 1.3-3.4 %, batch 8 0.5-2.2 %,
batch 32 0.5 %, llama3-70b-tp8 batch 32 1.8-4 %, batch 128 / 64K 1 % faster; no SASS change
in the loop; perf/results/2026-11-29_h200_s8_ab_win_cost_*.txt; session 9: ``decode`` takes
both chunks of an iteration through one running-max update, 180.5 -> 178.5 at head_dim 128,
135 -> 130.5 at 64, llama3-70b-tp8 batch 8 at 64K / 128K 3 % faster, batch 32 ~1 %, batch 128
1.3-1.7 %, perf/results/2026-11-29_h200_s9_ab_shared_max_llama.txt). qwen3-8b batch
128 at 128K on HND pages: 4.40 ms (b12a836) ->
3.94 ms (52e59d6) -> 3.19 ms (75c1fc7) -> 2.97 ms (584d9d9, 74 % of the read ceiling, 5.06x
FlashInfer BF16) -> 2.66 ms (5c97ebd, 83 %, 5.64x) -> 2.62 ms (30e4949, 84 %, 5.71x) ->
2.59 ms (8dcdd49, 86 % of that run's 4.40 TB/s ceiling, 5.90x). A separate producer warp
was measured
and lost in an earlier session: 5 warps per CTA fit only 3 CTAs per SM at 128 registers
(6.28 vs 5.01 ms).

Fixed cost per call (the batch-1 regime), H200, cold L2 (an empty kernel under the same
harness takes 3.4 us): at 82d67f8 the qwen3-8b batch-1 8K decode launch took 22.9 us and
the merge kernel 8.2 us; skipping phases at trace time (timing only) showed the query
rotation cost ~6 us, the BF16 windows ~1.5 us and the rest (geometry and page-id loads,
ring prologue, combine, partial stores) ~10 us. Every split prefetched ``R_K`` into L2
(528 CTAs x 64 KB of requests) and the rotation loaded q before ``R_K``; now only split 0
prefetches and the first 64 ``R_K`` rows are in flight while q is staged (75c1fc7): qwen3-8b
batch 1 8K 30.1 -> 25.5 us, 128K 55.7 -> 50.5 us. Programmatic dependent launch of the
merge kernel (decode triggering at its start, merge waiting in ``griddepcontrol.wait``)
saved ~1 us per call in isolation but cost 1-2.5 us per layer in the e2e step (qwen3-8b
batch 1, 8K and 100K), so it was taken out again. Earlier: 5801c73 ran 5-6 launches
(46 us at 8K), 3c91185 one or two (34.5 us).

Query rotation and output rotation on the tensor cores (30e4949, 214c798): the rotation
read 64 KB of float32 ``R_K`` per CTA in two dependent round trips and ran 512 FMAs per
thread (~9 us before the first chunk at every batch size, the CTAs of one SM competing for
issue slots); the merge tail's ``R_V^T`` product likewise (two round trips that miss L2 by
then, ~10 us). Both are now fp16 ``m16n8k16`` MMAs (16 per warp at d = 128) on operands the
host converts once per rotation tensor into fragment order (32 KB per head, one 16-byte
load per fragment, all in flight at once); q and ``o'`` rows get a per-head power-of-two
scale so any finite value fits fp16. Rotation phase 9 -> 3.6 us, tail 10.5 -> 6 us
(perf/results/2026-11-29_h200_session6_ab_mma_rotation_tail_30e4949.txt): qwen3-8b batch 8
at 8K 50.5 -> 36.0 us, batch 128 at 8K 282 -> 239 us, at 64K 1.399 -> 1.362 ms,
llama3-70b-tp8 batch 128 at 128K 428 -> 407 us. The MMAs run first thing in the CTA (after
the geometry and page-id loads are issued): issued after the ring prologue, where their
round trip would overlap the chunk loads, ptxas scheduled the main loop 1.5-4 % longer
(180.5-184 SASS per chunk).

Where a call's time goes (perf/trace_decode.py: %globaltimer stamps per CTA from a build
with ``OSCAR_CUTE_DEBUG=trace``; perf/results/2026-11-29_h200_trace_decode_*): before its
first INT2 chunk a CTA spent 7-12 us (geometry and page-id loads, ring prologue, the query
rotation reading 64 KB of ``R_K`` from L2 in every CTA; 3-5 us since 30e4949), after its
last 2-5 us (BF16 window
chunks, 1-5 per warp at batch 128, unpipelined), 1-3 us combining its warps and, in the CTA
that merges the splits, 6-15 us more (4-8 us since 30e4949). At batch 8-32 (one wave)
this was ~25 us of every call. CTAs on one SM run their INT2 loops at very different
speeds by dispatch order (rank
0 of 4 ~35 % faster than rank 3 at qwen3-8b batch 32, 64K: older warps are issued first),
but an SM's total does not change: a per-(sequence, KV head) queue of 32-chunk blocks that
let the faster CTAs take more work evened the loop times and gained nothing (and cost ~4 %
more instructions per chunk); perf/results/2026-11-29_h200_trace_decode_dyn_queue_*. (Both
that queue and session 7's rank weights worked on a split-fastest grid, where all splits of
a sequence share one dispatch rank; with the wide build's split-major grid the rank weights
do gain, step 2 above.)

Tried and not kept (numbers in perf/results/2026-11-29_h200_cute_session*_sweeps.json,
..._session5_experiments.json and ..._session6_*): one S^T accumulator per chunk pair
(query fragments with columns 4-7 resp. 0-3 zeroed, so no select and half the
``I2F``/combine work: 16 more live registers, ptxas rematerialized the issue path's
addresses, 184 instead of 173.5 SASS per chunk at head_dim 128; 126.5 instead of 128 at
64); the rotation issued after the ring prologue (above); the merge tail with ``R_V``
staged in shared memory by
coalesced ``cp.async`` (the tail's 12 us of ``R_V`` work is not its loads), then that tail
and the query rotation written as small loops for a cold instruction cache (tail 5230 ->
1391 SASS, prologue + rotation 2071 -> 807; batch 8 at 8K 51 -> 46 us, but the main loop's
schedule changed with them and ran 2-4 % slower at 64K-128K); the dynamic chunk queue
(above); more splits at batch 8-128 (the heuristic's choice was the best or within 1 %);
query fragments in shared memory instead of 16 registers (SASS 382 instructions, ptxas
rematerializes anyway); 3 CTAs/SM at 168 registers (again at 3c9c141+: qwen3-8b b128 128K
3.31 vs 3.21 ms, llama3-70b-tp8 b128 0.570 vs 0.459 ms); a producer warp (above); HND
chunks as four ``cp.async.bulk`` copies (each needs a uniform-register waterfall of ~25
instructions: 5.11 vs 4.40 ms); shifts as ``mul.hi`` on the FMA pipe (4.69 vs 4.40 ms);
64-bit per-lane base pointers for IMAD.WIDE addressing with the old per-chunk page walk
(SASS: more spills); four QK accumulator chains (3.955 vs 3.945 ms); one QK chain (205.5
instead of 209.5 SASS per chunk, but b128 128K 3.23 vs 3.19 ms: the dependent MMAs cost
more than the 4 FADDs); the QK of both chunks of an iteration before one shared max
update (stack 88 B, a uniform-register copy per cp.async: 3.32 vs 3.18 ms); K fragments
unpacked right before each MMA (ptxas schedules the same: 215 vs 211.5 SASS per chunk);
the fused split-merge tail for up to 320 rows instead of 128 (qwen3-8b batch 1 8K 50 vs
25.5 us: one CTA pulls the partials too slowly); 8 warps per CTA at 2 CTAs/SM for every
shape (b8-b32 and llama3-70b-tp8 2-4 % faster, qwen3-8b b128 2 % and b1 8K 40 % slower: 32
splits x 4 heads go through the slow fused tail; since session 9 the wide build runs the
single-wave shapes it wins, see ``oscar_kernels.cute.plan`` for the measurements and the
shapes it lost); session 9: the split-major grid with 8-16 splits and rank weights on short
ranges (above); session 14: a chunk pool among a sequence's splits (the last 1/8-1/64 of the
INT2 chunks claimed in pairs with atomics by the warps that run out first, in a second loop:
168.5 SASS per chunk there, the static loop 2-3 longer, and at batch 1 ~3 us, most likely
that loop's cold code; balanced the SMs better but 2-8 % slower at batch 8-128, 13-20 % at
batch 1, docs/cute.md "Session 14"); session 15: a 16-deep ring (``OSCAR_CUTE_STAGES``; batch
1 10-13 % slower), 24-32 wide splits at batch 1 (15-20 % slower) and a merge CTA folding
partials in as they arrive (3.4-4.2 us slower; docs/cute.md "Session 15"); session 19: 1-8
producer warps per CTA issuing the math warps' copies into mbarrier rings (the math loop
129-131.5 instead of 147.5-149.5 SASS per chunk, but one 12-warp CTA per SM: qwen3-8b batch 1
0.6-28 us slower at 32K-128K; docs/cute.md "Session 19", the patch in
perf/results/2026-12-02_session19_variants/).

Session 9, the wide build (8 warps per CTA, 2 CTAs per SM, head_dim 128; 05e0397): in a
single wave every CTA starts, rotates its query, combines its warps and stores its partials
at the same moment on every SM, and that per-CTA work halves per SM with half as many
CTAs; the splits of a sequence halve too. qwen3-8b batch 2-32 2.5-9 % faster (batch 8 /
64K 99 -> 95 us), llama3-70b-tp8 batch 32-256 4-18 %
(perf/results/2026-11-29_h200_s9_ab_w8_*.txt, ..._s9_warps_sweep.txt); the same session
gave ``decode`` one running-max update per chunk pair (history above). Each warp of the
wide build owns one M tile of the query / output rotations (``d / (16 * warps)``), which is
why head_dim 64 (4 M tiles) has no wide build.

Merge CTAs (session 13, the separate build ``decode_pair_mc``: ``merge_ctas`` in the
config, the wide pair kernel otherwise): one more CTA per (sequence, KV head), the grid's
last split slice, runs the merge tail once dry while the splits run (its code into the SM's
instruction cache, ``R_V``'s operand into L2), polls the count the split CTAs leave (fence +
atomic; they never merge) and merges. The host runs it for qwen3-8b batch 1's plan (16
splits, all CTAs in one wave): 0.5-0.8 us faster at 8K-32K, not at 128K. Built into the
shared wide pair build instead, the same role moved every shape's code (uniform block
indices lost, or main-loop spills) by about what it saved
(perf/results/2026-12-01_h200_s13_ab_mergers*.txt), hence a build of its own. Since
session 16 it has a 4-deep ring (``MC_STAGES``) and forms chunk 0's row after the query
rotation, so the page-id load is in flight during the rotation: the traces showed batch 1's
warps consuming a chunk every ~0.39 us with either ring depth (compute, not loads in
flight), and the shallower prologue brings the first chunk in ~0.5 us sooner; qwen3-8b
batch 1 0.5-1.4 us faster (32K 19.4-19.6 vs 20.8-21.0 us; the same reorder in every build
left batch 8 unchanged and llama3-70b-tp8 up to 0.4 % slower, so only this build has it;
perf/results/2026-12-02_h200_s16_ab_re_*.txt).

Ring depth per build (session 17, ``Int2DecodeConfig.stages`` / :func:`default_stages`): a
4-deep ring for ``decode`` (GQA > 4) at head_dim 128, 4 and 8 warps (llama3-70b-tp8 batch
1-128 0.3-3.3 us faster, batch 256 within 0.3 %), and a separate 4-deep ring build of the
pair kernel (``decode_pair_ring4``, 4 and 8 warps) for the shapes where it won (qwen3-8b
batch 2-4: 16 / 8 wide splits, up to 3.9 us; batch 64: one wave of 4-warp CTAs, 2.5-3.5 %);
the pair kernels keep 8 elsewhere (batch 8-16 / 128K 3-4 % and batch 128 / 128K 5 % slower
at 4), and so do head_dim 64 and the any-page pair build; the any-page ``decode`` at head_dim
128 has 4 stages too (docs/cute.md "Session 17").

Resource usage (cuobjdump of the bundle's cubins, ``perf/sass_report.py``, session 20:
perf/results/2026-12-02_sass_report_s20.txt; session 17's in ..._s17.txt; ``decode_pair_w8``
and head_dim 64 cubin-identical to session 12's): every decode kernel 128 registers per
thread (``decode`` D=64 124); the 4-warp builds have no stack and no spills (session 7's
builds had 24-40 B stacks: decode_pair D=128 two LDLs in the main loop off its fast path,
decode D=128 one LDL per two chunks on it; earlier builds up to 72 B), the wide builds small
stacks outside the main loop (decode_pair_w8 24 B, 3 STL; decode_w8 8 B, 1 STL; the
merge-CTA build 16 B, 4 STL; decode_pair_ring4_w8 none; no spills in the loop); at D=128
with an 8-deep ring 45,056 B dynamic smem (ring 36,864 + q rows + q' + P tiles; the merge
tail reuses the ring, the 4-warp builds' own output rotation the q rows) and 83,968 B in
the wide build (ring 73,728); with a 4-deep ring (18,432 / 36,864 B) the shared buffer is
the larger of the ring and the combine / merge staging that reuse it: 20,992 B in the
4-warp builds (29,184 B in all), 36,864 B in decode_w8 (47,104), 37,888 B in the wide pair
builds with 64-row tail blocks (48,128). SASS at D=128: ``decode`` 32 IMMA.16832.U8.S8 (QK) + 112
HMMA.16816 (PV, the query rotation, the output rotation in the merge tail and in the CTA,
BF16 window chunks in two places) + 10 LDSM + 28 LDGSTS (ring and merge-tail rows; 40 with
8 stages) + 1 ATOMG; ``decode_pair`` 16 IMMA + 112 HMMA + 8 LDSM + 40 LDGSTS (its ring-4
build 28); the wide builds 80 HMMA (no CTA output rotation), decode_pair_w8 40 LDGSTS
(64-row tail blocks), decode_w8 20, the wide ring-4 pair 28; no UTMALDG (see "No TMA"
above). Fast path per chunk since session 20 (unmasked K, before in brackets): decode_pair
D=128 137.0 SASS [149.5] (ring-4 build 138.5 [152.0]), decode D=128 165.0 [177.0; 175.5
with 8 stages], the any-page builds 156.0 [168.5] / 186.5 [198.5], D=64 113.5 / 131; wide
builds decode_pair_w8 149.5 (masked; ring-4 138.0 [150.0]) / decode_w8 164.0 [176.0]; the
merge-CTA build 134.5 [147.5] (its split CTAs carry no merge tail); no decode kernel spills
in its main loop; merge kernels 62 / 52 registers.

Debug builds: ``OSCAR_CUTE_DEBUG`` (read at import, so set it for ``aot build``) compiles in
phase skips (timing only) or the %globaltimer trace; unset, the kernels are byte-identical
to a build without the switches.

Constraints (``oscar_kernels.cute.can_implement``): ``head_dim`` 64 or 128;
``group_size == head_dim``; fp16 scales; ``page_size % 16 == 0``; GQA ratio 1..8; NHD or
HND pages; ``num_pages * page_size * num_kv_heads < 2**31``; sm_90.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

# One definition each, shared with the host dispatch: the last CTA of a (sequence, KV head)
# merges its splits when num_splits * group <= FUSED_TAIL_ROWS; CHUNK tokens per chunk;
# WINDOW_CHUNK_COST INT2 chunks per BF16 window chunk in the warps' balanced ranges;
# MAX_GROUP query heads per KV head; MAX_SPLITS splits at most; the split heuristic plans
# for SM_WARPS resident warps per SM (the launch bound below: <= 128 registers per thread);
# CTA_WARPS the warps per CTA of the two builds; RANK0_WEIGHT / RANK_WEIGHT the wide
# build's split shares by dispatch rank.
from . import (CHUNK, CTA_WARPS, FUSED_TAIL_ROWS, MAX_GROUP, MAX_SPLITS, RANK0_WEIGHT,
               RANK_MAX_SPLITS, RANK_MIN_CHUNKS, RANK_WEIGHT, SM_WARPS, TRACE_OFFSET,
               TRACE_WARP_OFFSET, WINDOW_CHUNK_COST, ring_depth, unmasked_k_query)
#: head_dim whose QK runs on the int8 tensor cores (``mma.m16n8k32.u8.s8``): each K code
#: byte holds its four 2-bit fields at bits 0-1, 2-3, 4-5, 6-7; ``w * 4^(3-i) & 0xC0C0C0C0``
#: (one IMAD on the FMA pipe, one LOP3) is 64 x the field of quarter i in every byte, so one
#: LOP3 unpacks four codes (fp16 operands need one per two, plus a shift per word). The query
#: is split into two int8 parts, ``q' ~ a (hi + lo / 256)``, and the s32 scores of both chains
#: are combined as ``hi * 256 + lo`` (~16-bit query, exact integer dot products).
QK_S8_HEAD_DIM = 128
#: o partial rows the fused merge tail stages in shared memory per round trip.
TAIL_ROWS = 32
#: Thread groups of the merge kernel (each sums every MERGE_PARTS-th split).
MERGE_PARTS = 4
#: Bytes of one warp's P tile in shared memory (16 tokens x 8 heads, 16-bit): the S^T
#: accumulator goes to the P^T B operand through it (2 st.shared + ldmatrix.trans).
P_TILE = CHUNK * MAX_GROUP * 2
PAIR_ROW = 32     # bytes per token row of the pair kernel's P tile (2 P_TILE in all)
#: C ABI of the launcher: pointers (int64), then int32 arguments, one float, the stream.
NUM_PTR_ARGS = 18
NUM_INT_ARGS = 18
#: Sleep between a merge CTA's polls of its counter (ns; ``nanosleep`` is approximate).
MERGER_SLEEP_NS = 100
#: Experiments only (read at import, like _DEBUG): every build's default depth
_STAGES_OVERRIDE = os.environ.get("OSCAR_CUTE_STAGES")
if _STAGES_OVERRIDE is not None and not (
        _STAGES_OVERRIDE.isdigit() and int(_STAGES_OVERRIDE) >= 4
        and int(_STAGES_OVERRIDE) & (int(_STAGES_OVERRIDE) - 1) == 0):
    raise ValueError(f"OSCAR_CUTE_STAGES: expected a power of two >= 4, got {_STAGES_OVERRIDE!r}")
#: Experiments only (read at import): ``OSCAR_CUTE_K_OPERANDS=masked|unmasked|top`` builds
#: every head_dim-128 kernel with that K operand form (see k_operand_form)
K_OPERAND_FORMS = ("masked", "unmasked", "top")
_K_FORM_OVERRIDE = os.environ.get("OSCAR_CUTE_K_OPERANDS")
if _K_FORM_OVERRIDE not in (None,) + K_OPERAND_FORMS:
    raise ValueError(f"OSCAR_CUTE_K_OPERANDS: expected one of {K_OPERAND_FORMS}, got "
                     f"{_K_FORM_OVERRIDE!r}")
#: Experiments only (read at import): ``OSCAR_CUTE_RANK_WEIGHTS=W0/W`` builds the wide
#: kernels with rank weights W0 / W instead of RANK0_WEIGHT / RANK_WEIGHT
_rank_w = os.environ.get("OSCAR_CUTE_RANK_WEIGHTS", f"{RANK0_WEIGHT}/{RANK_WEIGHT}").split("/")
if len(_rank_w) != 2 or not all(x.isdigit() and int(x) > 0 for x in _rank_w):
    raise ValueError(f"OSCAR_CUTE_RANK_WEIGHTS: expected W0/W (positive ints), got {_rank_w!r}")
_RANK0_W, _RANK_W = int(_rank_w[0]), int(_rank_w[1])
#: Debug builds only (read when the module is imported, so set it for ``aot build``): a
#: comma-separated list of phases to leave out -- ``rot`` (query rotation), ``loop`` (INT2
#: chunks), ``win`` (BF16 window chunks), ``tail`` (split merge), ``merge`` (the merge after
#: the ticket), ``fence``, ``sums`` (the merge tail's per-split sums), ``nocons`` (the INT2
#: loop's copies and waits without its math), ``noload`` (its math without the copies, on
#: whatever the ring holds; page sizes that are multiples of 16) -- (results are wrong: for
#: timing what each phase adds), and/or
#: ``trace``: thread 0 of every CTA stores %globaltimer at its phase boundaries into the
#: ticket buffer (``OSCAR_CUTE_TRACE=1`` makes the host allocate room; read by
#: perf/trace_decode.py), with ``pro`` also when the CTA's prologue loads had arrived
#: (stamps 11-15) or with ``ramp`` when warp 0's INT2 chunks 0, 8, 16 and 24 had (11-14;
#: ``trace_decode.py --ramp``) or with ``clk`` the SM's ``%clock64`` at the INT2 loop's start
#: and end (11-12; ``trace_decode.py --clock``: the SM clock over the loop). Unset (the
#: shipped bundle), the kernels are byte-identical
#: to a build without these switches.
_DEBUG = frozenset(x for x in os.environ.get("OSCAR_CUTE_DEBUG", "").split(",") if x)
_PRO = "trace" in _DEBUG and "pro" in _DEBUG
_RAMP = "trace" in _DEBUG and "ramp" in _DEBUG and not _PRO
_CLK = "trace" in _DEBUG and "clk" in _DEBUG
if _CLK and (_PRO or _RAMP):
    raise ValueError("OSCAR_CUTE_DEBUG: clk, pro and ramp use the same trace slots (11-15); "
                     f"got {sorted(_DEBUG)}")


@dataclass(frozen=True)
class Int2DecodeConfig:
    """Static compile key of :class:`Int2PagedDecodeSm90`."""

    head_dim: int
    #: GQA ratios <= 4 only: two chunks per softmax pass (see ``_int2_pair``)
    pair: bool = False
    #: Warps per CTA (every warp an independent KV split): 4 (4 CTAs per SM) or 8 (2 CTAs
    #: per SM, head_dim 128 only: the query / output rotation gives each warp an M tile)
    warps: int = 4
    #: Pages of any size (not a multiple of CHUNK, e.g. SGLang's default 1): a chunk's 16
    #: tokens may lie in several pages, so every lane finds its token's page (see
    #: ``_page_row_any``); 4 warps only
    any_page: bool = False
    #: Merge CTAs (the wide pair build for single-wave shapes, see ``_merger``): one more CTA
    #: per (sequence, KV head) merges its splits; 8 warps and ``pair`` only
    merge_ctas: bool = False
    #: Depth of each warp's cp.async ring, a power of two >= 4 (the ring index is
    #: ``chunk & (stages - 1)``); 0: the build's default (:func:`default_stages`). The
    #: shallow pair builds (``decode_pair_ring4``) set 4.
    stages: int = 0

    def __post_init__(self):
        s = self.stages
        if s != 0 and not (s >= 4 and s & (s - 1) == 0):
            raise ValueError(f"stages: expected 0 or a power of two >= 4, got {s!r}")

    @property
    def ring(self) -> int:
        """The ring depth this config compiles with."""
        return self.stages or default_stages(self)

    @property
    def name(self) -> str:
        wide = "_w8" if self.warps == 8 else ""
        anyp = "_anypage" if self.any_page else ""
        mc = "_mc" if self.merge_ctas else ""
        ring = f"_ring{self.stages}" if self.stages else ""
        return (f"int2_decode{'_pair' if self.pair else ''}{anyp}{mc}{ring}{wide}"
                f"_sm90_d{self.head_dim}")

    @property
    def merge_name(self) -> str:
        return f"int2_decode_merge_sm90_d{self.head_dim}"


def default_stages(config: Int2DecodeConfig) -> int:
    """The ring depth of a build that does not set ``stages``: ``OSCAR_CUTE_STAGES`` when set
    (experiments), else :func:`oscar_kernels.cute.ring_depth` (the host plans with the same
    rule): 4 for the merge-CTA build (session 16) and for ``decode`` (GQA > 4) at head_dim 128
    (4 or 8 warps, and the any-page build), else 8.
    Session 17 measured every build at 4 against 8 stages on an H200 (alternating rounds,
    perf/results/2026-12-02_h200_s17_ab_st4_*_1ab0693.txt): llama3-70b-tp8 (GQA 8)
    faster at batch 1-128 (batch 8 / 64K 31.8 -> 29.9 us, batch 64 / 8K 35 -> 31.7 us) and
    within 0.3 % at batch 256; the pair builds lose at some shapes (qwen3-8b batch 8-16 / 128K
    3-4 %, batch 128 / 128K 5 %; head_dim 64 batch 32 / 128K 3 %), so they keep 8 and the
    host picks the separate ``decode_pair_ring4`` builds where those won
    (``oscar_kernels.cute.use_ring4``). The any-page builds at 1-token pages
    (..._s17_ab_st4_anypage_*_144aa2d.txt): ``decode_anypage`` at head_dim 128 0.4-2.8 us
    faster at llama3-70b-tp8 batch 1-8 and 32K, within 0.5 % at batch 32-128 / 128K, so it
    has 4 stages too; ``decode_pair_anypage`` was 3 us faster at qwen3-8b batch 1 but 20 %
    slower at batch 2 / 128K (head_dim 64: up to 22 % slower at batch 8 / 128K) and keeps 8."""
    if _STAGES_OVERRIDE is not None:
        return int(_STAGES_OVERRIDE)
    return ring_depth(config.head_dim, config.pair, config.merge_ctas)


def k_operand_form(config: Int2DecodeConfig) -> str:
    """The u8 K operands of the int8 QK (head_dim 128): ``"masked"`` (``w * 4^(3 - i) &
    0xC0C0C0C0``, 64 x the quarter-i fields), ``"unmasked"`` (``w * 4^(3 - i)``: 16 LOP3 per
    chunk fewer; the other bits are cancelled by the query fragments,
    :func:`oscar_kernels.cute.unmasked_k_query`) or ``"top"`` (quarters 0-2 unmasked,
    quarter 3 masked: 12 fewer, and its operand a fresh register instead of the loaded word
    itself, which the MMA's register quad then needs copied); ``"none"`` at head_dim 64
    (fp16 operands). Session 20, measured on an H200 in alternating rounds
    (perf/results/2026-12-02_h200_s20_ab_*):

    * the pair builds but ``decode_pair_w8``: unmasked (``decode_pair_mc`` 147.5 -> 134.5
      SASS per chunk; qwen3-8b batch 1 0.4-1.1 us faster at 32K-128K, batch 4 1.5-2 %; with
      quarter 3 masked 136.0, the same time);
    * ``decode_pair_w8``: masked (unmasked 137.0 SASS per chunk against 149.5, yet qwen3-8b
      batch 8 and 16 1-2 % slower at 32K-128K, "top" as well, with any rank weights);
    * ``decode`` / ``decode_w8`` / ``decode_anypage`` (GQA > 4): top (177 / 176 / 198.5 ->
      165 / 164 / 186.5 SASS per chunk; unmasked, ``decode_w8`` and ``decode_anypage`` spill
      4 / 6 registers in their main loops): llama3-70b-tp8 batch 32 2.4-3.3 %, batch 128
      2.8-3.6 % faster at 32K-128K, batch 8 0.3-0.8 us.

    ``OSCAR_CUTE_K_OPERANDS`` overrides it for every build (experiments)."""
    if config.head_dim != QK_S8_HEAD_DIM:
        return "none"
    if _K_FORM_OVERRIDE is not None:
        return _K_FORM_OVERRIDE
    if not config.pair:
        return "top"
    wide_pair = config.warps == 8 and not config.merge_ctas and not config.stages
    return "masked" if wide_pair else "unmasked"


# ------------------------------------------------------------------ PTX helpers
def _ptx(code, outs, ins):
    return cute.arch.inline_ptx(code, write_only_types=outs, read_only_args=ins)


def _ldg_b32(addr):
    return _ptx("ld.global.nc.L1::no_allocate.b32 {$w0}, [{$r0}];", [Int32], [addr])


def _ldg_v2(addr):
    return _ptx("ld.global.nc.L1::no_allocate.v2.b32 {{$w0}, {$w1}}, [{$r0}];", [Int32, Int32],
                [addr])


def _ldg_v4(addr):
    return _ptx("ld.global.nc.L1::no_allocate.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                [Int32] * 4, [addr])


def _ldg_s32(addr):
    return _ptx("ld.global.b32 {$w0}, [{$r0}];", [Int32], [addr])


def _stg_f32(addr, val):
    _ptx("st.global.f32 [{$r0}], {$r1};", [], [addr, val])


def _prmt(a, b, sel: int):
    return _ptx(f"prmt.b32 {{$w0}}, {{$r0}}, {{$r1}}, {hex(sel)};", [Int32], [a, b])


def _f16x2_to_f32(word):
    return _ptx("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, {$r0}; cvt.f32.f16 {$w0}, lo; "
                "cvt.f32.f16 {$w1}, hi; }", [Float32, Float32], [word])


def _bf16x2_to_f32(word):
    return _ptx("{ .reg .b32 t; shl.b32 t, {$r0}, 16; mov.b32 {$w0}, t; "
                "and.b32 t, {$r0}, 0xffff0000; mov.b32 {$w1}, t; }", [Float32, Float32], [word])


def _pack_bf16x2(lo, hi):
    return _ptx("cvt.rn.bf16x2.f32 {$w0}, {$r1}, {$r0};", [Int32], [lo, hi])


def _sel_f32(flag, a, b):
    """``a if flag != 0 else b`` (flag an Int32)."""
    return _ptx("{ .reg .pred p; setp.ne.s32 p, {$r2}, 0; selp.f32 {$w0}, {$r0}, {$r1}, p; }",
                [Float32], [a, b, flag])


def _fmax(a, b):
    return _ptx("max.f32 {$w0}, {$r0}, {$r1};", [Float32], [a, b])


def _ex2(x):
    return _ptx("ex2.approx.ftz.f32 {$w0}, {$r0};", [Float32], [x])


def _lg2(x):
    return _ptx("lg2.approx.f32 {$w0}, {$r0};", [Float32], [x])


def _fabs(x):
    return _ptx("abs.f32 {$w0}, {$r0};", [Float32], [x])


def _rcp_exact(x):
    return _ptx("rcp.rn.f32 {$w0}, {$r0};", [Float32], [x])


def _rcp(x):
    return _ptx("rcp.approx.f32 {$w0}, {$r0};", [Float32], [x])


def _pack_f16x2(lo, hi):
    return _ptx("cvt.rn.f16x2.f32 {$w0}, {$r1}, {$r0};", [Int32], [lo, hi])


def _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, f16: bool = False):
    t = "f16" if f16 else "bf16"
    return _ptx(f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 "
                "{{$w0}, {$w1}, {$w2}, {$w3}}, {{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, "
                "{{$r6}, {$r7}, {$r8}, {$r9}};", [Float32] * 4,
                [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3])


def _mma_u8s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """``mma.sync.m16n8k32`` u8 x s8 -> s32 (IMMA)."""
    return _ptx("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 "
                "{{$w0}, {$w1}, {$w2}, {$w3}}, {{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, "
                "{{$r6}, {$r7}, {$r8}, {$r9}};", [Int32] * 4,
                [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3])


def _ldsm_x2_trans(addr):
    """Two 8x8 16-bit tiles (rows from lanes 0-15), transposed: ``ldmatrix .x2 .trans``."""
    return _ptx("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {{$w0}, {$w1}}, [{$r0}];",
                [Int32, Int32], [addr])


def _ldsm_x2(addr):
    """Two 8x8 16-bit tiles (rows from lanes 0-15): ``ldmatrix .x2``."""
    return _ptx("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{$w0}, {$w1}}, [{$r0}];",
                [Int32, Int32], [addr])


def _ldsm_x4(addr):
    """Four 8x8 16-bit tiles (row addresses from lanes 0-31): ``ldmatrix .x4``."""
    return _ptx("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{$w0}, {$w1}, {$w2}, {$w3}}, "
                "[{$r0}];", [Int32] * 4, [addr])


def _ldsm_x4_trans(addr):
    """Four 8x8 16-bit tiles (row addresses from lanes 0-31), transposed."""
    return _ptx("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{$w0}, {$w1}, {$w2}, {$w3}}, "
                "[{$r0}];", [Int32] * 4, [addr])


def _mul_u32(x, k: int):
    """``x * k`` (mul.lo: ptxas may issue it as IMAD on the FMA pipe)."""
    return _ptx(f"mul.lo.u32 {{$w0}}, {{$r0}}, {k};", [Int32], [x])


def _mad_s32(x, k: int, y):
    return _ptx(f"mad.lo.s32 {{$w0}}, {{$r0}}, {k}, {{$r1}};", [Int32], [x, y])


def _i2f(x):
    return _ptx("cvt.rn.f32.s32 {$w0}, {$r0};", [Float32], [x])


def _f2i_rn(x):
    return _ptx("cvt.rni.s32.f32 {$w0}, {$r0};", [Int32], [x])


def _pack_s8x4(x0, x1, x2, x3):
    """Low bytes of four Int32 -> one b32 (x0 in byte 0)."""
    t01 = _prmt(x0, x1, 0x0040)
    t23 = _prmt(x2, x3, 0x0040)
    return _prmt(t01, t23, 0x5410)


def _shfl_bfly(x, m):
    return cute.arch.shuffle_sync_bfly(x, offset=m)


def _shfl_idx(x, src):
    return cute.arch.shuffle_sync(x, offset=src)


NEG_INF = -math.inf
#: Initial running max: finite, so that exp2(score - max) needs no -inf guard (masked scores
#: are -inf and give 0; the first real score replaces it and rescales zeros).
M_INIT = -1.0e30
#: Smallest normal float32.
FLT_MIN = 2.0 ** -126
#: INT2 operands are fp16 *subnormals*: the 2-bit field of channel quarter i sits at bits
#: 2i of a code byte, and ``w & mask_i`` read as an fp16 pair is ``m_i * code * 2^-24``
#: exactly (subnormal fp16 = mantissa * 2^-24; the tensor cores take subnormal inputs). One
#: ``and`` per pair, no offset to remove; the 2^-24 is folded into the score scale and the
#: output normalization.
SUBNORMAL = 2.0 ** -24
#: Multiplier of the code of channel quarter i after the unpack (its field sits at mantissa
#: bits 2i of the fp16 value).
QUARTER_MULT = (1.0, 4.0, 16.0, 64.0)
QUARTER_MASK = (0x00030003, 0x000C000C, 0x00300030, 0x00C000C0)


def _and_mask(x, mask: int):
    """``x & mask``: an fp16 pair ``m * code * 2^-24`` (subnormals; one LOP3)."""
    return _ptx(f"and.b32 {{$w0}}, {{$r0}}, {hex(mask)};", [Int32], [x])


def _shr(x, n: int):
    return _ptx(f"shr.u32 {{$w0}}, {{$r0}}, {n};", [Int32], [x])


def _mul_bf16x2(x, m: float):
    if m == 1.0:
        return x
    bits = {4.0: 0x40804080, 16.0: 0x41804180, 64.0: 0x42804280}[m]
    return _ptx(f"{{ .reg .b32 c; mov.b32 c, {hex(bits)}; mul.rn.bf16x2 {{$w0}}, {{$r0}}, c; }}",
                [Int32], [x])


def _mul_f16x2(a, b):
    return _ptx("mul.rn.f16x2 {$w0}, {$r0}, {$r1};", [Int32], [a, b])


def _f16hi_to_f32(word):
    return _ptx("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, {$r0}; cvt.f32.f16 {$w0}, hi; }",
                [Float32], [word])


def _mad_wide_u32(a, b: int, c):
    """``c + (u64) a * b`` (a: Int32 read as unsigned, c: Int64)."""
    return _ptx(f"mad.wide.u32 {{$w0}}, {{$r0}}, {b}, {{$r1}};", [Int64], [a, c])


def _cp_async16_if(c, n, smem_addr, gaddr):
    """16-byte cp.async of which nothing is read unless ``c < n`` (src-size 0: the stage
    bytes are zero-filled, no global access; no predicate, no branch)."""
    _ptx("{ .reg .pred p; .reg .b32 sz; setp.lt.s32 p, {$r0}, {$r1}; selp.b32 sz, 16, 0, p; "
         "cp.async.cg.shared.global [{$r2}], [{$r3}], 16, sz; }", [], [c, n, smem_addr, gaddr])


def _cp_async4_if(c, n, smem_addr, gaddr):
    _ptx("{ .reg .pred p; .reg .b32 sz; setp.lt.s32 p, {$r0}, {$r1}; selp.b32 sz, 4, 0, p; "
         "cp.async.ca.shared.global [{$r2}], [{$r3}], 4, sz; }", [], [c, n, smem_addr, gaddr])


def _udiv_rcp(x, d, inv):
    """``floor(x / d)`` for ``0 <= x < 2^24``, ``d >= 1``, ``inv = 1 / d`` (float): the
    truncated product and one correction each way."""
    return _ptx("{ .reg .f32 f; .reg .s32 q, r; .reg .pred p; cvt.rn.f32.s32 f, {$r0}; "
                "mul.f32 f, f, {$r2}; cvt.rzi.s32.f32 q, f; mul.lo.s32 r, q, {$r1}; "
                "sub.s32 r, {$r0}, r; setp.ge.s32 p, r, {$r1}; @p add.s32 q, q, 1; "
                "setp.lt.s32 p, r, 0; @p sub.s32 q, q, 1; mov.b32 {$w0}, q; }",
                [Int32], [x, d, inv])


def _ldg_s32_if(addr, flag):
    """``*addr`` when ``flag`` != 0, else 0 (predicated load, no branch)."""
    return _ptx("{ .reg .pred p; setp.ne.s32 p, {$r1}, 0; mov.b32 {$w0}, 0; "
                "@p ld.global.s32 {$w0}, [{$r0}]; }", [Int32], [addr, flag])


def _cp_commit():
    _ptx("cp.async.commit_group;", [], [])


def _cp_wait(n: int):
    _ptx(f"cp.async.wait_group {n};", [], [])


def _syncwarp():
    _ptx("bar.warp.sync 0xffffffff;", [], [])


def _lds_b32(addr):
    return _ptx("ld.shared.b32 {$w0}, [{$r0}];", [Int32], [addr])


def _lds_v2(addr):
    return _ptx("ld.shared.v2.b32 {{$w0}, {$w1}}, [{$r0}];", [Int32, Int32], [addr])


def _lds_v2f(addr):
    return _ptx("ld.shared.v2.f32 {{$w0}, {$w1}}, [{$r0}];", [Float32, Float32], [addr])


def _f32_bits(x):
    return _ptx("mov.b32 {$w0}, {$r0};", [Int32], [x])


def _bits_f32(x):
    return _ptx("mov.b32 {$w0}, {$r0};", [Float32], [x])


class Int2PagedDecodeSm90:
    """Split-KV INT2/BF16 paged decode attention, one specialization per ``head_dim``.

    Per thread (lane = 4 * ``g`` + ``quad``): query head ``g`` of the GQA group for QK rows,
    tokens ``g`` and ``g + 8`` of a chunk for K codes, tokens ``2 quad + {0, 1, 8, 9}`` for
    scores, V codes and all scale/zero pairs. Channel permutations:

    * fp16/bf16 QK (head_dim 64 INT2 chunks, all window chunks): K index
      ``16 s + 2 quad + j + 8 half`` is channel
      ``quad * D/16 + 4 (r // 8) + r % 2 + 2 j + ((r % 8) // 2) * D/4`` with ``r = 2 s + half``;
    * int8 QK (head_dim 128 INT2 chunks), step ``i`` (channel quarter): K index
      ``4 quad + b (+ 16)`` is channel ``8 quad + b (+ 4) + 32 i``;
    * PV M row ``16 mt + g + 8 rh`` is channel ``2 g + 16 (mt // 4) + rh + (mt % 4) * D/4``
      (V code byte pairs ``g`` and ``g + 8`` of a token, as one ``ldmatrix.trans`` hands
      them out).

    fp16 INT2 operands are subnormals ``m_i * code * 2^-24`` with ``m_i`` = 1, 4, 16, 64 for
    channel quarter ``i``: the query is pre-divided by ``m_i`` (exact, powers of two), ``2^24``
    and ``1 / m_i`` are folded into the score scale and the output normalization, and BF16
    window operands are multiplied by ``m_i`` (bf16 MMAs, probabilities times ``2^-24``) so
    that both share one accumulator. int8 INT2 operands are ``64 * code`` (u8) against the
    query's two int8 parts (see the module docstring).

    Warp roles: every warp is its own producer (``cp.async`` of whole 16-token chunks into a
    per-warp ``stages``-deep shared-memory ring) and consumer (unpack + MMA); warps of a CTA
    are independent KV splits, so no CTA barrier is needed.
    """

    def __init__(self, config: Int2DecodeConfig):
        d = config.head_dim
        if d not in (64, 128):
            raise ValueError(f"head_dim: expected 64 or 128, got {d}")
        if config.warps not in CTA_WARPS or (d // 16) % config.warps != 0:
            raise ValueError(f"warps: expected one of {CTA_WARPS} dividing head_dim / 16 = "
                             f"{d // 16}, got {config.warps}")
        if config.any_page and config.warps != 4:
            raise ValueError(f"warps: the any-page build has 4 warps per CTA, got {config.warps}")
        if config.merge_ctas and not (config.warps == 8 and config.pair):
            raise ValueError("merge_ctas: the merge-CTA build is the wide pair build (warps 8, "
                             f"pair), got warps {config.warps}, pair {config.pair}")
        self.any_page = config.any_page
        self.merge_ctas = config.merge_ctas
        self.config = config
        self.d = d
        self.nw = config.warps         # warps per CTA
        # the wide build: split-major grid and rank-weighted split shares (see the kernel)
        self.ranked = self.nw == 8
        self.ksteps = d // 16          # QK K steps
        self.mtiles = d // 16          # PV M tiles
        self.nbk = d // 16             # K-code bytes per thread and token
        self.nbv = d // 32             # V-code bytes per thread and token
        self.s8 = d == QK_S8_HEAD_DIM  # QK on the int8 tensor cores (else fp16 subnormals)
        self.pair = config.pair        # GQA <= 4: chunk pairs share one softmax pass
        # pair kernel with the int8 QK: the query's high and low parts in adjacent MMA
        # columns (2 h, 2 h + 1 = head h), one QK chain per chunk (see _int2_pair_hl)
        self.hl = self.pair and self.s8
        # the int8 QK's K operands: masked fields, or unmasked (all quarters, or all but
        # quarter 3) with the query cancelling the other bits (see k_operand_form)
        self.k_form = k_operand_form(config)
        # the merge tail's per-split sums: unrolled by 8 in the wide pair build (batch 1
        # merges 16 splits x 4 heads there; its main loop's SASS is unchanged by it, which
        # perf/sass_report.py --dump-fast checks), left to the compiler (-1) elsewhere, where
        # an explicit unroll moved the main loops (session 11, docs/cute.md)
        self.tail_unroll = 8 if self.pair and self.nw == 8 else -1
        # 4-warp builds apply R_V^T in the combine when there is one split or the merge
        # kernel runs (see the combine); the wide builds never plan the merge kernel, and
        # the same code there moved their main loops (perf/sass_report.py: 149.5 -> 151.5
        # and 176.5 -> 179 SASS per chunk), so they keep the ticket path for one split too
        self.out_rotation = self.nw == 4
        self.row_bytes = d // 4        # code bytes per token and head
        self.stage_bytes = 2 * CHUNK * self.row_bytes + 2 * CHUNK * 4
        self.stages = config.ring
        self.combine_bytes = (MAX_GROUP + MAX_GROUP * d) * 4   # per warp: lse2[8], o[8][d]
        # partial rows per merge-tail round trip: the wide pair build stages 64 (qwen3-8b
        # batch 1: 16 splits x 4 heads in one; its main loop's SASS listing unchanged;
        # batch 2-3 0.3-1 us faster, ..._s12_ab_t64_68ef28d.txt)
        self.tail_rows = 64 if self.pair and self.nw == 8 else TAIL_ROWS
        merge_bytes = (32 * self.nw + MAX_GROUP * d + self.tail_rows * d) * 4
        # the ring's shared memory, reused by the combine and the merge tail (the ring alone
        # at 8 stages; the larger of them with a 4-deep ring)
        self.ring_bytes = max(self.nw * self.stages * self.stage_bytes, merge_bytes,
                              self.nw * self.combine_bytes)
        # ring + q rows (float32) + q' (bf16)
        self.smem_bytes = self.ring_bytes + MAX_GROUP * d * (4 + 2) + self.nw * 2 * P_TILE
        assert FUSED_TAIL_ROWS <= 32 * self.nw   # one lse partial per thread in the tail

    # ---------------------------------------------------------- channel maps
    def pv_channel(self, mt: int, rh: int, g):
        return 2 * g + 16 * (mt // 4) + rh + (mt % 4) * (self.d // 4)

    # ------------------------------------------------------------ host entry
    @cute.jit
    def __call__(self, q_ptr: Int64, kc_ptr: Int64, kp_ptr: Int64, vc_ptr: Int64,
                 vp_ptr: Int64, kw_ptr: Int64, vw_ptr: Int64, indptr_ptr: Int64,
                 indices_ptr: Int64, last_ptr: Int64, slots_ptr: Int64, opart_ptr: Int64,
                 lsepart_ptr: Int64, rk_ptr: Int64, rv_ptr: Int64, o_ptr: Int64, lse_ptr: Int64,
                 counter_ptr: Int64, batch_size: Int32, num_kv_heads: Int32, group: Int32,
                 page_size: Int32, stride_page: Int32, stride_slot: Int32, stride_head: Int32,
                 sink: Int32, recent: Int32, num_splits: Int32, rk_stride: Int32,
                 rv_stride: Int32, q_kind: Int32, q_stride_b: Int32, q_stride_h: Int32,
                 o_kind: Int32, o_stride_b: Int32, o_stride_h: Int32, scale_log2: Float32,
                 stream: cuda.CUstream):
        grid = [num_splits, num_kv_heads, batch_size]
        if cutlass.const_expr(self.merge_ctas):
            # split-major, and a last split slice of merge CTAs (dispatched after every split)
            grid = [num_kv_heads, batch_size, num_splits + 1]
        elif cutlass.const_expr(self.ranked):
            # split-major for few splits (see the kernel): (head, sequence, split)
            sm = num_splits <= RANK_MAX_SPLITS
            grid = [Int32(cutlass.select_(sm, num_kv_heads, num_splits)),
                    Int32(cutlass.select_(sm, batch_size, num_kv_heads)),
                    Int32(cutlass.select_(sm, num_splits, batch_size))]
        self.kernel(q_ptr, kc_ptr, kp_ptr, vc_ptr, vp_ptr, kw_ptr, vw_ptr, indptr_ptr,
                    indices_ptr, last_ptr, slots_ptr, opart_ptr, lsepart_ptr, rk_ptr, rv_ptr,
                    o_ptr, lse_ptr, counter_ptr, num_kv_heads, group, page_size, stride_page,
                    stride_slot, stride_head, sink, recent, num_splits, rk_stride, rv_stride,
                    q_kind, q_stride_b, q_stride_h, o_kind, o_stride_b, o_stride_h,
                    scale_log2).launch(grid=grid,
                                       block=(32 * self.nw, 1, 1), stream=stream,
                                       smem=self.smem_bytes,
                                       max_number_threads=[32 * self.nw, 1, 1],
                                       min_blocks_per_mp=SM_WARPS // self.nw,
                                       preferred_smem_carveout=100)

    # ---------------------------------------------------------- the kernel
    @cute.kernel
    def kernel(self, q_ptr: Int64, kc_ptr: Int64, kp_ptr: Int64, vc_ptr: Int64, vp_ptr: Int64,
               kw_ptr: Int64, vw_ptr: Int64, indptr_ptr: Int64, indices_ptr: Int64,
               last_ptr: Int64, slots_ptr: Int64, opart_ptr: Int64, lse_ptr_part: Int64,
               rk_ptr: Int64, rv_ptr: Int64, o_ptr: Int64, lse_ptr: Int64, counter_ptr: Int64,
               num_kv_heads: Int32, group: Int32, page_size: Int32, stride_page: Int32,
               stride_slot: Int32, stride_head: Int32, sink: Int32, recent: Int32,
               num_splits: Int32, rk_stride: Int32, rv_stride: Int32, q_kind: Int32,
               q_stride_b: Int32, q_stride_h: Int32, o_kind: Int32, o_stride_b: Int32,
               o_stride_h: Int32, scale_log2: Float32):
        args = (q_ptr, kc_ptr, kp_ptr, vc_ptr, vp_ptr, kw_ptr, vw_ptr, indptr_ptr, indices_ptr,
                last_ptr, slots_ptr, opart_ptr, lse_ptr_part, rk_ptr, rv_ptr, o_ptr, lse_ptr,
                counter_ptr, num_kv_heads, group, page_size, stride_page, stride_slot,
                stride_head, sink, recent, num_splits, rk_stride, rv_stride, q_kind,
                q_stride_b, q_stride_h, o_kind, o_stride_b, o_stride_h, scale_log2)
        if cutlass.const_expr(self.merge_ctas):
            h, b, split = cute.arch.block_idx()
            if split == num_splits:
                self._merger(h, b, opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr,
                             counter_ptr, num_kv_heads, group, num_splits, rv_stride, o_kind,
                             o_stride_b, o_stride_h)
            else:
                self._work(args, split, h, b)
        else:
            split, h, b = cute.arch.block_idx()
            if cutlass.const_expr(self.ranked):
                # the wide build with at most RANK_MAX_SPLITS splits: split-major grid (head,
                # sequence, split), so a sequence's splits span dispatch ranks (weights below)
                if num_splits <= RANK_MAX_SPLITS:
                    h, b, split = cute.arch.block_idx()
            self._work(args, split, h, b)

    @cute.jit
    def _work(self, args, split, h, b):
        """The CTA of split ``split`` of (sequence ``b``, KV head ``h``): attention over its
        share, the combine of its warps, the ticket (and the merge tail when it draws the
        last one, except in the merge-CTA build). ``args``: the kernel's arguments."""
        (q_ptr, kc_ptr, kp_ptr, vc_ptr, vp_ptr, kw_ptr, vw_ptr, indptr_ptr, indices_ptr,
         last_ptr, slots_ptr, opart_ptr, lse_ptr_part, rk_ptr, rv_ptr, o_ptr, lse_ptr,
         counter_ptr, num_kv_heads, group, page_size, stride_page, stride_slot, stride_head,
         sink, recent, num_splits, rk_stride, rv_stride, q_kind, q_stride_b, q_stride_h,
         o_kind, o_stride_b, o_stride_h, scale_log2) = args
        d = self.d
        tidx, _, _ = cute.arch.thread_idx()
        # warp-uniform: what derives from it (split ranges, ring stages, page blocks) can live
        # in uniform registers (167.5 -> 161.5 SASS per chunk, no divergence guards)
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        g = lane // 4
        quad = lane % 4
        num_qo_heads = num_kv_heads * group
        nsw = num_splits * self.nw
        wsplit = split * self.nw + warp
        cta = (b * num_kv_heads + h) * num_splits + split   # debug trace slot
        _trace(counter_ptr, cta, 0, tidx)
        smem = cute.arch.get_dyn_smem(cutlass.Int8, alignment=16).toint()
        smem_warp = smem + warp * (self.stages * self.stage_bytes)
        s_x = smem + self.ring_bytes                 # [MAX_GROUP, d] float32: q rows
        s_q = s_x + MAX_GROUP * d * 4                # [MAX_GROUP, d] bf16: q' = q @ R_K

        # ---- L2 prefetch, from split 0 only, of R_K[h] (the later rows of the query
        # rotation) and of R_V[h] (the merge tail or the combine reads it). Every split
        # prefetching R_K cost qwen3-8b batch 1 (528 CTAs) several us of L2 requests.
        lines = d * d * 2 // 128 // (32 * self.nw)    # fp16 operands: d * d * 2 bytes
        if split == 0:
            rk_rows = rk_ptr + Int64(h) * Int64(rk_stride) * 4 + Int64(tidx) * 128
            for i in cutlass.range_constexpr(lines):
                _prefetch_l2(rk_rows + i * (32 * self.nw * 128))
            rv_rows = rv_ptr + Int64(h) * Int64(rv_stride) * 4 + Int64(tidx) * 128
            for i in cutlass.range_constexpr(lines):
                _prefetch_l2(rv_rows + i * (32 * self.nw * 128))

        # ---- sequence geometry loads (all on device; CUDA-graph safe): in flight while the
        # CTA rotates its query rows
        p_begin = _ldg_s32(indptr_ptr + Int64(b) * 4)
        p_end = _ldg_s32(indptr_ptr + Int64(b + 1) * 4)
        last = _ldg_s32(last_ptr + Int64(b) * 4)
        wslot = _ldg_s32(slots_ptr + Int64(b) * 4)
        if cutlass.const_expr(_PRO):
            self._trace_dep(counter_ptr, cta, 11, tidx, p_end)

        # ---- q' = q @ R_K[h] for the group's heads (bf16, in shared memory) on the tensor
        # cores: operand and q loads first thing, the MMAs once the page ids are in flight
        # (finished after the ring prologue instead, ptxas scheduled the main loop 2-4 %
        # longer)
        if cutlass.const_expr("rot" not in _DEBUG):
            rot_af, rot_qx = self._rotation_loads(q_ptr, rk_ptr, b, h, group, rk_stride,
                                                  q_kind, q_stride_b, q_stride_h, tidx)
            if cutlass.const_expr(_PRO):
                self._trace_dep(counter_ptr, cta, 13, tidx, rot_af[0][0])
                self._trace_dep(counter_ptr, cta, 14, tidx, _f32_bits(rot_qx[0]))

        # ---- sequence geometry
        npages = p_end - p_begin
        seq_len = Int32(0)
        if npages > 0:
            seq_len = (npages - 1) * page_size + last
        nsink = cutlass.min(sink, seq_len)
        rstart = cutlass.max(sink, seq_len - recent)
        nrec = cutlass.max(seq_len - rstart, 0)
        nwin = nsink + nrec
        int2_end = seq_len - recent               # INT2 positions: [sink, int2_end)
        ia = sink // CHUNK
        n_int2 = Int32(0)
        if int2_end > sink:
            n_int2 = (int2_end + CHUNK - 1) // CHUNK - ia
        n_win = (nwin + CHUNK - 1) // CHUNK
        win_rows = sink + recent
        per_warp = (n_int2 + nsw - 1) // nsw
        w_begin = cutlass.min(n_int2, wsplit * per_warp)
        w_end = cutlass.min(n_int2, w_begin + per_warp)
        # balanced by bytes: warp wsplit also runs BF16 window chunks wsplit, wsplit + nsw, ..
        # (full or full + 1 of them), each counted as WINDOW_CHUNK_COST INT2 chunks, so its
        # INT2 range is shorter by that much (when every warp's share covers its window
        # work; otherwise equal INT2 ranges as above)
        full = n_win // nsw
        rem = n_win - full * nsw
        if n_int2 >= WINDOW_CHUNK_COST * (full + 1) * nsw:
            tot = n_int2 + WINDOW_CHUNK_COST * n_win
            if cutlass.const_expr(self.ranked):
                # rank-weighted shares: in one wave CTA L = h + H (b + B s) is the L // nsm-th
                # CTA dispatched to its SM, and the first of an SM's two CTAs gets more issue
                # slots; splits of rank 0 take RANK0_WEIGHT / RANK_WEIGHT the work of the
                # others (long ranges only: at least RANK_MIN_CHUNKS per warp, where
                # the measured gains were, and every warp still covers its window work)
                # A full wave (every slot taken) is dispatched otherwise: on an H200 8 SMs
                # get two of the first #SMs CTAs and 8 others two of the rest (session 22,
                # traces), so its splits weigh the same (equal shares were 10-15 % faster
                # there; with 258-262 CTAs the dispatch still matches L // #SMs).
                npairs = num_kv_heads * cute.arch.grid_dim()[1]
                nsm = cute.arch.nsmid()          # 132 on an H100 / H200 SXM
                w0 = Int32(_RANK_W)
                if num_splits <= RANK_MAX_SPLITS and (
                        npairs * num_splits < (SM_WARPS // self.nw) * nsm):
                    if n_int2 >= cutlass.max(RANK_MIN_CHUNKS,
                                             2 * WINDOW_CHUNK_COST * (full + 1)) * nsw:
                        w0 = Int32(_RANK0_W)
                # splits s < c0 of this sequence and KV head have rank 0 (npairs and c0
                # assume the split-major grid; otherwise w0 == RANK_WEIGHT and every split
                # weighs the same, whatever c0 is: equal shares, still an exact partition)
                c0 = cutlass.min(num_splits, cutlass.max(
                    (nsm - h - num_kv_heads * b + npairs - 1) // npairs, 0))
                wt = w0 * c0 + _RANK_W * (num_splits - c0)
                a0 = (tot * (w0 * cutlass.min(split, c0)
                             + _RANK_W * cutlass.max(split - c0, 0))) // wt
                a1 = (tot * (w0 * cutlass.min(split + 1, c0)
                             + _RANK_W * cutlass.max(split + 1 - c0, 0))) // wt
                # work units before this warp's and before the next warp's range
                w_begin = a0 + (warp * (a1 - a0)) // self.nw - WINDOW_CHUNK_COST * (
                    wsplit * full + cutlass.min(wsplit, rem))
                w_end = a0 + ((warp + 1) * (a1 - a0)) // self.nw - WINDOW_CHUNK_COST * (
                    (wsplit + 1) * full + cutlass.min(wsplit + 1, rem))
            else:
                w_begin = (wsplit * tot) // nsw - WINDOW_CHUNK_COST * (
                    wsplit * full + cutlass.min(wsplit, rem))
                w_end = ((wsplit + 1) * tot) // nsw - WINDOW_CHUNK_COST * (
                    (wsplit + 1) * full + cutlass.min(wsplit + 1, rem))
        n_mine = w_end - w_begin

        head_row = h * stride_head
        # ---- chunk rows in blocks of 32: lane l holds the (page, slot, head) row of this
        # warp's chunk 32 k + l (pt[0]) and the page id of chunk 32 (k + 1) + l (pt[1]),
        # loaded one block ahead; an issue is then one shuffle
        tok0 = (ia + w_begin) * CHUNK
        pt = cute.make_rmem_tensor((2,), Int32)
        pt[0] = Int32(0)
        pt[1] = Int32(0)
        if cutlass.const_expr(self.any_page):
            # any page size: per chunk, lane l finds the page of token l % 16 (its scale/zero
            # token; the code tokens' rows come by shuffle), one chunk pair ahead of its issue
            # (pg: page id and in-page row offset of the next two chunks)
            pg = cute.make_rmem_tensor((4,), Int32)
            inv_ps = _rcp_exact(_i2f(page_size))
            geo = (indices_ptr, p_begin, npages, page_size, inv_ps, stride_slot, head_row,
                   tok0, n_mine)
        elif n_mine > 0:
            pid0 = self._chunk_page_id(indices_ptr, p_begin, npages, page_size, tok0, lane)
            pt[1] = self._chunk_page_id(indices_ptr, p_begin, npages, page_size, tok0,
                                        32 + lane)
            if cutlass.const_expr(self.merge_ctas):
                # the merge-CTA build (batch 1): the page ids stay in flight during the query
                # rotation, chunk 0's row is formed after it (pt[0] holds its page id until
                # then; session 16: qwen3-8b batch 1 0.4-0.5 us faster; the other builds'
                # llama3-70b-tp8 rows were up to 0.4 % slower that way)
                pt[0] = pid0
            else:
                pt[0] = self._chunk_row(pid0, page_size, stride_page, stride_slot, head_row,
                                        tok0, lane)
                if cutlass.const_expr(_PRO):
                    self._trace_dep(counter_ptr, cta, 12, tidx, pid0)

        if cutlass.const_expr("rot" not in _DEBUG):
            self._rotate_query(rot_af, rot_qx, s_x, s_q, group, tidx)
        if cutlass.const_expr(self.merge_ctas and not self.any_page):
            if n_mine > 0:
                if cutlass.const_expr(_PRO):
                    self._trace_dep(counter_ptr, cta, 12, tidx, pt[0])
                pt[0] = self._chunk_row(pt[0], page_size, stride_page, stride_slot, head_row,
                                        tok0, lane)
        if cutlass.const_expr(_PRO):
            _trace(counter_ptr, cta, 15, tidx)
        # ---- per-lane cp.async constants (see _issue)
        rb = self.row_bytes
        if cutlass.const_expr(rb == 32):
            lc_t = lane // 2
            lc_s = lc_t * rb + (lane % 2) * 16
            lc_piece = (lane % 2) * 16
        else:
            lc_t = lane % 16
            lc_s = (lane // 16) * (CHUNK * rb) + lc_t * rb
            lc_piece = 0
        # lc: (64-bit code source base of this lane, 64-bit scale/zero source base, shared
        # offsets of its code piece and of its scale pair within a stage); a chunk's sources
        # are then base + row * bytes (one mad.wide.u32 each)
        code_base = kc_ptr if cutlass.const_expr(rb == 32) else Int64(
            cutlass.select_(lane >= 16, vc_ptr, kc_ptr))
        if cutlass.const_expr(self.any_page):
            # (the rows are per token here: no in-chunk token offset in the bases)
            lc = (code_base + lc_piece, Int64(cutlass.select_(lane >= 16, vp_ptr, kp_ptr)),
                  lc_s, 2 * CHUNK * rb + (lane // 16) * (CHUNK * 4) + (lane % 16) * 4,
                  vc_ptr - kc_ptr)
            # ---- prologue: the page rows of chunks 0 .. stages-3 (loads all in flight),
            # their issues, then the rows of the loop's first chunk pair
            rows = [self._page_row_any(k, geo, lane) for k in range(self.stages - 2)]
            for k in cutlass.range_constexpr(self.stages - 2):
                prow = rows[k][0] * stride_page + rows[k][1]
                self._issue_rows(k, n_mine, smem_warp + k * self.stage_bytes, prow, lc, lane)
                if k % 2 == 1:
                    _cp_commit()
            for u in cutlass.range_constexpr(2):
                pg[2 * u], pg[2 * u + 1] = self._page_row_any(self.stages - 2 + u, geo, lane)
        else:
            lc = (code_base + Int64(lc_t * stride_slot) * rb + lc_piece,
                  Int64(cutlass.select_(lane >= 16, vp_ptr, kp_ptr))
                  + Int64((lane % 16) * stride_slot) * 4,
                  lc_s, 2 * CHUNK * rb + (lane // 16) * (CHUNK * 4) + (lane % 16) * 4,
                  vc_ptr - kc_ptr)
            # ---- prologue of the cp.async ring: chunks 0 .. stages-3, one commit group per
            # pair
            for k in cutlass.range_constexpr(self.stages - 2):
                self._issue(k, n_mine, smem_warp + k * self.stage_bytes, pt[0], lc)
                if k % 2 == 1:
                    _cp_commit()

        if cutlass.const_expr("rot" in _DEBUG):   # debug: q' = 1 (no rotation)
            for e in cutlass.range(tidx, MAX_GROUP * d // 2, 32 * self.nw):
                _sts_i32(s_q + e * 4, Int32(0x3F803F80))
            cute.arch.sync_threads()
        _trace(counter_ptr, cta, 1, tidx)
        _trace_warp(counter_ptr, cta * self.nw + warp, 0, lane)

        # this warp's two P tiles ([token][head] 16-bit, one per chunk of an iteration): this
        # lane stores its (token g + 8 n, heads 2q, 2q+1) pairs at p_st + 128 n and reads the
        # P^T fragment with ldmatrix.trans from row (lane % 16) at p_ld
        s_p = s_q + MAX_GROUP * d * 2 + warp * (2 * P_TILE)
        p_st = s_p + 4 * lane
        p_ld = s_p + (lane % 16) * (2 * MAX_GROUP)
        if cutlass.const_expr(self.pair and not self.hl):
            # pair kernel: one tile of 32-byte token rows [0 | P_B (columns 4-7) | P_A
            # (columns 0-3) | 0], so one ldmatrix.x4.trans hands out both chunks' B
            # fragments with the other chunk's columns already zero (rows at byte 16 for
            # A, at 0 for B; no masking ANDs). The zero bytes are written once here.
            _sts_i32(s_p + (lane % 16) * PAIR_ROW + 24 * (lane // 16), Int32(0))
            _sts_i32(s_p + (lane % 16) * PAIR_ROW + 24 * (lane // 16) + 4, Int32(0))
            # (BF16 window chunks use it too: their columns 0-3 at byte 16, read by lanes
            # 0-15 with ldmatrix.x2)
            p_st = s_p + g * PAIR_ROW + 4 * quad + 16 * Int32(cutlass.select_(quad < 2, 1, 0))
            p_ld = s_p + (lane % 16) * PAIR_ROW + 16 * Int32(cutlass.select_(lane < 16, 1, 0))
        if cutlass.const_expr(self.hl):
            # hl: two [head][token] tiles (A at 0, B at P_TILE; 8 rows of 16 tokens x 16 bit),
            # rows 4-7 zero (written once); lane (g, q) stores P of head q, tokens 2g, 2g+1
            # (one b32) and reads the B fragments with one ldmatrix.x4 (not transposed)
            _sts_i32(s_p + (lane // 16) * P_TILE + (4 + (lane % 16) // 4) * 32
                     + (lane % 4) * 8, Int32(0))
            _sts_i32(s_p + (lane // 16) * P_TILE + (4 + (lane % 16) // 4) * 32
                     + (lane % 4) * 8 + 4, Int32(0))
            p_st = s_p + quad * 32 + g * 4
            p_ld = s_p + (lane % 8) * 32 + ((lane // 8) % 2) * 16 + (lane // 16) * P_TILE
        # this lane's row of the V ldmatrix (see _v_frags): token (lane % 8) + 8 (tile // 2),
        # byte pairs 8 (tile % 2) .. of tile lane // 8 (head_dim 64: tiles = token halves)
        if cutlass.const_expr(self.nbv == 4):
            v_ld = ((lane % 8) + 8 * (lane // 16)) * self.row_bytes + 16 * ((lane // 8) % 2)
        else:
            v_ld = ((lane % 8) + 8 * ((lane // 8) % 2)) * self.row_bytes

        # ---- running state: O^T fragments; per head 2q+j: m, l, sum p*z_v (partials)
        acc = cute.make_rmem_tensor((4 * self.mtiles,), Float32)
        for i in cutlass.range_constexpr(4 * self.mtiles):
            acc[i] = Float32(0.0)
        st = cute.make_rmem_tensor((6,), Float32)
        for j in cutlass.range_constexpr(2):
            st[j] = Float32(M_INIT)
            st[2 + j] = Float32(0.0)
            st[4 + j] = Float32(0.0)

        # ---- query fragment (B operand of S^T): head g (rows >= group read head group-1 and
        # are zeroed), permuted channels, / m_i; fp16 for the INT2 chunks
        # pair kernel (GQA ratio <= 4): the heads in columns 0-3 and again in 4-7
        gcol = g & 3 if cutlass.const_expr(self.pair) else g
        if cutlass.const_expr(self.hl):   # columns 2 h, 2 h + 1: head h (hi / lo parts)
            gcol = g // 2
        gq = cutlass.min(gcol, group - 1)
        qkeep = Float32(cutlass.select_(gcol < group, 1.0, 0.0))
        qa = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
        # per-thread constants of its two score columns, heads 2 quad + {0, 1}:
        # qh[j] = scale_log2 * sum(q'), qh[2 + j] = the INT2 score scale (scale_log2 * 2^24
        # for subnormal fp16 codes; scale_log2 * a / (64 * 256) for the int8 QK)
        qh = cute.make_rmem_tensor((4,), Float32)
        # ---- BF16 window chunk number wsplit (the first of this warp's, if any) before the
        # INT2 loop: its loads overlap the ring prologue's round trip instead of adding one
        # after the loop (bf16 query fragments; the INT2 ones are made next)
        if cutlass.const_expr("win" in _DEBUG):
            n_win = Int32(0)
        if wsplit < n_win:
            self._query_frags(s_q, gq, qkeep, quad, qa, False)
            self._window_chunk(wsplit, kw_ptr, vw_ptr, wslot, win_rows, num_kv_heads, h, sink,
                               recent, nsink, rstart, nwin, qa, qh, acc, st, scale_log2, quad,
                               g, p_st, p_ld)

        if cutlass.const_expr(self.s8):
            qsum, qscale = self._query_frags_s8(s_q, gq, qkeep, quad, qa,
                                                Int32(g & 1) if cutlass.const_expr(self.hl)
                                                else None)
        else:
            qsum = self._query_frags(s_q, gq, qkeep, quad, qa, True)
            qscale = Float32(1.0 / SUBNORMAL)
        qsum = qsum + _shfl_bfly(qsum, 1)
        qsum = qsum + _shfl_bfly(qsum, 2)
        if cutlass.const_expr(self.hl):
            # one head per lane, head quad (column 2 quad): the INT2 score is
            # qh[2] * (s * raw + z * qh[1]) with qh[1] = sum(q') / the int8 score scale, so
            # qh[2] multiplies once inside the exp2 (and once for the lane's max); qh[2] >=
            # FLT_MIN keeps qh[1] finite for an all-zero (or padding) head
            qh[0] = _shfl_idx(qsum, 8 * quad) * scale_log2
            qh[2] = _fmax(_shfl_idx(qscale, 8 * quad) * scale_log2, Float32(FLT_MIN))
            qh[1] = qh[0] * _rcp(qh[2])
            qh[3] = qh[2]   # unused; left unset, ptxas allocates the loop differently
        elif cutlass.const_expr(self.pair):   # head_dim-64 pair kernel
            for j in cutlass.range_constexpr(2):
                qh[j] = _shfl_idx(qsum, (2 * quad + j) * 4) * scale_log2
                qh[2 + j] = _shfl_idx(qscale, (2 * quad + j) * 4) * scale_log2
        else:
            # decode: INT2 score of head 2q + j is qh[2 + j] (s raw + z qh[j]) with qh[j] =
            # sum(q') / the score scale (qh[2 + j] >= FLT_MIN keeps it finite); qh[2 + j] is
            # applied once inside the exp2 and once for the lane max (as the hl kernel)
            for j in cutlass.range_constexpr(2):
                qh[2 + j] = _fmax(_shfl_idx(qscale, (2 * quad + j) * 4) * scale_log2,
                                  Float32(FLT_MIN))
                qh[j] = _shfl_idx(qsum, (2 * quad + j) * 4) * scale_log2 * _rcp(qh[2 + j])
        # ---------------------------------------------- INT2 chunks (cp.async ring)
        # Two chunks per iteration (one issue/commit/wait and one set of ring bookkeeping per
        # 32 tokens). Positions at or past end_w (this warp's range end) are masked, so the
        # odd last iteration's phantom second chunk (stale stage, nothing issued) adds 0.
        end_w = cutlass.min(int2_end, (ia + w_end) * CHUNK)
        n_loop = n_mine
        if cutlass.const_expr("loop" in _DEBUG):
            n_loop = Int32(0)
        for i in cutlass.range(0, n_loop, 2):
            j = i + self.stages - 2
            if cutlass.const_expr(self.any_page):
                for u in cutlass.range_constexpr(2):
                    self._issue_rows(j + u, n_mine,
                                     smem_warp + ((j + u) & (self.stages - 1)) * self.stage_bytes,
                                     pg[2 * u] * stride_page + pg[2 * u + 1], lc, lane)
                _cp_commit()
                for u in cutlass.range_constexpr(2):   # the next pair's rows, a pair ahead
                    pg[2 * u], pg[2 * u + 1] = self._page_row_any(j + 2 + u, geo, lane)
            elif cutlass.const_expr("noload" in _DEBUG):
                _cp_commit()   # debug: no copies (the math runs on what the ring holds)
            else:
                self._issue_block_pair(j, pt, n_mine, smem_warp, lc, indices_ptr, p_begin,
                                       npages, page_size, stride_page, stride_slot, head_row,
                                       tok0, lane)
            _cp_wait(self.stages // 2 - 1)
            _syncwarp()
            if cutlass.const_expr(_RAMP):
                # debug: warp 0's chunk pairs 0, 4, 8, 12 arrived (stamps 11-14)
                if warp == 0:
                    for k in cutlass.range_constexpr(4):
                        if i == 8 * k:
                            _trace(counter_ptr, cta, 11 + k, tidx)
            sbase = smem_warp + (i & (self.stages - 1)) * self.stage_bytes
            if cutlass.const_expr("nocons" not in _DEBUG):   # debug: copies only
                self._consume_pair(sbase, (ia + w_begin + i) * CHUNK, sink, end_w, qa, qh,
                                   acc, st, scale_log2, quad, g, p_st, p_ld, v_ld)
            _syncwarp()
        _cp_wait(0)
        _trace(counter_ptr, cta, 2, tidx)

        # ---------------------------------------------- BF16 window chunks
        # (the rest of this warp's: every nsw-th after the one before the loop; bf16 MMAs:
        # window values times m_i may exceed the fp16 range; q fragments again, as bf16)
        if wsplit + nsw < n_win:
            self._query_frags(s_q, gq, qkeep, quad, qa, False)
        for c in cutlass.range(wsplit + nsw, n_win, nsw):
            self._window_chunk(c, kw_ptr, vw_ptr, wslot, win_rows, num_kv_heads, h, sink,
                               recent, nsink, rstart, nwin, qa, qh, acc, st, scale_log2, quad,
                               g, p_st, p_ld)

        # ---- finalize this warp's split: reduce l, correction, sum p~ over the 8 token lanes,
        # stage (lse2, normalized o) per warp in shared memory (the ring is free now)
        _trace_warp(counter_ptr, cta * self.nw + warp, 1, lane)
        _trace(counter_ptr, cta, 3, tidx)
        cute.arch.sync_threads()
        cbase = smem_warp - warp * (self.stages * self.stage_bytes)
        wbase = cbase + warp * self.combine_bytes
        if cutlass.const_expr(self.hl):
            # lane quad q ran head q's softmax; its O columns are heads 2q, 2q + 1
            l_hl = self._col_sum(st[2])
            c_hl = self._col_sum(st[4])
            m_hl = st[0]
        for j in cutlass.range_constexpr(2):
            head = 2 * quad + j
            if cutlass.const_expr(self.hl):
                m_run = _shfl_idx(m_hl, head & 3)
                l_run = _shfl_idx(l_hl, head & 3)
                corr_j = _shfl_idx(c_hl, head & 3)
            else:
                m_run = st[j]
                l_run = self._col_sum(st[2 + j])
                corr_j = self._col_sum(st[4 + j])
            lse2 = Float32(NEG_INF)
            inv_j = Float32(0.0)
            if l_run > Float32(0.0):
                lse2 = m_run + _lg2(l_run)
                inv_j = _rcp(l_run)
            if g == 0:
                _sts_f32(wbase + head * 4, lse2)
            for mt in cutlass.range_constexpr(self.mtiles):
                inv_m = 1.0 / (QUARTER_MULT[mt % 4] * SUBNORMAL)
                for rh in cutlass.range_constexpr(2):
                    ch = self.pv_channel(mt, rh, g)
                    val = (acc[4 * mt + 2 * rh + j] * inv_m + corr_j) * inv_j
                    _sts_f32(wbase + (MAX_GROUP + head * d + ch) * 4, val)
        cute.arch.sync_threads()
        # ---- combine the CTA's warps: one partial (lse2, o') per (sequence, head, split)
        # (pair kernel: head column h + 4 is a second partial of head h in every warp).
        # 4-warp builds (self.out_rotation) with one split, or with more partial rows than
        # the fused tail merges (the merge kernel runs next): the rows go to s_x (the q rows
        # are consumed) and o = o' R_V[h]^T is applied right here (_rotate_out), so one split
        # stores o and lse directly (no partial, ticket or reload) and the merge kernel is a
        # weighted sum. Otherwise the float32 rows o' are the partials and the merging CTA
        # applies R_V^T once, its fragments loading with the partial rows there (module
        # docstring, step 3).
        rotate = None
        if cutlass.const_expr(self.out_rotation):
            rotate = num_splits == 1 or num_splits * group > FUSED_TAIL_ROWS
        cols = 2 if cutlass.const_expr(self.pair and not self.hl) else 1
        for e in cutlass.range(tidx, group * d, 32 * self.nw):
            head = e // d
            ch = e - head * d
            mx = Float32(NEG_INF)
            for w in cutlass.range_constexpr(self.nw):
                for k in cutlass.range_constexpr(cols):
                    mx = _fmax(mx, _lds_f32(cbase + w * self.combine_bytes + (head + 4 * k) * 4))
            tot = Float32(0.0)
            val = Float32(0.0)
            if mx > Float32(NEG_INF):
                for w in cutlass.range_constexpr(self.nw):
                    for k in cutlass.range_constexpr(cols):
                        hk = head + 4 * k
                        ww = _ex2(_lds_f32(cbase + w * self.combine_bytes + hk * 4) - mx)
                        tot = tot + ww
                        val = val + ww * _lds_f32(cbase + w * self.combine_bytes
                                                  + (MAX_GROUP + hk * d + ch) * 4)
                val = val * _rcp(tot)
            hrow = (Int64(b) * Int64(num_qo_heads) + Int64(h * group + head)) * num_splits + split
            if cutlass.const_expr(self.out_rotation):
                if rotate:
                    _sts_f32(s_x + e * 4, val)
                else:
                    _stg_f32(opart_ptr + (hrow * d + Int64(ch)) * 4, val)
            else:
                _stg_f32(opart_ptr + (hrow * d + Int64(ch)) * 4, val)
            if ch == 0:
                lse2 = Float32(NEG_INF)
                if tot > Float32(0.0):
                    lse2 = mx + _lg2(tot)
                if cutlass.const_expr(self.out_rotation):
                    if num_splits == 1:   # hrow is the query row then
                        _stg_f32(lse_ptr + hrow * 4, lse2 * Float32(math.log(2.0)))
                    else:
                        _stg_f32(lse_ptr_part + hrow * 4, lse2)
                else:
                    _stg_f32(lse_ptr_part + hrow * 4, lse2)
        if cutlass.const_expr(self.out_rotation):
            if rotate:
                rv_af = self._operand_loads(rv_ptr, h, rv_stride, tidx)
                cute.arch.sync_threads()
                self._rotate_out(rv_af, s_x, opart_ptr, o_ptr, b, h, split, group,
                                 num_qo_heads, num_splits, o_kind, o_stride_b, o_stride_h,
                                 tidx)
        # ---- the last CTA of this (sequence, KV head) to finish merges the splits (when
        # num_splits * group <= FUSED_TAIL_ROWS and, in 4-warp builds, 1 < num_splits)
        _trace(counter_ptr, cta, 4, tidx)
        if cutlass.const_expr("tail" in _DEBUG):
            num_splits = Int32(FUSED_TAIL_ROWS + 1)
        fused = num_splits * group <= FUSED_TAIL_ROWS
        if cutlass.const_expr(self.out_rotation):
            fused = num_splits > 1 and fused
        if fused:
            self._ticket_and_merge(opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr,
                                   counter_ptr, s_x, cbase, b, h, cta, group, num_kv_heads,
                                   num_qo_heads, num_splits, rv_stride, o_kind, o_stride_b,
                                   o_stride_h, tidx, warp, lane)
        _trace(counter_ptr, cta, 6, tidx)

    # ------------------------------------------------------------- helpers
    @cute.jit
    def _trace_dep(self, counter_ptr, cta, k: int, tidx, dep):
        """Debug (``OSCAR_CUTE_DEBUG=trace,pro`` builds only): as :func:`_trace`, slot ``k``
        (11-15: the prologue's loads), taken in a branch on ``dep`` (a value just loaded), so
        the timer is read once that load has arrived. Callers guard the call with ``_PRO``
        (so ``dep`` is not even formed in other builds)."""
        if dep != Int32(0x7FC00001):
            _trace(counter_ptr, cta, k, tidx)

    @cute.jit
    def _issue_block_pair(self, j, pt, n_mine, smem_warp, lc, indices_ptr, p_begin, npages,
                          page_size, stride_page, stride_slot, head_row, tok0, lane):
        """Issue this warp's chunks ``j``, ``j + 1`` (``j`` even) from its 32-chunk row block
        ``pt`` (refreshed, and the next block's page ids loaded, at a block start) and
        commit them as one group."""
        if (j & 31) == 0:     # j is even: chunks j and j + 1 share a block
            pt[0] = self._chunk_row(pt[1], page_size, stride_page, stride_slot,
                                    head_row, tok0, j + lane)
            pt[1] = self._chunk_page_id(indices_ptr, p_begin, npages, page_size, tok0,
                                        j + 32 + lane)
        for u in cutlass.range_constexpr(2):
            self._issue(j + u, n_mine,
                        smem_warp + ((j + u) & (self.stages - 1)) * self.stage_bytes,
                        pt[0], lc)
        _cp_commit()

    @cute.jit
    def _consume_pair(self, sbase, pos0, sink, end, qa, qh, acc, st, scale_log2, quad, g,
                      p_st, p_ld, v_ld):
        """The two INT2 chunks at ring stage ``sbase`` (positions ``pos0`` ..), positions
        outside ``[sink, end)`` masked (the path without masks when there are none)."""
        sb = sbase + self.stage_bytes
        if cutlass.const_expr(self.hl):
            run = self._int2_pair_hl
            args = (sbase, sb, pos0, sink, end, qa, qh, acc, st, quad, g, p_st, p_ld, v_ld)
        elif cutlass.const_expr(self.pair):
            run = self._int2_pair
            args = (sbase, sb, pos0, sink, end, qa, qh, acc, st, scale_log2, quad, g, p_st,
                    p_ld, v_ld)
        else:
            run = self._int2_two_chunks
            args = (sbase, sb, pos0, sink, end, qa, qh, acc, st, quad, g, p_st, p_ld, v_ld)
        if pos0 >= sink and pos0 + 2 * CHUNK <= end:
            run(*args, False)
        else:
            run(*args, True)

    def _window_chunk(self, c, kw_ptr, vw_ptr, wslot, win_rows, num_kv_heads, h, sink,
                      recent, nsink, rstart, nwin, qa, qh, acc, st, scale_log2, quad, g, p_st,
                      p_ld):
        """BF16 window chunk ``c`` (positions ``16 c ..`` of the sink + recent window, plain
        loads) with the bf16 query fragments ``qa``."""
        kf0 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
        kf1 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
        for n in range(2):
            v = c * CHUNK + self._tok(g, n)
            self._load_window_k(kw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent,
                                nsink, rstart, nwin, v, quad, kf0 if n == 0 else kf1)
        va = cute.make_rmem_tensor((2 * self.mtiles * 2,), Int32)
        self._load_window_v(vw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent, nsink,
                            rstart, nwin, c * CHUNK, quad, g, va)
        valid = cute.make_rmem_tensor((2,), Int32)
        for n in range(2):
            valid[n] = Int32(cutlass.select_(c * CHUNK + self._tok(g, n) < nwin, 1, 0))
            if self.pair and not self.hl:
                # columns 4-7 repeat the heads: use 0-3
                valid[n] = valid[n] & Int32(cutlass.select_(quad < 2, 1, 0))
        if self.hl:
            s_w = self._qk(qa, kf0, kf1, False)
            xs = [s_w[0] * scale_log2, s_w[2] * scale_log2]   # tokens 2g, 2g+1, head q
            self._softmax_pv_hl(xs, valid, None, None, va, acc, st, p_st, p_ld, quad)
        else:
            self._chunk(qa, qh, kf0, kf1, va, None, None, None, None, valid, acc, st,
                        scale_log2, quad, p_st, p_ld, False)

    def _query_frags(self, s_q, gq, qkeep, quad, qa, f16: bool):
        """B fragments of head ``gq``'s q' (from shared memory) divided by ``m_i``, as fp16
        (``f16``: INT2 chunks) or bf16 (window chunks); returns this lane's partial sum of
        q' (exact in float32 from the bf16 q')."""
        d = self.d
        qsum = Float32(0.0)
        runs = []
        for wi in range(self.nbk // 4):
            for i in range(4):
                ch = quad * self.nbk + 4 * wi + i * (d // 4)   # channels ch .. ch + 3
                runs.append(list(_lds_v2(s_q + (gq * d + ch) * 2)))
        pack = _pack_f16x2 if f16 else _pack_bf16x2
        for wi in range(self.nbk // 4):
            for i in range(4):
                w01, w23 = runs[wi * 4 + i]
                q0, q1 = _bf16x2_to_f32(w01)
                q2, q3 = _bf16x2_to_f32(w23)
                qe = [q0 * qkeep, q1 * qkeep, q2 * qkeep, q3 * qkeep]
                inv_m = 1.0 / QUARTER_MULT[i]
                for hh in range(2):
                    # r = 8 wi + 2 i + hh holds channels (ch + hh, ch + hh + 2)
                    qa[wi * 8 + i * 2 + hh] = pack(qe[hh] * inv_m, qe[hh + 2] * inv_m)
                qsum = qsum + ((qe[0] + qe[1]) + (qe[2] + qe[3]))
        return qsum

    def _query_frags_s8(self, s_q, gq, qkeep, quad, qa, lane_odd=None):
        """B fragments of head ``gq``'s q' for the int8 QK (``m16n8k32``): lane quad ``q``
        holds channels ``8 q + 32 i + (0..7)`` of quarter ``i`` (QK step ``i``), as
        ``qa[2 i + {0, 1}]`` (high parts) and ``qa[8 + 2 i + {0, 1}]`` (low parts) of
        ``q' = a (hi + lo / 256)``, ``a = max|q'| / 127`` over the head; ``lane_odd`` given
        (hl kernel, column g = head g // 2): only ``qa[2 i + {0, 1}]``, the low part when it
        is nonzero, else the high part. Returns this lane's partial sum of q' and ``a / (64
        * 256)`` (the score scale of the combined s32)."""
        d = self.d
        qv = []
        for i in range(4):
            for half in range(2):
                w = _lds_v2(s_q + (gq * d + 8 * quad + 32 * i + 4 * half) * 2)
                q0, q1 = _bf16x2_to_f32(w[0])
                q2, q3 = _bf16x2_to_f32(w[1])
                qv.append([q0 * qkeep, q1 * qkeep, q2 * qkeep, q3 * qkeep])
        qsum = Float32(0.0)
        for v in qv:
            qsum = qsum + ((v[0] + v[1]) + (v[2] + v[3]))
        if cutlass.const_expr(self.k_form in ("unmasked", "top")):
            # qv[2 i + half][j]: quarter i, byte j of this lane's code word ``half``; the
            # unmasked K operands (_load_k) need the triangular transform of each word's 16
            for half in range(2):
                qt = unmasked_k_query([qv[2 * i + half] for i in range(4)],
                                      self.k_form == "top")
                for i in range(4):
                    qv[2 * i + half] = qt[i]
        mx = Float32(0.0)
        for v in qv:
            for x in v:
                mx = _fmax(mx, _fabs(x))
        mx = _fmax(mx, _shfl_bfly(mx, 1))
        mx = _fmax(mx, _shfl_bfly(mx, 2))
        pos = Int32(cutlass.select_(mx > Float32(0.0), 1, 0))
        inv = _sel_f32(pos, Float32(127.0) * _rcp_exact(mx), Float32(0.0))
        for r in range(8):
            hi = [_f2i_rn(x * inv) for x in qv[r]]
            lo = [cutlass.max(-127, cutlass.min(127, _f2i_rn((qv[r][k] * inv - _i2f(hi[k]))
                                                             * Float32(256.0))))
                  for k in range(4)]
            if self.hl:    # column g: head g // 2, high part (g even) or low part (g odd)
                qa[r] = Int32(cutlass.select_(lane_odd != 0, _pack_s8x4(*lo),
                                              _pack_s8x4(*hi)))
            else:
                qa[r] = _pack_s8x4(*hi)
                qa[8 + r] = _pack_s8x4(*lo)
        return qsum, mx * Float32(1.0 / (127.0 * 64.0 * 256.0))

    @cute.jit
    def _ticket_and_merge(self, opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr, counter_ptr,
                          s_x, cbase, b, h, cta, group, num_kv_heads, num_qo_heads, num_splits,
                          rv_stride, o_kind, o_stride_b, o_stride_h, tidx, warp, lane):
        """Atomic ticket per (sequence, KV head); the CTA drawing the last one merges (in the
        merge-CTA build every split only counts, and the merge CTA merges: ``_merger``)."""
        if cutlass.const_expr(self.merge_ctas):
            # release: the CTA barrier orders every thread's partial stores before thread
            # 0's gpu-scope fence and count
            cute.arch.sync_threads()
            if tidx == 0:
                _fence_acq_rel_gpu()
                _atom_add_s32(_counter_addr(counter_ptr, b, h, num_kv_heads), 1)
            _trace(counter_ptr, cta, 5, tidx)
        else:
            # the cooperative-groups grid-barrier pattern: the CTA barrier orders every
            # thread's partial stores before thread 0's gpu-scope fence + ticket (release),
            # and thread 0's fence after the ticket before the barrier that the merging
            # threads' loads follow (acquire)
            cute.arch.sync_threads()
            if tidx == 0:
                if cutlass.const_expr("fence" not in _DEBUG):
                    _fence_acq_rel_gpu()
                t = _atom_add_s32(_counter_addr(counter_ptr, b, h, num_kv_heads), 1)
                if cutlass.const_expr("fence" not in _DEBUG):
                    _fence_acq_rel_gpu()
                _sts_i32(s_x, t)
            cute.arch.sync_threads()
            _trace(counter_ptr, cta, 5, tidx)
            if _lds_b32(s_x) == num_splits - 1:
                if cutlass.const_expr("merge" not in _DEBUG):
                    self._merge_tail(opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr, cbase, b,
                                     h, group, num_qo_heads, num_splits, rv_stride, o_kind,
                                     o_stride_b, o_stride_h, tidx, warp, lane, counter_ptr, cta)
                if tidx == 0:   # graph-safe: the counter is zero again for the next launch
                    _stg_s32(_counter_addr(counter_ptr, b, h, num_kv_heads), 0)

    @cute.jit
    def _merger(self, h, b, opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr, counter_ptr,
                num_kv_heads, group, num_splits, rv_stride, o_kind, o_stride_b, o_stride_h):
        """The merge CTA of (sequence ``b``, KV head ``h``) in the merge-CTA build (the
        grid's last split slice, dispatched after every split's CTA). It runs the merge tail
        twice, one copy of its code (a loop the compiler cannot unroll): dry at the start
        (stores off: kind 3 matches no store in ``_store_kind``), which brings the tail's
        code into this SM's instruction cache and ``R_V``'s operand into L2 while the splits
        run, then, once every split has counted its partial, for real. Off the critical path
        then: the cold code, and a merging split's ticket round trips and reload."""
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        smem = cute.arch.get_dyn_smem(cutlass.Int8, alignment=16).toint()
        ctr = _counter_addr(counter_ptr, b, h, num_kv_heads)
        cta = (b * num_kv_heads + h) * num_splits + num_splits - 1   # debug trace slot
        runs = cutlass.min(num_splits + 1, 2)     # 2, unknown to the compiler
        for it in cutlass.range(0, runs, 1, unroll=1):
            real = it == runs - 1
            if real:
                if tidx == 0:   # acquire: the splits' fence + count, then this fence
                    while _ld_relaxed_s32(ctr) < num_splits:
                        if cutlass.const_expr(MERGER_SLEEP_NS > 0):
                            _nanosleep(MERGER_SLEEP_NS)
                    _fence_acq_rel_gpu()
                cute.arch.sync_threads()
            self._merge_tail(opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr, smem, b, h,
                             group, num_kv_heads * group, num_splits, rv_stride,
                             Int32(cutlass.select_(real, o_kind, 3)), o_stride_b, o_stride_h,
                             tidx, warp, lane, counter_ptr, cta,
                             Int32(cutlass.select_(real, 0, 3)))
            cute.arch.sync_threads()
        if tidx == 0:   # graph-safe: zero again for the next launch
            _stg_s32(ctr, 0)

    @cute.jit
    def _rotate_out(self, af, s_rows, opart_ptr, o_ptr, b, h, split, group, num_qo_heads,
                    num_splits, o_kind, o_stride_b, o_stride_h, tidx):
        """This split's ``o = o' R_V[h]^T`` (``o^T = R_V o'^T``: fp16 ``m16n8k16`` MMAs, the
        heads as N, ``af`` from :meth:`_operand_loads`) from the float32 rows ``s_rows[g, d]``
        in shared memory: stored as the float32 partial of split ``split``, or with one
        split as ``o`` in the output dtype. Warp ``w`` owns the output channels of its
        ``d / (16 nw)`` M tiles."""
        d = self.d
        warp, g, quad, mt_w = self._mma_lane(tidx)
        bf, inv_n = self._rows_b_frags(s_rows, group, g, quad)
        # element (head n, channel e) at base + (n * n_stride + e) * size: the partial
        # [b, h * group + n, split, e] (float32), or with one split o[b, h * group + n, e]
        row0 = Int64(b) * Int64(num_qo_heads) + Int64(h * group)
        base = o_ptr
        kind = o_kind
        el0 = Int64(b) * Int64(o_stride_b) + Int64(h * group) * Int64(o_stride_h)
        n_stride = Int64(o_stride_h)
        if num_splits > 1:
            base = opart_ptr
            kind = Int32(0)
            el0 = (row0 * num_splits + split) * d
            n_stride = Int64(num_splits * d)
        for j in cutlass.range_constexpr(mt_w):
            c = self._mma_f16_tile(af, j, bf)
            ch_o = (warp * mt_w + j) * 16 + g
            for r in cutlass.range_constexpr(4):
                n = 2 * quad + r % 2
                if n < group:
                    _store_kind(base, el0 + Int64(n) * n_stride + Int64(ch_o + 8 * (r // 2)),
                                c[r] * inv_n[r % 2], kind)

    def _mma_lane(self, tidx):
        """``(warp, g, quad, M tiles per warp)`` of thread ``tidx`` for the rotations' MMAs
        (lane = 4 g + quad; warp ``w`` owns M tiles ``w * d/(16 nw) ..``)."""
        lane = tidx % 32
        return tidx // 32, lane // 4, lane % 4, self.d // (16 * self.nw)

    def _rows_b_frags(self, s_rows, group, g, quad):
        """B fragments (``m16n8k16``, K = the d channels, N = 8 heads) of the float32 rows
        ``s_rows[head, d]`` in shared memory: lane (g, quad) holds head ``g`` (columns past
        the group are zero) at channels ``16 ks + 2 quad (+ 8)``, as fp16 pairs after a
        per-head power-of-two scale that puts the row's largest magnitude in ``[2^13, 2^14)``
        (no overflow for any finite row; exact for bf16 values in fp16's normal range).
        Returns the fragments and the unscale factors of this lane's output columns
        ``2 quad`` and ``2 quad + 1``."""
        d = self.d
        gq = cutlass.min(g, group - 1)
        keep = Float32(cutlass.select_(g < group, 1.0, 0.0))
        xv = []
        mx = Float32(0.0)
        for ks in range(d // 16):
            for half in range(2):
                x0, x1 = _lds_v2f(s_rows + (gq * d + 16 * ks + 8 * half + 2 * quad) * 4)
                xv.append((x0 * keep, x1 * keep))
                mx = _fmax(mx, _fmax(_fabs(x0), _fabs(x1)))
        mx = _fmax(mx, _shfl_bfly(mx, 1))
        mx = _fmax(mx, _shfl_bfly(mx, 2))
        # scale 2^(13 - floor(log2 max)) from the exponent field, clamped to normal floats
        ebits = (_f32_bits(mx) >> 23) & 0xFF
        sexp = cutlass.max(1, cutlass.min(253, 267 - ebits))
        scale = _bits_f32(sexp << 23)
        inv = _bits_f32((254 - sexp) << 23)
        bf = [_pack_f16x2(x0 * scale, x1 * scale) for x0, x1 in xv]
        return bf, [_shfl_idx(inv, 8 * quad), _shfl_idx(inv, 8 * quad + 4)]

    def _mma_f16_tile(self, af, j, bf):
        """D (16 x 8, float32) of M tile ``j`` of this warp: the A fragments ``af[j * d/16 +
        ks]`` (host-prepared, see ``oscar_kernels.cute.mma_operand``) times ``bf``."""
        ks_n = self.d // 16
        c = [Float32(0.0)] * 4
        for ks in range(ks_n):
            a = af[j * ks_n + ks]
            c = list(_mma(a[0], a[1], a[2], a[3], bf[2 * ks], bf[2 * ks + 1], *c, f16=True))
        return c

    def _operand_loads(self, ptr, h, stride, tidx):
        """This warp's A fragments of a host-prepared ``d x d`` fp16 operand
        (``oscar_kernels.cute.mma_operand``, ``[mt][ks][lane][4 x b32]``, head stride
        ``stride`` words): M tiles ``warp * d/(16 nw) + j``, all ``d/16`` K steps, one 16-byte
        load each, all in flight at once."""
        d = self.d
        warp = tidx // 32
        lane = tidx % 32
        mt_w = d // (16 * self.nw)
        ks_n = d // 16
        abase = ptr + (Int64(h) * Int64(stride) + Int64(lane * 4)) * 4
        af = []
        for j in range(mt_w):
            for ks in range(ks_n):
                af.append(_ldg_v4(abase + Int64(((warp * mt_w + j) * ks_n + ks) * 512)))
        return af

    @cute.jit
    def _rotation_loads(self, q_ptr, rk_ptr, b, h, group, rk_stride, q_kind, q_stride_b,
                        q_stride_h, tidx):
        """Issue the loads of the query rotation (at the kernel's start, so that their
        round trip overlaps the sequence geometry and page-id loads): this warp's A fragments
        of ``R_K^T`` and this thread's q elements. ``rk_ptr`` is the host-prepared operand
        (:func:`oscar_kernels.cute.rk_operand`): ``R_K^T`` in fp16, already in A-fragment
        order ``[mt][ks][lane][4 x b32]``, so warp ``w`` loads its ``d / (16 nw)`` M tiles x
        ``d / 16`` K steps as 16-byte loads, all in flight at once (32 KB per head at
        ``d = 128``, half the bytes of float32)."""
        d = self.d
        af = self._operand_loads(rk_ptr, h, rk_stride, tidx)
        qx = []
        for i in cutlass.range_constexpr(MAX_GROUP * d // (32 * self.nw)):
            e = tidx + i * (32 * self.nw)
            gg = cutlass.min(e // d, group - 1)
            qel = (Int64(b) * Int64(q_stride_b) + Int64(h * group + gg) * Int64(q_stride_h)
                   + Int64(e - (e // d) * d))
            qx.append(_ldg_kind(q_ptr + qel * 4, q_ptr + qel * 2, q_kind))
        return af, qx

    @cute.jit
    def _rotate_query(self, af, qx, s_x, s_q, group, tidx):
        """``s_q[g, c] = bf16(sum_k q[b, h * group + g, k] R_K[h, k, c])`` for ``g < group``,
        on the tensor cores from the loads of :meth:`_rotation_loads`: ``q'^T = R_K^T q^T``
        as fp16 ``m16n8k16`` MMAs with the heads as N. q rows are staged as float32 in
        ``s_x``; each head is scaled by a power of two so that its largest ``|q|`` lies in
        ``[2^13, 2^14)`` before the fp16 conversion (exact for bf16 q in fp16's normal range;
        no overflow for any finite q) and unscaled after the MMA."""
        d = self.d
        warp, g, quad, mt_w = self._mma_lane(tidx)
        ks_n = d // 16
        for i in cutlass.range_constexpr(MAX_GROUP * d // (32 * self.nw)):
            e = tidx + i * (32 * self.nw)
            if e < group * d:
                _sts_f32(s_x + e * 4, qx[i])
        cute.arch.sync_threads()
        bf, inv_n = self._rows_b_frags(s_x, group, g, quad)
        for j in cutlass.range_constexpr(mt_w):
            c = self._mma_f16_tile(af, j, bf)
            ch = (warp * mt_w + j) * 16 + g
            for r in cutlass.range_constexpr(4):
                n = 2 * quad + r % 2
                if n < group:
                    _sts_b16_of_f32(s_q + (n * d + ch + 8 * (r // 2)) * 2, c[r] * inv_n[r % 2])
        cute.arch.sync_threads()

    @cute.jit
    def _merge_tail(self, opart_ptr, lsepart_ptr, rv_ptr, o_ptr, lse_ptr, cbase, b, h, group,
                    num_qo_heads, num_splits, rv_stride, o_kind, o_stride_b, o_stride_h, tidx,
                    warp, lane, counter_ptr, cta, lse_kind=None):
        """Run by the last CTA of (sequence ``b``, KV head ``h``) (in the merge-CTA build by
        its merge CTA, :meth:`_merger`) when ``num_splits * group
        <= FUSED_TAIL_ROWS``: merge the partials of the group's heads
        (``w_s = 2^(lse2_s - max)``), apply ``R_V[h]^T`` on the tensor cores, store ``o`` in
        the output dtype and the natural-log lse. One memory round trip for up to
        ``self.tail_rows`` partial rows (``TAIL_ROWS``, 64 in the wide pair build; batch >= 8
        for Qwen3-8B, Llama-3-70B TP8 at batch 128):
        the o partial rows go to shared memory by ``cp.async.cg`` (no registers), the lse
        partials (``ld.global.cg``, one per thread) and ``R_V[h]``'s A fragments
        (host-prepared fp16 operand, ``oscar_kernels.cute.mma_operand``: ``o^T = R_V
        o'^T``; prefetched into L2 at the kernel's start) are in flight with them; more
        rows take one more round trip per block. Shared memory (the free ring):
        lse2 / weights ``[rows]`` (row ``e = g * num_splits + s``), the merged ``o'``
        ``[MAX_GROUP, d]``, a block of partial rows ``[self.tail_rows, d]``. ``lse_kind``
        (the merge CTA's runs): store the lse through ``_store_kind`` with this kind (3: no
        store, the dry run; its ``o_kind`` is 3 then too)."""
        d = self.d
        nrows = group * num_splits
        row0 = Int64(b) * Int64(num_qo_heads) + Int64(h * group)   # (b, first head) row
        s_w = cbase
        s_or = s_w + 32 * self.nw * 4     # one lse slot per thread
        s_op = s_or + MAX_GROUP * d * 4
        obase = opart_ptr + row0 * Int64(num_splits) * (d * 4)
        self._tail_rows(obase, 0, nrows, s_op, tidx)
        _cp_commit()
        l_t = Float32(NEG_INF)
        if tidx < nrows:
            l_t = _ldcg_f32(lsepart_ptr + (row0 * num_splits + Int64(tidx)) * 4)
        af = self._operand_loads(rv_ptr, h, rv_stride, tidx)
        _sts_f32(s_w + tidx * 4, l_t)     # threads >= FUSED_TAIL_ROWS: every row slot
        cute.arch.sync_threads()
        # weights per head (one warp per head; num_splits <= FUSED_TAIL_ROWS): w_s / sum w
        for gg in cutlass.range(warp, group, self.nw):
            lv = cute.make_rmem_tensor((FUSED_TAIL_ROWS // 32,), Float32)
            mx = Float32(NEG_INF)
            for i in cutlass.range_constexpr(FUSED_TAIL_ROWS // 32):
                sidx = lane + 32 * i
                lv[i] = Float32(NEG_INF)
                if sidx < num_splits:
                    lv[i] = _lds_f32(s_w + (gg * num_splits + sidx) * 4)
                mx = _fmax(mx, lv[i])
            for k in cutlass.range_constexpr(5):
                mx = _fmax(mx, _shfl_bfly(mx, 1 << k))
            m_use = _sel_f32(Int32(cutlass.select_(mx == Float32(NEG_INF), 0, 1)), mx,
                             Float32(0.0))
            tot = Float32(0.0)
            for i in cutlass.range_constexpr(FUSED_TAIL_ROWS // 32):
                lv[i] = _ex2(lv[i] - m_use)
                tot = tot + lv[i]
            for k in cutlass.range_constexpr(5):
                tot = tot + _shfl_bfly(tot, 1 << k)
            inv = Float32(0.0)
            lse = Float32(NEG_INF)
            if tot > Float32(0.0):
                inv = _rcp(tot)
                lse = (mx + _lg2(tot)) * Float32(math.log(2.0))
            _syncwarp()
            for i in cutlass.range_constexpr(FUSED_TAIL_ROWS // 32):
                sidx = lane + 32 * i
                if sidx < num_splits:
                    _sts_f32(s_w + (gg * num_splits + sidx) * 4, lv[i] * inv)
            if lane == 0:
                if cutlass.const_expr(lse_kind is None):
                    _stg_f32(lse_ptr + (row0 + Int64(gg)) * 4, lse)
                else:
                    _store_kind(lse_ptr, row0 + Int64(gg), lse, lse_kind)
        _cp_wait(0)
        cute.arch.sync_threads()
        _trace(counter_ptr, cta, 8, tidx)
        # o'[g, c] = sum_s w[g, s] o_part[g, s, c]: thread t sums channel t % d of the heads
        # g = t // d (mod 128 / d), self.tail_rows rows a block
        hstep = 32 * self.nw // d
        ch = tidx % d
        ho = tidx // d
        accs = cute.make_rmem_tensor((MAX_GROUP // hstep,), Float32)
        for k in cutlass.range_constexpr(MAX_GROUP // hstep):
            accs[k] = Float32(0.0)
        if cutlass.const_expr("sums" not in _DEBUG):
            for e0 in cutlass.range(0, nrows, self.tail_rows):
                if e0 > 0:     # more rows than one block (batch 1-4): one round trip each
                    cute.arch.sync_threads()
                    self._tail_rows(obase, e0, nrows, s_op, tidx)
                    _cp_commit()
                    _cp_wait(0)
                    cute.arch.sync_threads()
                for k in cutlass.range_constexpr(MAX_GROUP // hstep):
                    gg = ho + hstep * k
                    if gg < group:
                        s_lo = cutlass.max(e0 - gg * num_splits, 0)
                        s_hi = cutlass.min(e0 + self.tail_rows - gg * num_splits, num_splits)
                        acc = accs[k]
                        for sidx in cutlass.range(s_lo, s_hi, 1, unroll=self.tail_unroll):
                            e = gg * num_splits + sidx
                            acc = acc + _lds_f32(s_w + e * 4) * _lds_f32(
                                s_op + ((e - e0) * d + ch) * 4)
                        accs[k] = acc
        for k in cutlass.range_constexpr(MAX_GROUP // hstep):
            gg = ho + hstep * k
            if gg < group:
                _sts_f32(s_or + (gg * d + ch) * 4, accs[k])
        _trace(counter_ptr, cta, 9, tidx)
        cute.arch.sync_threads()
        # o[g, e] = sum_c R_V[h, e, c] o'[g, c]: warp w owns output channels of its M tiles
        g = lane // 4
        quad = lane % 4
        bf, inv_n = self._rows_b_frags(s_or, group, g, quad)
        _trace(counter_ptr, cta, 10, tidx)
        for j in cutlass.range_constexpr(d // (16 * self.nw)):
            c = self._mma_f16_tile(af, j, bf)
            ch_o = (warp * (d // (16 * self.nw)) + j) * 16 + g
            for r in cutlass.range_constexpr(4):
                n = 2 * quad + r % 2
                if n < group:
                    oel = (Int64(b) * Int64(o_stride_b) + Int64(h * group + n)
                           * Int64(o_stride_h) + Int64(ch_o + 8 * (r // 2)))
                    _store_kind(o_ptr, oel, c[r] * inv_n[r % 2], o_kind)

    def _tail_rows(self, obase, e0, nrows, s_op, tidx):
        """``cp.async.cg`` of the o partial rows ``e0 .. e0 + self.tail_rows`` (rows past
        ``nrows`` zero-filled, nothing read) into ``s_op``; no commit."""
        d = self.d
        per_row = d // 4                       # 16-byte pieces per row of d float32
        for j in range(self.tail_rows * per_row // (32 * self.nw)):
            i = tidx + j * (32 * self.nw)
            r = i // per_row
            col = i - r * per_row
            _cp_async16_if(e0 + r, nrows, s_op + i * 16,
                           obase + (Int64(e0 + r) * d + Int64(col * 4)) * 4)

    @cute.jit
    def _max_and_rescale(self, st, loc0, loc1, acc, moved):
        """Running max per head column, updated only when some lane's scores exceed it
        (warp-uniform ``moved``); then l, the corrections and O^T are rescaled (lazy)."""
        if moved:
            al = cute.make_rmem_tensor((2,), Float32)
            for j in cutlass.range_constexpr(2):
                m_old = st[j]
                m_new = _fmax(m_old, self._col_max(loc0 if j == 0 else loc1))
                a = _ex2(m_old - m_new)
                al[j] = a
                st[j] = m_new
                st[2 + j] = st[2 + j] * a
                st[4 + j] = st[4 + j] * a
            for i in cutlass.range_constexpr(2 * self.mtiles):
                acc[2 * i] = acc[2 * i] * al[0]
                acc[2 * i + 1] = acc[2 * i + 1] * al[1]

    def _col_sum(self, x):
        """Sum over the 8 lanes of one quad position (lanes q, q+4, ..., q+28)."""
        x = x + _shfl_bfly(x, 4)
        x = x + _shfl_bfly(x, 8)
        return x + _shfl_bfly(x, 16)

    def _col_max(self, x):
        x = _fmax(x, _shfl_bfly(x, 4))
        x = _fmax(x, _shfl_bfly(x, 8))
        return _fmax(x, _shfl_bfly(x, 16))

    @cute.jit
    def _chunk_page_id(self, indices_ptr, p_begin, npages, page_size, tok0, c):
        """Page id of this warp's chunk ``c`` (0 past the sequence's last page)."""
        pn = (tok0 + c * CHUNK) // page_size
        pid = Int32(0)
        if pn < npages:
            pid = _ldg_s32(indices_ptr + Int64(p_begin + pn) * 4)
        return pid

    def _chunk_row(self, pid, page_size, stride_page, stride_slot, head_row, tok0, c):
        """(page, slot, head) row of this warp's chunk ``c`` in page ``pid``."""
        t = tok0 + c * CHUNK
        return pid * stride_page + (t - (t // page_size) * page_size) * stride_slot + head_row

    def _page_row_any(self, c, geo, lane):
        """Any page size: ``(page id, in-page row offset + head row)`` of token ``l % 16`` of
        this warp's chunk ``c`` for lane ``l`` (page id 0 past the sequence's pages or the
        warp's range: nothing is read there). The page number comes from a float reciprocal
        and one correction each way (exact for positions below 2^24)."""
        indices_ptr, p_begin, npages, page_size, inv_ps, stride_slot, head_row, tok0, n = geo
        x = tok0 + c * CHUNK + lane % 16
        pn = _udiv_rcp(x, page_size, inv_ps)
        pid = _ldg_s32_if(indices_ptr + Int64(p_begin + pn) * 4,
                          Int32(cutlass.select_(pn < npages, 1, 0))
                          & Int32(cutlass.select_(c < n, 1, 0)))
        return pid, (x - pn * page_size) * stride_slot + head_row

    def _issue_rows(self, c, n_mine, sdst, prow, lc, lane):
        """Any page size: cp.async this warp's chunk ``c`` into ring stage ``sdst``; ``prow``
        is the (page, slot, head) row of token ``lane % 16`` (this lane's scale/zero pair),
        the code pieces' token rows come by shuffle (head_dim 128: token ``lane // 2``)."""
        crow = prow
        if cutlass.const_expr(self.row_bytes == 32):
            crow = _shfl_idx(prow, lane // 2)
        self._copy_chunk(c, n_mine, sdst, crow, prow, lc)

    def _issue(self, c, n_mine, sdst, blk, lc):
        """cp.async this warp's chunk ``c`` (K/V codes + scale/zero pairs) into ring stage
        ``sdst`` (predicated off past ``n_mine``); its row comes from the block ``blk``."""
        prow = _shfl_idx(blk, c & 31)
        self._copy_chunk(c, n_mine, sdst, prow, prow, lc)

    def _copy_chunk(self, c, n_mine, sdst, crow, prow, lc):
        """The copies of chunk ``c`` (nothing read past ``n_mine``): this lane's code pieces
        from row ``crow``, its scale/zero pair from row ``prow``."""
        # the rows fit int32 (checked on the host): one wide multiply per source address
        code_src, par_src, s_c, s4, dv = lc
        ka = _mad_wide_u32(crow, self.row_bytes, code_src)
        pa = _mad_wide_u32(prow, 4, par_src)
        if cutlass.const_expr(self.row_bytes == 32):
            _cp_async16_if(c, n_mine, sdst + s_c, ka)
            _cp_async16_if(c, n_mine, sdst + s_c + CHUNK * 32, ka + dv)
        else:
            _cp_async16_if(c, n_mine, sdst + s_c, ka)
        _cp_async4_if(c, n_mine, sdst + s4, pa)

    def _load_k(self, sbase, quad, g):
        """A fragments of the chunk's K codes at ring stage ``sbase`` (tokens g, g + 8)."""
        rb = self.row_bytes
        kf0 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
        kf1 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
        for n in range(2):
            t = self._tok(g, n)
            addr = sbase + t * rb + quad * self.nbk
            if self.nbk == 8:
                w0, w1 = _lds_v2(addr)
                words = [w0, w1]
            else:
                words = [_lds_b32(addr)]
            if cutlass.const_expr(self.s8):
                # kf[2 i + wi]: word wi times 4^(3 - i) (u8 A operand: quarter i's codes at
                # bits 6-7 of every byte), masked to 64 x the fields, or unmasked (the other
                # bits are the lower quarters and the next-lower byte's upper ones, which
                # the query fragments cancel: unmasked_k_query), per k_operand_form
                kf = kf0 if n == 0 else kf1
                for wi in range(2):
                    for i in range(4):
                        x = words[wi] if i == 3 else _mul_u32(words[wi], 4 ** (3 - i))
                        if cutlass.const_expr(self.k_form == "masked"
                                              or (self.k_form == "top" and i == 3)):
                            x = _ptx("and.b32 {$w0}, {$r0}, 0xC0C0C0C0;", [Int32], [x])
                        kf[2 * i + wi] = x
            else:
                self._unpack_k(words, kf0 if n == 0 else kf1)
        return kf0, kf1

    def _load_params(self, sbase, pos0, sink, int2_end, g, masked: bool):
        """Scale/zero of K and V of this lane's tokens g, g + 8 (V's zeroed, and a 0/1
        validity per token returned, when ``masked``). ``decode``'s full chunks: ``sv[n]``
        is the V scale as a broadcast fp16 pair (for the P pair's ``mul.f16x2``)."""
        rb = self.row_bytes
        f16_sv = not masked and not self.pair
        sk = cute.make_rmem_tensor((2,), Float32)
        zk = cute.make_rmem_tensor((2,), Float32)
        sv = cute.make_rmem_tensor((2,), Int32 if f16_sv else Float32)
        zv = cute.make_rmem_tensor((2,), Float32)
        valid = cute.make_rmem_tensor((2,), Int32) if masked else None
        for n in range(2):
            t = g + 8 * n
            a, zz = _f16x2_to_f32(_lds_b32(sbase + 2 * CHUNK * rb + t * 4))
            sk[n] = a
            zk[n] = zz
            vw = _lds_b32(sbase + 2 * CHUNK * rb + CHUNK * 4 + t * 4)
            if f16_sv:
                sv[n] = Int32(_prmt(vw, vw, 0x1010))
                zv[n] = _f16hi_to_f32(vw)
                continue
            a2, z2 = _f16x2_to_f32(vw)
            if masked:
                pos = pos0 + t
                ok = (Int32(cutlass.select_(pos >= sink, 1, 0))
                      & Int32(cutlass.select_(pos < int2_end, 1, 0)))
                valid[n] = ok
                sv[n] = _sel_f32(ok, a2, Float32(0.0))
                zv[n] = _sel_f32(ok, z2, Float32(0.0))
            else:
                sv[n] = a2
                zv[n] = z2
        return sk, zk, sv, zv, valid

    def _v_frags(self, sbase, v_ld):
        """V codes of the chunk at ``sbase`` -> ``f(mt)``: the A fragment of M tile ``mt``,
        unpacked lazily right before its MMA (fewer live registers). One ``ldmatrix.trans``
        (rows = tokens, 16-bit columns = code byte pairs; ``v_ld``: this lane's row address
        offset) hands lane (g, q) the byte pairs ``g`` (and ``g + 8`` at head_dim 128) of
        tokens ``2q, 2q + 1`` (and ``+ 8``) packed as (token 2q | token 2q + 1): the
        (token, token + 1) operand pairs without loads per token or byte permutes."""
        vaddr = sbase + CHUNK * self.row_bytes + v_ld
        if cutlass.const_expr(self.nbv == 4):
            r = _ldsm_x4_trans(vaddr)
            xs = [[r[0], r[1]], [r[2], r[3]]]
        else:
            r = _ldsm_x2_trans(vaddr)
            xs = [[r[0]], [r[1]]]
        shifted = [[_shr(x, 8) for x in row] for row in xs]

        def v_frag(mt):
            u, i = mt // 4, mt % 4
            frag = []
            for pair in range(2):
                for rh in range(2):
                    x = xs[pair][u] if rh == 0 else shifted[pair][u]
                    # m * code * 2^-24 exactly (fp16 subnormal): no offset in the O
                    # accumulators, which sum over thousands of tokens
                    frag.append(_and_mask(x, QUARTER_MASK[i]))
            return frag
        return v_frag

    def _int2_two_chunks(self, sa, sb, pos0, sink, int2_end, qa, qh, acc, st, quad, g, p_st,
                         p_ld, v_ld, masked: bool):
        """``decode`` (GQA 5-8): the two INT2 chunks of an iteration (ring stages ``sa``,
        ``sb``) with one running-max update: both chunks' scores, one lane max per head
        column, vote and (rare) rescale, then each chunk's exp2 / sums / P tile / PV."""
        stages = [sa, sb]
        scs = []
        prm = []
        for u in range(2):
            kf0, kf1 = self._load_k(stages[u], quad, g)
            s_acc = self._qk(qa, kf0, kf1, True)
            sk, zk, sv, zv, valid = self._load_params(stages[u], pos0 + u * CHUNK, sink,
                                                      int2_end, g, masked)
            sc = []
            for n in range(2):
                for j in range(2):
                    x = sk[n] * s_acc[2 * n + j] + zk[n] * qh[j]
                    sc.append(x if valid is None else _sel_f32(valid[n], x, Float32(NEG_INF)))
            scs.append(sc)
            prm.append((sv, zv, valid))
        loc = [_fmax(_fmax(scs[0][j], scs[0][2 + j]), _fmax(scs[1][j], scs[1][2 + j]))
               * qh[2 + j] for j in range(2)]
        grew = (Int32(cutlass.select_(loc[0] > st[0], 1, 0))
                | Int32(cutlass.select_(loc[1] > st[1], 1, 0)))
        self._max_and_rescale(st, loc[0], loc[1], acc, cute.arch.vote_any_sync(grew != 0))
        row = 2 * MAX_GROUP
        for u in range(2):
            sc = scs[u]
            sv, zv, valid = prm[u]
            pt = []
            for j in range(2):
                p0 = _ex2(sc[j] * qh[2 + j] - st[j])
                p1 = _ex2(sc[2 + j] * qh[2 + j] - st[j])
                st[2 + j] = (st[2 + j] + p0) + p1
                st[4 + j] = (st[4 + j] + p0 * zv[0]) + p1 * zv[1]
                pt.append([p0, p1] if valid is None else [p0 * sv[0], p1 * sv[1]])
            packed = []
            for n in range(2):
                if valid is None:   # full chunk: fp16 P pair x (s_v, s_v) pair
                    packed.append(_mul_f16x2(_pack_f16x2(pt[0][n], pt[1][n]), sv[n]))
                else:
                    packed.append(_pack_f16x2(pt[0][n], pt[1][n]))
            _sts_i32(p_st + u * P_TILE, packed[0])
            _sts_i32(p_st + u * P_TILE + 8 * row, packed[1])
            _syncwarp()
            b0, b1 = _ldsm_x2_trans(p_ld + u * P_TILE)
            va = self._v_frags(stages[u], v_ld)
            for mt in range(self.mtiles):
                c = [acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2], acc[4 * mt + 3]]
                r = _mma(*va(mt), b0, b1, *c, f16=True)
                for i in range(4):
                    acc[4 * mt + i] = r[i]

    def _int2_pair(self, sa, sb, pos0, sink, int2_end, qa, qh, acc, st, scale_log2, quad, g,
                   p_st, p_ld, v_ld, masked: bool):
        """Two INT2 chunks (ring stages ``sa``, ``sb``; positions pos0.., pos0 + 16..) with
        one softmax pass, for GQA ratios <= 4: the query fragment holds the group's heads
        in columns 0-3 and again in 4-7, so chunk A's scores are live in lanes of columns
        0-3 (quad < 2) and chunk B's in lanes of columns 4-7 (quad >= 2): one select per
        score merges them, and the scale/exp/sum/pack work per 16 tokens and warp halves
        (columns 4-7 carry a second running state per head, merged in the combine). The
        P tile then holds [P_A | P_B]; each PV MMA takes its chunk's columns (the other
        half of the B fragment zeroed). Head_dim 64 (fp16 QK); head_dim 128 runs
        :meth:`_int2_pair_hl`."""
        hi = Int32(cutlass.select_(quad >= 2, 1, 0))
        kf0, kf1 = self._load_k(sa, quad, g)
        s_a = self._qk(qa, kf0, kf1, True)
        kf0, kf1 = self._load_k(sb, quad, g)
        s_b = self._qk(qa, kf0, kf1, True)
        s_acc = [_sel_f32(hi, s_b[k], s_a[k]) for k in range(4)]
        sown = sa + hi * (sb - sa)
        sk, zk, sv, zv, valid = self._load_params(sown, pos0 + hi * CHUNK, sink, int2_end, g,
                                                  masked)
        v_frags = (self._v_frags(sa, v_ld), self._v_frags(sb, v_ld))
        self._softmax_pv(s_acc, qh, v_frags, sk, zk, sv, zv, valid, acc, st, scale_log2,
                         p_st, p_ld, True, g)

    def _tok(self, g, n: int):
        """Token (within a chunk) of MMA row ``g + 8 n``: ``g + 8 n``, or ``2 g + n`` in the hl
        kernel (so lane (g, q)'s two scores are adjacent tokens: one b32 P store, one
        64-bit load of their scale/zero pairs)."""
        return 2 * g + n if self.hl else g + 8 * n

    def _qk_hl(self, qa, kf0, kf1):
        """hl kernel: S^T of one chunk on one int8 chain, columns (2 h, 2 h + 1) = head h's
        (high, low) parts: the exact s32 scores of head ``quad``, tokens 2g, 2g+1."""
        z = Int32(0)
        c = [z] * 4
        for i in range(4):
            c = list(_mma_u8s8(kf0[2 * i], kf1[2 * i], kf0[2 * i + 1], kf1[2 * i + 1],
                               qa[2 * i], qa[2 * i + 1], *c))
        return [_mad_s32(c[0], 256, c[1]), _mad_s32(c[2], 256, c[3])]

    def _params_hl(self, sbase, pos0, sink, int2_end, g, masked: bool):
        """Scale/zero of K and V of tokens 2g, 2g+1 (one 64-bit load each). Full chunks:
        ``sv`` is one fp16 pair ``(s_v(2g), s_v(2g+1))`` for ``mul.f16x2``; masked chunks:
        two float32 scales zeroed outside ``[sink, int2_end)`` and the 0/1 validities."""
        rb = self.row_bytes
        kw = _lds_v2(sbase + 2 * CHUNK * rb + 2 * g * 4)
        vw = _lds_v2(sbase + 2 * CHUNK * rb + CHUNK * 4 + 2 * g * 4)
        sk, zk, sv, zv, valid = [], [], [], [], []
        for n in range(2):
            a, zz = _f16x2_to_f32(kw[n])
            sk.append(a)
            zk.append(zz)
            if not masked:
                # V scales stay fp16: (s_2g, s_2g+1) for one mul.f16x2 with the P pair
                zv.append(_f16hi_to_f32(vw[n]))
                continue
            a2, z2 = _f16x2_to_f32(vw[n])
            pos = pos0 + 2 * g + n
            ok = (Int32(cutlass.select_(pos >= sink, 1, 0))
                  & Int32(cutlass.select_(pos < int2_end, 1, 0)))
            valid.append(ok)
            sv.append(_sel_f32(ok, a2, Float32(0.0)))
            zv.append(_sel_f32(ok, z2, Float32(0.0)))
        if not masked:
            sv = [_prmt(vw[0], vw[1], 0x5410)]
        return sk, zk, sv, zv, (valid if masked else None)

    def _int2_pair_hl(self, sa, sb, pos0, sink, int2_end, qa, qh, acc, st, quad, g, p_st,
                      p_ld, v_ld, masked: bool):
        """Two INT2 chunks, one softmax pass, head_dim 128 with GQA <= 4 ("hl"): the query
        fragment holds head h's high int8 part in column 2 h and its low part in column
        2 h + 1, so one IMMA chain per chunk (4 instead of 8) yields in lane (g, q) the
        high and low s32 sums of head q for tokens 2g, 2g+1 (MMA rows g, g + 8): ``256 hi +
        lo`` in-lane. Each lane runs head q's online softmax over its 4 scores (both
        chunks, one running state); P goes through two [head][token] tiles (rows 4-7 zero)
        and one ldmatrix.x4, and both chunks' PV accumulate into columns 0-3."""
        kf0, kf1 = self._load_k(sa, quad, g)
        s_a = self._qk_hl(qa, kf0, kf1)
        kf0, kf1 = self._load_k(sb, quad, g)
        s_b = self._qk_hl(qa, kf0, kf1)
        ska, zka, sva, zva, vla = self._params_hl(sa, pos0, sink, int2_end, g, masked)
        skb, zkb, svb, zvb, vlb = self._params_hl(sb, pos0 + CHUNK, sink, int2_end, g, masked)
        raw = [_i2f(s_a[0]), _i2f(s_a[1]), _i2f(s_b[0]), _i2f(s_b[1])]
        sk = ska + skb
        zk = zka + zkb
        ys = []   # scores / qh[2]
        for k in range(4):
            y = sk[k] * raw[k] + zk[k] * qh[1]
            if masked:
                y = _sel_f32((vla + vlb)[k], y, Float32(NEG_INF))
            ys.append(y)
        self._softmax_pv_hl(ys, None, sva + svb, zva + zvb,
                            (self._v_frags(sa, v_ld), self._v_frags(sb, v_ld)), acc, st, p_st,
                            p_ld, quad, qh[2])

    @cute.jit
    def _rescale_hl(self, st, loc, acc, quad, moved):
        """hl: head quad's running max (lanes of one quad share it), updated only when some
        lane's scores exceed it; l, the correction and the O^T columns 2 quad, 2 quad + 1
        (heads whose softmax ran in quads 2 quad, 2 quad + 1) rescaled."""
        if moved:
            m_old = st[0]
            m_new = _fmax(m_old, self._col_max(loc))
            a = _ex2(m_old - m_new)
            st[0] = m_new
            st[2] = st[2] * a
            st[4] = st[4] * a
            a0 = _shfl_idx(a, (2 * quad) & 3)
            a1 = _shfl_idx(a, (2 * quad + 1) & 3)
            for i in cutlass.range_constexpr(2 * self.mtiles):
                acc[2 * i] = acc[2 * i] * a0
                acc[2 * i + 1] = acc[2 * i + 1] * a1

    def _softmax_pv_hl(self, xs, valid, sv, zv, va, acc, st, p_st, p_ld, quad, scale=None):
        """hl online softmax of head ``quad`` over the scores ``scale * xs`` (4: an INT2
        chunk pair, tokens 2g, 2g+1 of A then B, with ``sv``/``zv``; 2: a BF16 window chunk
        (``scale`` None), ``va`` its operands and ``valid`` its token mask), then O^T +=
        V^T P^T. ``scale`` > 0 multiplies inside the exp2 and once for the lane's max."""
        if valid is not None:
            xs = [_sel_f32(valid[k], xs[k], Float32(NEG_INF)) for k in range(len(xs))]
        loc = xs[0]
        for x in xs[1:]:
            loc = _fmax(loc, x)
        if scale is not None:
            loc = loc * scale
        grew = Int32(cutlass.select_(loc > st[0], 1, 0))
        self._rescale_hl(st, loc, acc, quad, cute.arch.vote_any_sync(grew != 0))
        if scale is not None:
            ps = [_ex2(x * scale - st[0]) for x in xs]
        else:
            ps = [_ex2(x - st[0]) for x in xs]
        tot = st[2]
        for pk in ps:
            tot = tot + pk
        st[2] = tot
        _syncwarp()
        if sv is not None:
            corr = st[4]
            for k in range(4):
                corr = corr + ps[k] * zv[k]
            st[4] = corr
            if len(sv) == 2:   # full chunks: fp16 (s_v, s_v') pairs, one f16x2 multiply
                _sts_i32(p_st, _mul_f16x2(_pack_f16x2(ps[0], ps[1]), sv[0]))
                _sts_i32(p_st + P_TILE, _mul_f16x2(_pack_f16x2(ps[2], ps[3]), sv[1]))
            else:
                _sts_i32(p_st, _pack_f16x2(ps[0] * sv[0], ps[1] * sv[1]))
                _sts_i32(p_st + P_TILE, _pack_f16x2(ps[2] * sv[2], ps[3] * sv[3]))
            _syncwarp()
            r = _ldsm_x4(p_ld)
            for mt in range(self.mtiles):
                for c_i in range(2):
                    c = [acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2], acc[4 * mt + 3]]
                    out = _mma(*va[c_i](mt), r[2 * c_i], r[2 * c_i + 1], *c, f16=True)
                    for i in range(4):
                        acc[4 * mt + i] = out[i]
        else:
            # window P on the INT2 operands' 2^-24 scale (bf16 has the exponent range)
            _sts_i32(p_st, _pack_bf16x2(ps[0] * Float32(SUBNORMAL), ps[1] * Float32(SUBNORMAL)))
            _syncwarp()
            b0, b1 = _ldsm_x2(p_ld)
            for mt in range(self.mtiles):
                c = [acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2], acc[4 * mt + 3]]
                a = [va[mt * 2], va[mt * 2 + 1], va[(self.mtiles + mt) * 2],
                     va[(self.mtiles + mt) * 2 + 1]]
                out = _mma(*a, b0, b1, *c)
                for i in range(4):
                    acc[4 * mt + i] = out[i]

    def _unpack_k(self, words, kf):
        """K code words of one token -> 2*ksteps A fragments of fp16 ``m_i * code * 2^-24``."""
        for wi in range(len(words)):
            x = words[wi]
            src = [x, _shr(x, 8)]        # [hh]: bytes 0, 2 / bytes 1, 3 at bits 0-7, 16-23
            for i in range(4):
                for hh in range(2):
                    kf[wi * 8 + i * 2 + hh] = _and_mask(src[hh], QUARTER_MASK[i])

    def _win_addr(self, base, wslot, win_rows, num_kv_heads, h, wrow):
        return base + ((Int64(wslot) * Int64(win_rows) + Int64(wrow)) * Int64(num_kv_heads)
                       + Int64(h)) * (self.d * 2)

    def _window_pos_row(self, v, sink, recent, nsink, rstart):
        pos = Int32(cutlass.select_(v >= nsink, rstart + (v - nsink), v))
        ring = sink + pos % cutlass.max(recent, 1)
        return Int32(cutlass.select_(pos < sink, pos, ring))

    def _load_window_k(self, kw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent, nsink,
                       rstart, nwin, v, quad, kf):
        vv = Int32(cutlass.select_(v < nwin, v, 0))
        wrow = self._window_pos_row(vv, sink, recent, nsink, rstart)
        base = self._win_addr(kw_ptr, wslot, win_rows, num_kv_heads, h, wrow)
        d = self.d
        for i in range(4):
            addr = base + (quad * self.nbk + i * (d // 4)) * 2
            w = list(_ldg_v4(addr)) if self.nbk == 8 else list(_ldg_v2(addr))
            for wi in range(self.nbk // 4):
                for hh in range(2):
                    kf[wi * 8 + i * 2 + hh] = _mul_bf16x2(
                        _prmt(w[2 * wi], w[2 * wi + 1], 0x5410 if hh == 0 else 0x7632),
                        QUARTER_MULT[i])

    def _load_window_v(self, vw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent, nsink,
                       rstart, nwin, v0, quad, g, va):
        d = self.d
        words = []  # [token j][run i] -> b32 words (nbv/2 of them)
        for j in range(4):
            t = 2 * quad + (j % 2) + 8 * (j // 2)
            v = v0 + t
            vv = Int32(cutlass.select_(v < nwin, v, 0))
            wrow = self._window_pos_row(vv, sink, recent, nsink, rstart)
            base = self._win_addr(vw_ptr, wslot, win_rows, num_kv_heads, h, wrow)
            runs = []
            for i in range(4):      # channels 2g + 16u, + 1 of quarter i (see pv_channel)
                runs.append([_ldg_b32(base + (2 * g + 16 * u + i * (d // 4)) * 2)
                             for u in range(self.nbv // 2)])
            words.append(runs)
        for pair in range(2):
            ta, tb = words[2 * pair], words[2 * pair + 1]
            for mt in range(self.mtiles):
                u, i = mt // 4, mt % 4
                for rh in range(2):
                    va[(pair * self.mtiles + mt) * 2 + rh] = _mul_bf16x2(
                        _prmt(ta[i][u], tb[i][u], 0x5410 if rh == 0 else 0x7632),
                        QUARTER_MULT[i])

    def _chunk(self, qa, qh, kf0, kf1, va, sk, zk, sv, zv, valid, acc, st, scale_log2, quad,
               p_st, p_ld, is_int2: bool):
        """One 16-token chunk of one warp: S^T = K Q^T (tokens x heads), online softmax per
        head column, warp transpose of P to the B operand, O^T += V^T P^T."""
        s_acc = self._qk(qa, kf0, kf1, is_int2)
        self._softmax_pv(s_acc, qh, va, sk, zk, sv, zv, valid, acc, st, scale_log2, p_st,
                         p_ld, is_int2, None)

    def _qk(self, qa, kf0, kf1, is_int2: bool):
        """S^T of one chunk: s_acc[2 n + j] = score of token g + 8 n, head column 2 quad + j
        (raw: INT2 chunks before the per-token scale/zero)."""
        if is_int2 and self.s8:
            # two s32 chains (high / low query parts) over the four quarters, hi * 256 + lo
            z = Int32(0)
            ch = [[z] * 4, [z] * 4]
            for i in range(4):
                for part in range(2):
                    ch[part] = list(_mma_u8s8(kf0[2 * i], kf1[2 * i], kf0[2 * i + 1],
                                              kf1[2 * i + 1], qa[8 * part + 2 * i],
                                              qa[8 * part + 2 * i + 1], *ch[part]))
            s_acc = [_i2f(_mad_s32(ch[0][k], 256, ch[1][k])) for k in range(4)]
        else:
            chains = [[Float32(0.0)] * 4, [Float32(0.0)] * 4]   # two independent MMA chains
            for s in range(self.ksteps):
                chains[s % 2] = list(_mma(kf0[2 * s], kf1[2 * s], kf0[2 * s + 1],
                                          kf1[2 * s + 1], qa[2 * s], qa[2 * s + 1],
                                          *chains[s % 2], f16=is_int2))
            s_acc = [chains[0][i] + chains[1][i] for i in range(4)]
        return s_acc

    def _softmax_pv(self, s_acc, qh, va, sk, zk, sv, zv, valid, acc, st, scale_log2, p_st,
                    p_ld, is_int2: bool, g_pair):
        """Online softmax of the scores ``s_acc`` and O^T += V^T P^T. ``g_pair`` (this lane's
        head column g) set: a chunk pair (``va`` = (V of A, V of B)), see _int2_pair."""
        sc = []
        sk2 = [[sk[n] * qh[2 + j] for j in range(2)] for n in range(2)] if is_int2 else None
        for n in range(2):
            for j in range(2):
                raw = s_acc[2 * n + j]
                if is_int2:
                    x = sk2[n][j] * raw + zk[n] * qh[j]
                else:
                    x = raw * scale_log2
                sc.append(x if valid is None else _sel_f32(valid[n], x, Float32(NEG_INF)))
        pt = []      # p~ (fp32) per (j, n)
        packed = []  # per n: bf16x2 (head 2q, head 2q+1)
        loc = [_fmax(sc[0], sc[2]), _fmax(sc[1], sc[3])]     # this lane's max per head
        grew = (Int32(cutlass.select_(loc[0] > st[0], 1, 0))
                | Int32(cutlass.select_(loc[1] > st[1], 1, 0)))
        self._max_and_rescale(st, loc[0], loc[1], acc, cute.arch.vote_any_sync(grew != 0))
        for j in range(2):
            p0 = _ex2(sc[j] - st[j])
            p1 = _ex2(sc[2 + j] - st[j])
            # the same sum in two float orders: each kernel keeps the one it was GPU-tested
            # and timed with (pair: the head_dim-64 kernel; decode: its window chunks)
            if self.pair:
                st[2 + j] = st[2 + j] + (p0 + p1)
            else:
                st[2 + j] = (st[2 + j] + p0) + p1
            if is_int2:
                st[4 + j] = st[4 + j] + (p0 * zv[0] + p1 * zv[1])
                pt.append([p0 * sv[0], p1 * sv[1]])
            else:
                # window P on the INT2 operands' 2^-24 scale (bf16 has the exponent range)
                pt.append([p0 * Float32(SUBNORMAL), p1 * Float32(SUBNORMAL)])
        for n in range(2):
            packed.append((_pack_f16x2 if is_int2 else _pack_bf16x2)(pt[0][n], pt[1][n]))
        # P^T B fragment of lane (g, q): tokens 2q, 2q+1 (+8) of head g
        # through this warp's P tile: [token][head] stores, ldmatrix.trans -> (tokens 2q,
        # 2q + 1 (+ 8), head g); the tile of a chunk is rewritten two chunks later (window
        # chunks: one tile, ordered by the sync before the next store)
        if not is_int2 or g_pair is not None:
            _syncwarp()
        row = PAIR_ROW if self.pair else 2 * MAX_GROUP
        _sts_i32(p_st, packed[0])
        _sts_i32(p_st + 8 * row, packed[1])
        _syncwarp()
        if g_pair is not None:
            # pair tile (see kernel): chunk A's B fragment = (tokens 2q.. of head g < 4, 0
            # for g >= 4), chunk B's = (0, head g >= 4), in one ldmatrix.x4.trans
            r = _ldsm_x4_trans(p_ld)
            bs = [(r[0], r[1]), (r[2], r[3])]
            for mt in range(self.mtiles):
                for c_i in range(2):
                    c = [acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2], acc[4 * mt + 3]]
                    r = _mma(*va[c_i](mt), bs[c_i][0], bs[c_i][1], *c, f16=True)
                    for i in range(4):
                        acc[4 * mt + i] = r[i]
            return
        b0, b1 = _ldsm_x2_trans(p_ld)
        for mt in range(self.mtiles):
            c = [acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2], acc[4 * mt + 3]]
            if callable(va):
                a = va(mt)
            else:
                a = [va[mt * 2], va[mt * 2 + 1], va[(self.mtiles + mt) * 2],
                     va[(self.mtiles + mt) * 2 + 1]]
            r = _mma(*a, b0, b1, *c, f16=is_int2)
            for i in range(4):
                acc[4 * mt + i] = r[i]


class Int2DecodeMergeSm90:
    """Merge the splits of :class:`Int2PagedDecodeSm90` and store in the output dtype: one
    CTA per (sequence, query head), ``MERGE_PARTS * head_dim`` threads (part ``p``, channel
    ``e``). The partials are in the model's space already (each split applied ``R_V^T``).

    ``o[b, g, e] = sum_s w_s o_part[b, g, s, e] / sum_s w_s`` with
    ``w_s = 2^(lse2_s - max lse2)``; ``lse = ln 2 * (max lse2 + log2 sum_s w_s)``
    (``-inf`` and ``o = 0`` for a sequence without tokens). ``o`` is written at
    ``o_ptr + (b * o_stride_b + qh * o_stride_h + e) * elem`` as float32 (``out_kind`` 0),
    bf16 (1) or fp16 (2), so it lands directly in the caller's ``out``. Requires
    ``num_splits <= MAX_SPLITS``.
    """

    def __init__(self, config: Int2DecodeConfig):
        self.d = config.head_dim
        self.threads = MERGE_PARTS * self.d

    @cute.jit
    def __call__(self, opart_ptr: Int64, lse_part_ptr: Int64, o_ptr: Int64, lse_ptr: Int64,
                 batch_size: Int32, num_kv_heads: Int32, group: Int32, num_splits: Int32,
                 out_kind: Int32, o_stride_b: Int32, o_stride_h: Int32,
                 stream: cuda.CUstream):
        self.kernel(opart_ptr, lse_part_ptr, o_ptr, lse_ptr, num_splits, out_kind, o_stride_b,
                    o_stride_h).launch(grid=(num_kv_heads * group, batch_size, 1),
                                       block=(self.threads, 1, 1), stream=stream,
                                       smem=(2 * self.threads + 64) * 4)

    @cute.kernel
    def kernel(self, opart_ptr: Int64, lse_part_ptr: Int64, o_ptr: Int64, lse_ptr: Int64,
               num_splits: Int32, out_kind: Int32, o_stride_b: Int32, o_stride_h: Int32):
        d = self.d
        nthreads = self.threads
        nwarps = nthreads // 32
        qh, b, _ = cute.arch.block_idx()
        num_qo_heads = cute.arch.grid_dim()[0]
        t, _, _ = cute.arch.thread_idx()
        lane = t % 32
        warp = t // 32
        part = t // d
        ch = t - part * d
        sm = cute.arch.get_dyn_smem(cutlass.Int8, alignment=16).toint()
        s_w = sm                          # [nthreads] split weights
        s_red = sm + nthreads * 4         # [nthreads] partial sums
        s_warp = sm + 2 * nthreads * 4    # [nwarps] warp maxima, then sums
        row = Int64(b) * Int64(num_qo_heads) + Int64(qh)
        # this thread's partials o_part[s][ch] of the splits s = part (mod MERGE_PARTS),
        # issued before the split weights are known (one memory round trip fewer)
        obase = opart_ptr + (row * num_splits * d + Int64(ch)) * 4
        vals = []
        for k in cutlass.range_constexpr(MAX_SPLITS // MERGE_PARTS):
            sidx = cutlass.min(part + k * MERGE_PARTS, num_splits - 1)   # w = 0 past the end
            vals.append(_ldg_f32(obase + Int64(sidx) * (d * 4)))
        # lse2 of split t, block max
        l_t = Float32(NEG_INF)
        if t < num_splits:
            l_t = _ldg_f32(lse_part_ptr + (row * num_splits + Int64(t)) * 4)
        mx = l_t
        for k in cutlass.range_constexpr(5):
            mx = _fmax(mx, _shfl_bfly(mx, 1 << k))
        if lane == 0:
            _sts_f32(s_warp + warp * 4, mx)
        cute.arch.sync_threads()
        mx = Float32(NEG_INF)
        for w in cutlass.range_constexpr(nwarps):
            mx = _fmax(mx, _lds_f32(s_warp + w * 4))
        m_use = _sel_f32(Int32(cutlass.select_(mx == Float32(NEG_INF), 0, 1)), mx, Float32(0.0))
        w_t = _ex2(l_t - m_use)
        _sts_f32(s_w + t * 4, w_t)
        tot = w_t
        for k in cutlass.range_constexpr(5):
            tot = tot + _shfl_bfly(tot, 1 << k)
        cute.arch.sync_threads()
        if lane == 0:
            _sts_f32(s_warp + warp * 4, tot)
        # sum_s w_s o_part[s][ch] over the splits s = part (mod MERGE_PARTS)
        acc = Float32(0.0)
        for k in cutlass.range_constexpr(MAX_SPLITS // MERGE_PARTS):
            acc = acc + _lds_f32(s_w + (part + k * MERGE_PARTS) * 4) * vals[k]
        _sts_f32(s_red + t * 4, acc)
        cute.arch.sync_threads()
        tot = Float32(0.0)
        for w in cutlass.range_constexpr(nwarps):
            tot = tot + _lds_f32(s_warp + w * 4)
        inv = Float32(0.0)
        if tot > Float32(0.0):
            inv = _rcp(tot)
        if part == 0:
            o = Float32(0.0)
            for pp in cutlass.range_constexpr(MERGE_PARTS):
                o = o + _lds_f32(s_red + (pp * d + ch) * 4)
            oel = Int64(b) * Int64(o_stride_b) + Int64(qh) * Int64(o_stride_h) + Int64(ch)
            _store_kind(o_ptr, oel, o * inv, out_kind)
        if t == 0:
            lse = Float32(NEG_INF)
            if tot > Float32(0.0):
                lse = (mx + _lg2(tot)) * Float32(math.log(2.0))
            _stg_f32(lse_ptr + row * 4, lse)


def _ldg_f32(addr):
    return _ptx("ld.global.f32 {$w0}, [{$r0}];", [Float32], [addr])


def _ldcg_f32(addr):
    """Load through L2 only (data written by other CTAs of this launch)."""
    return _ptx("ld.global.cg.f32 {$w0}, [{$r0}];", [Float32], [addr])


def _trace(counter_ptr, cta, k: int, tidx):
    """Debug (``OSCAR_CUTE_DEBUG=trace`` builds only): thread 0 stores %globaltimer in u64
    slot ``k`` (0-6 the phases, 8-10 inside the merge tail) and %smid in slot 7 of this
    CTA's 16 slots (128 B), 256 KB past the tickets."""
    if "trace" in _DEBUG:
        slot = counter_ptr + Int64(TRACE_OFFSET) + Int64(cta) * 128
        _ptx("{ .reg .pred p; setp.eq.s32 p, {$r2}, 0; "
             "@p st.global.u64 [{$r0}], {$r3}; @p st.global.u32 [{$r1}], {$r4}; }", [],
             [slot + k * 8, slot + 56, tidx, cute.arch.globaltimer(), cute.arch.smid()])
        if _CLK and k in (1, 2):   # trace,clk: %clock64 too at the INT2 loop's ends (11, 12)
            _ptx("{ .reg .pred p; setp.eq.s32 p, {$r1}, 0; @p st.global.u64 [{$r0}], {$r2}; }",
                 [], [slot + (10 + k) * 8, tidx, cute.arch.clock64()])


def _trace_warp(counter_ptr, cw, k: int, lane):
    """Debug (``OSCAR_CUTE_DEBUG=trace`` builds only): lane 0 of warp ``cw`` (CTA index x
    warps + warp) stores %globaltimer in u64 slot ``k`` (0: INT2 loop start, 1: its work
    done, before the CTA's combine) of its two, ``TRACE_WARP_OFFSET`` past the CTA slots."""
    if "trace" in _DEBUG:
        slot = counter_ptr + Int64(TRACE_OFFSET + TRACE_WARP_OFFSET) + Int64(cw) * 16
        _ptx("{ .reg .pred p; setp.eq.s32 p, {$r1}, 0; @p st.global.u64 [{$r0}], {$r2}; }",
             [], [slot + k * 8, lane, cute.arch.globaltimer()])


def _prefetch_l2(addr):
    _ptx("prefetch.global.L2 [{$r0}];", [], [addr])


def _fence_acq_rel_gpu():
    _ptx("fence.acq_rel.gpu;", [], [])


def _counter_addr(counter_ptr, b, h, num_kv_heads):
    """Address of the ticket / count of (sequence ``b``, KV head ``h``)."""
    return counter_ptr + (Int64(b) * Int64(num_kv_heads) + Int64(h)) * 4


def _ld_relaxed_s32(addr):
    return _ptx("ld.relaxed.gpu.global.s32 {$w0}, [{$r0}];", [Int32], [addr])


def _nanosleep(ns: int):
    _ptx(f"nanosleep.u32 {ns};", [], [])


def _atom_add_s32(addr, val: int):
    return _ptx(f"atom.global.add.s32 {{$w0}}, [{{$r0}}], {val};", [Int32], [addr])


def _stg_s32(addr, val: int):
    _ptx(f"st.global.b32 [{{$r0}}], {val};", [], [addr])


def _sts_i32(addr, val):
    _ptx("st.shared.b32 [{$r0}], {$r1};", [], [addr, val])


def _sts_b16_of_f32(addr, val):
    """Store ``val`` rounded to bf16 into shared memory."""
    _ptx("{ .reg .b16 t; cvt.rn.bf16.f32 t, {$r1}; st.shared.b16 [{$r0}], t; }", [],
         [addr, val])


def _ldg_kind(addr4, addr2, kind):
    """Load one element as float32: ``kind`` 0 float32 at ``addr4``, 1 bf16 / 2 fp16 at
    ``addr2`` (predicated loads, no branch)."""
    return _ptx("{ .reg .pred p0, p1; .reg .b16 t; .reg .f32 a, x, y; "
                "setp.eq.s32 p0, {$r2}, 0; setp.eq.s32 p1, {$r2}, 1; "
                "mov.f32 a, 0f00000000; mov.b16 t, 0; "
                "@p0 ld.global.nc.f32 a, [{$r0}]; @!p0 ld.global.nc.b16 t, [{$r1}]; "
                "cvt.f32.bf16 x, t; cvt.f32.f16 y, t; selp.f32 y, x, y, p1; "
                "selp.f32 {$w0}, a, y, p0; }", [Float32], [addr4, addr2, kind])


def _store_kind(base, idx, val, kind):
    """Store ``val`` at element ``idx`` of ``base``: ``kind`` 0 float32, 1 bf16, 2 fp16."""
    _ptx("{ .reg .pred p0, p1, p2; .reg .b16 t, u; "
         "setp.eq.s32 p0, {$r3}, 0; setp.eq.s32 p1, {$r3}, 1; setp.eq.s32 p2, {$r3}, 2; "
         "cvt.rn.bf16.f32 t, {$r2}; cvt.rn.f16.f32 u, {$r2}; "
         "@p0 st.global.f32 [{$r0}], {$r2}; @p1 st.global.b16 [{$r1}], t; "
         "@p2 st.global.b16 [{$r1}], u; }", [], [base + idx * 4, base + idx * 2, val, kind])


def _sts_f32(addr, val):
    _ptx("st.shared.f32 [{$r0}], {$r1};", [], [addr, val])


def _lds_f32(addr):
    return _ptx("ld.shared.f32 {$w0}, [{$r0}];", [Float32], [addr])


def compile_decode(config: Int2DecodeConfig):
    """``cute.compile`` the launcher for ``config`` (works without a GPU with
    ``CUTE_DSL_ARCH=sm_90a``). Returns the compiled function (exportable with
    ``export_to_c``)."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from cutlass.runtime import make_fake_stream

    op = Int2PagedDecodeSm90(config)
    z64, z32 = Int64(0), Int32(0)
    return cute.compile(op, *([z64] * NUM_PTR_ARGS), *([z32] * NUM_INT_ARGS), Float32(1.0),
                        make_fake_stream())


def compile_merge(config: Int2DecodeConfig):
    """``cute.compile`` the split-merge launcher for ``config``."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from cutlass.runtime import make_fake_stream

    op = Int2DecodeMergeSm90(config)
    z64, z32 = Int64(0), Int32(0)
    return cute.compile(op, *([z64] * 4), *([z32] * 7), make_fake_stream())
