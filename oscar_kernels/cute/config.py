"""Constants and the static compile key of the CuTe decode kernels.

One definition each, shared by the kernels (:mod:`.decode_sm90`, :mod:`.merge_sm90`), the
planner (:mod:`.plan`), the launcher (:mod:`.launch`) and the bundle (:mod:`.bundle`,
:mod:`.aot`). Imports nothing but the standard library: the ahead-of-time build reads it
without torch, the host reads it without cutlass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Head dims with a kernel.
HEAD_DIMS = (64, 128)
#: Largest GQA ratio (query heads per KV head): the QK MMA has 16 rows, 8 used.
MAX_GROUP = 8
#: GQA ratios up to this run the ``decode_pair`` kernel (query heads in MMA columns 0-3 and
#: again 4-7, two chunks per softmax pass).
PAIR_MAX_GROUP = 4
#: Tokens per chunk. With pages of a multiple of CHUNK tokens a chunk lies inside one page
#: (one row per chunk); other page sizes run the ``*_anypage`` build (a row per token).
CHUNK = 16
#: Resident warps per SM the split heuristic plans for, and the kernels' launch bound (128
#: registers per thread: 65536 / (128 x 32)); a CTA of 4 warps -> 4 CTAs per SM.
SM_WARPS = 16
#: Warps per CTA of the decode kernels: 4, or 8 (the wide build, head_dim 128 only).
CTA_WARPS = (4, 8)
#: Most splits per (sequence, KV head); the merge kernel sums up to this many partials.
MAX_SPLITS = 128
#: The last CTA of a (sequence, KV head) merges the splits, applies ``R_V^T`` and stores
#: ``o`` when ``num_splits * group <= FUSED_TAIL_ROWS`` (one launch in all; 4-warp builds
#: with one split store ``o`` directly); above it the merge is a second kernel spread over
#: (sequence, query head) CTAs: one CTA cannot pull that many partials fast (Llama-3-70B TP8
#: batch 1 at 8K: 47 us fused against 37 us with the merge kernel).
FUSED_TAIL_ROWS = 128
#: Depths of each warp's cp.async ring (chunks in flight per warp): see :func:`ring_depth`.
DEEP_STAGES = 8
SHALLOW_STAGES = 4
#: A BF16 window chunk in INT2 chunks when the kernel balances its warps' ranges (warp w runs
#: window chunks w, w + warps * num_splits, ..; its INT2 range is shorter by this much per
#: window chunk): the bytes of a window chunk (16 tokens x head_dim x 2 x 2 B) over an INT2
#: chunk's (2 x 16 x head_dim / 4 + 2 x 16 x 4 B), 7.1 at head_dim 128; 4, 7, 10 and 14 were
#: measured, 7 was fastest.
WINDOW_CHUNK_COST = 7
#: Split shares of the wide build in a single wave that is not full: a split whose CTA is
#: the first one dispatched to its SM (rank 0: CTA index < #SMs, the grid is split-major)
#: weighs RANK0_WEIGHT, the others RANK_WEIGHT. The first CTA of an SM gets more issue slots
#: (its INT2 loop ran ~1.2x faster with equal shares in the per-CTA traces of
#: perf/trace_decode.py). 3/2 measured 1-2 % faster than 5/4 (qwen3-8b batch 8,
#: llama3-70b-tp8 batch 64 / 128), 7/4 and 2/1 slower. In a full wave (#CTAs == 2 x #SMs)
#: the dispatch pairs CTAs otherwise, and equal shares were 10-15 % faster there.
RANK0_WEIGHT = 3
RANK_WEIGHT = 2
#: ... only when every warp's range is at least this many INT2 chunks (and covers twice its
#: window work: 2 x WINDOW_CHUNK_COST = 14 chunks with one window chunk per warp); 8 was as
#: fast as 16 and 24 or faster (qwen3-8b batch 8 / 16K 3 %, llama3-70b-tp8 batch 64 /
#: 8K-16K 2-4.5 %).
RANK_MIN_CHUNKS = 8
#: ... and only with at most this many splits (the grid is split-major then, else
#: (split, head, sequence)): 8 splits gain at 32K and longer (llama3-70b-tp8 batch 32
#: 2.5-3.2 %, qwen3-8b batch 4 4 %) and lose at 8K-16K (llama3-70b-tp8 batch 32 3-7 %).
RANK_MAX_SPLITS = 8
#: The any-page build finds a token's page with float arithmetic, exact for positions below
#: this (a cache of at most this many token slots).
ANY_PAGE_MAX_SLOTS = 1 << 24
#: Byte offset of the debug trace slots in the ticket buffer (builds with ``"trace"`` in
#: :attr:`Int2DecodeConfig.debug`; perf/trace_decode.py reads them).
TRACE_OFFSET = 1 << 18
#: Per-warp trace slots (16 B per warp) start this far past the CTA slots (128 B per CTA).
TRACE_WARP_OFFSET = 8 << 20
#: int32 words of a ticket buffer that holds the trace slots of a debug trace build.
TRACE_TICKET_WORDS = TRACE_OFFSET // 4 + (1 << 22)

# ------------------------------------------------------------------ kernel constants
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
#: Bytes per token row of the pair kernel's P tile (2 P_TILE in all).
PAIR_ROW = 32
#: Sleep between a merge CTA's polls of its counter (ns; ``nanosleep`` is approximate).
MERGER_SLEEP_NS = 100

# ------------------------------------------------------------------ the C ABI
#: The decode launcher's arguments, in order: pointers (int64), then int32 arguments, then
#: one float (``scale_log2``) and the stream. The one list of them: the kernel's signature
#: (checked by tests/cute/test_config.py), the compile key's example arguments, the bundle's
#: ctypes argument types and the launcher's argument list all follow it.
DECODE_PTR_ARGS = ("q", "k_codes", "k_params", "v_codes", "v_params", "k_window", "v_window",
                   "kv_indptr", "kv_indices", "kv_last_page_len", "window_slots", "o_part",
                   "lse_part", "rk_operand", "rv_operand", "o", "lse", "tickets")
DECODE_INT_ARGS = ("batch_size", "num_kv_heads", "group", "page_size", "stride_page",
                   "stride_slot", "stride_head", "sink", "recent", "num_splits", "rk_stride",
                   "rv_stride", "q_kind", "q_stride_b", "q_stride_h", "o_kind", "o_stride_b",
                   "o_stride_h")
#: The merge launcher's arguments: pointers, int32 arguments, then the stream.
MERGE_PTR_ARGS = ("o_part", "lse_part", "o", "lse")
MERGE_INT_ARGS = ("batch_size", "num_kv_heads", "group", "num_splits", "o_kind", "o_stride_b",
                  "o_stride_h")

# ------------------------------------------------------------------ compile key
#: K operand forms of the int8 QK (see :func:`k_operand_form`).
K_OPERAND_FORMS = ("masked", "unmasked", "top")
#: Debug build flags (:attr:`Int2DecodeConfig.debug`). Phase skips, for timing what each
#: phase adds (results are wrong): ``rot`` (query rotation), ``loop`` (INT2 chunks), ``win``
#: (BF16 window chunks), ``tail`` (split merge), ``merge`` (the merge after the ticket),
#: ``fence``, ``sums`` (the merge tail's per-split sums), ``nocons`` (the INT2 loop's copies
#: and waits without its math), ``noload`` (its math without the copies, on whatever the
#: ring holds; page sizes that are multiples of 16). ``trace``: thread 0 of every CTA stores
#: %globaltimer at its phase boundaries into the ticket buffer (perf/trace_decode.py reads
#: it), with ``pro`` also when the CTA's prologue loads had arrived (stamps 11-15), with
#: ``ramp`` when warp 0's INT2 chunks 0, 8, 16 and 24 had (11-14), or with ``clk`` the SM's
#: ``%clock64`` at the INT2 loop's start and end (11-12). Without flags (the shipped
#: bundle) a build is byte-identical to one without these switches.
DEBUG_FLAGS = frozenset({"rot", "loop", "win", "tail", "merge", "fence", "sums", "nocons",
                         "noload", "trace", "pro", "ramp", "clk"})


@dataclass(frozen=True)
class Int2DecodeConfig:
    """Static compile key of :class:`~oscar_kernels.cute.decode_sm90.Int2PagedDecodeSm90`
    (and, by ``head_dim``, of the merge kernel)."""

    head_dim: int
    #: GQA ratios <= 4 only: two chunks per softmax pass
    pair: bool = False
    #: Warps per CTA (every warp an independent KV split): 4 (4 CTAs per SM) or 8 (2 CTAs
    #: per SM, head_dim 128 only: the query / output rotation gives each warp an M tile)
    warps: int = 4
    #: Pages of any size (not a multiple of CHUNK, e.g. SGLang's default 1): a chunk's 16
    #: tokens may lie in several pages, so every lane finds its token's page; 4 warps only
    any_page: bool = False
    #: Merge CTAs (the wide pair build for single-wave shapes): one more CTA per (sequence,
    #: KV head) merges its splits; 8 warps and ``pair`` only
    merge_ctas: bool = False
    #: Depth of each warp's cp.async ring, a power of two >= 4 (the ring index is
    #: ``chunk & (stages - 1)``); 0: the build's default (:func:`default_stages`). The
    #: shallow pair builds (``decode_pair_ring4``) set 4.
    stages: int = 0
    #: The int8 QK's K operand form (one of K_OPERAND_FORMS) instead of the build's
    #: default (:func:`k_operand_form`; for measuring the alternatives)
    k_operands: str | None = None
    #: ``(rank-0 weight, other weight)`` of the wide build's split shares instead of
    #: ``(RANK0_WEIGHT, RANK_WEIGHT)`` (for measuring the alternatives)
    rank_weights: tuple[int, int] | None = None
    #: Debug build flags (DEBUG_FLAGS): phase skips or the %globaltimer trace
    debug: frozenset = field(default_factory=frozenset)

    def __post_init__(self):
        s = self.stages
        if s != 0 and not (s >= 4 and s & (s - 1) == 0):
            raise ValueError(f"stages: expected 0 or a power of two >= 4, got {s!r}")
        if self.k_operands not in (None,) + K_OPERAND_FORMS:
            raise ValueError(f"k_operands: expected None or one of {K_OPERAND_FORMS}, got "
                             f"{self.k_operands!r}")
        rw = self.rank_weights
        if rw is not None and not (len(rw) == 2 and all(isinstance(x, int) and x > 0
                                                        for x in rw)):
            raise ValueError(f"rank_weights: expected two positive ints, got {rw!r}")
        debug = frozenset(self.debug)
        if not debug <= DEBUG_FLAGS:
            raise ValueError(f"debug: unknown flags {sorted(debug - DEBUG_FLAGS)}; expected "
                             f"some of {sorted(DEBUG_FLAGS)}")
        if "clk" in debug and ("pro" in debug or "ramp" in debug):
            raise ValueError("debug: clk, pro and ramp use the same trace slots (11-15); "
                             f"got {sorted(debug)}")
        object.__setattr__(self, "debug", debug)

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


def ring_depth(head_dim: int, pair: bool, merge_ctas: bool = False) -> int:
    """The cp.async ring depth of a decode build that does not set its own
    (``Int2DecodeConfig.stages`` 0), which the host plans with too: SHALLOW_STAGES for the
    merge-CTA build and for ``decode`` (GQA > 4) at head_dim 128 (4 or 8 warps, also
    any-page), else DEEP_STAGES.

    Every build at 4 against 8 stages on an H200 (alternating rounds, ``perf/ab.sh``):
    llama3-70b-tp8 (GQA 8) faster at batch 1-128 (batch 8 / 64K 31.8 -> 29.9 us, batch 64 /
    8K 35 -> 31.7 us), within 0.3 % at batch 256; the pair builds lose at some shapes
    (qwen3-8b batch 8-16 / 128K 3-4 %, batch 128 / 128K 5 %; head_dim 64 batch 32 / 128K 3 %),
    so they keep 8 and the host runs the separate ``decode_pair_ring4`` builds where those
    won (:func:`oscar_kernels.cute.plan.use_ring4`). At 1-token pages ``decode_anypage``
    (head_dim 128) was 0.4-2.8 us faster at llama3-70b-tp8 batch 1-8 / 32K and within 0.5 %
    at batch 32-128 / 128K; ``decode_pair_anypage`` was 3 us faster at qwen3-8b batch 1 but
    20 % slower at batch 2 / 128K and keeps 8. The merge-CTA build (qwen3-8b batch 1): its
    warps consume a chunk every ~0.39 us with either depth, and the shallower prologue brings
    the first chunk ~0.5 us sooner (0.5-1.4 us faster per call)."""
    return SHALLOW_STAGES if merge_ctas or (head_dim == 128 and not pair) else DEEP_STAGES


def default_stages(config: Int2DecodeConfig) -> int:
    """The ring depth of a build that does not set ``stages``: :func:`ring_depth`."""
    return ring_depth(config.head_dim, config.pair, config.merge_ctas)


def k_operand_form(config: Int2DecodeConfig) -> str:
    """The u8 K operands of the int8 QK (head_dim 128): ``"masked"`` (``w * 4^(3 - i) &
    0xC0C0C0C0``, 64 x the quarter-i fields), ``"unmasked"`` (``w * 4^(3 - i)``: 16 LOP3 per
    chunk fewer; the other bits are cancelled by the query fragments,
    :func:`oscar_kernels.cute.operands.unmasked_k_query`) or ``"top"`` (quarters 0-2
    unmasked, quarter 3 masked: 12 fewer, and its operand a fresh register instead of the
    loaded word itself, which the MMA's register quad then needs copied); ``"none"`` at
    head_dim 64 (fp16 operands). ``config.k_operands`` overrides it. Measured on an H200 in
    alternating rounds (SASS per chunk from ``perf/sass_report.py``):

    * the pair builds but ``decode_pair_w8``: unmasked (``decode_pair_mc`` 147.5 -> 134.5
      SASS per chunk; qwen3-8b batch 1 0.4-1.1 us faster at 32K-128K, batch 4 1.5-2 %; with
      quarter 3 masked 136.0, the same time);
    * ``decode_pair_w8``: masked (unmasked 137.0 SASS per chunk against 149.5, yet qwen3-8b
      batch 8 and 16 1-2 % slower at 32K-128K, "top" as well, with any rank weights);
    * ``decode`` / ``decode_w8`` / ``decode_anypage`` (GQA > 4): top (177 / 176 / 198.5 ->
      165 / 164 / 186.5 SASS per chunk; unmasked, ``decode_w8`` and ``decode_anypage`` spill
      4 / 6 registers in their main loops): llama3-70b-tp8 batch 32 2.4-3.3 %, batch 128
      2.8-3.6 % faster at 32K-128K, batch 8 0.3-0.8 us."""
    if config.head_dim != QK_S8_HEAD_DIM:
        return "none"
    if config.k_operands is not None:
        return config.k_operands
    if not config.pair:
        return "top"
    wide_pair = config.warps == 8 and not config.merge_ctas and not config.stages
    return "masked" if wide_pair else "unmasked"
