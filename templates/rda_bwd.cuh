/* rda_bwd.cuh — the dilated-attention backward kernels (SPEC §1, "Backward, exact"):
 * prep (Dp = <dO, O> - dLSE, zeroed dq/dk/dv), dkdv (one block per key tile walking query
 * tiles, P recomputed from the combined LSE) and dq (one block per query tile), mma m16n8k16;
 * both also have a wgmma path (Cfg::wgmma, sm_90a: one warpgroup per 64 key rows in dkdv, per
 * 64 query rows in dq). */
#ifndef RDA_BWD_CUH
#define RDA_BWD_CUH

#include "rda_tile.cuh"

namespace rda {
namespace bwd_detail {

using tile::kLog2e;
using tile::LaneOfs;
using tile::load_tile;
using tile::mma;
using tile::neg_inf;
using tile::pack_a;
using tile::pos_inf;
using tile::tile_off;
using tile::widen;

/* The first grid row t >= 0 with x <= t * r (x: position relative to the grid's start),
 * clamped to [0, ng]. */
__device__ __forceinline__ int grid_at(long long x, long long r, int ng) {
  if (x <= 0) return 0;
  const long long t = (x + r - 1) / r;
  return t < ng ? static_cast<int>(t) : ng;
}

/* A branch's grid in one segment for one query head (SPEC §1), and the launch's part of it
 * (rda_params.h): query grid rows [qt0, qt0 + nq) and key grid rows [kt0, kt0 + nk). Tiles and
 * in-kernel row indices count from qt0 (queries) and kt0 (keys); causal masking compares the
 * global grid rows, i.e. key index + kq against query index. */
struct Grid {
  long long a; /* first position of the segment */
  long long j; /* offset of the grid within the segment */
  long long r; /* dilation rate (1 when not dilated) */
  int ng;      /* rows of the grid (0 when j >= segment length) */
  int qt0, nq; /* the launch's query grid rows */
  int kt0, nk; /* the launch's key grid rows */
  int kq;      /* kt0 - qt0 */
};

template <bool Dilated>
__device__ __forceinline__ Grid grid_of(const rda_bwd_params &p, long long seg, int h) {
  Grid g;
  g.a = seg * p.w;
  const long long seg_end = g.a + p.w < p.n ? g.a + p.w : p.n;
  g.r = Dilated ? p.r : 1;
  g.j = tile::grid_offset<Dilated>(p.offset_mode, p.offset_arg, h, g.r);
  g.ng = tile::grid_rows(seg_end - g.a, g.j, g.r);
  const long long base = g.a + g.j;
  g.qt0 = grid_at(p.q_lo - base, g.r, g.ng);
  const int qt1 = grid_at(p.q_hi - base, g.r, g.ng);
  g.kt0 = grid_at(p.kv_lo - base, g.r, g.ng);
  const int kt1 = grid_at(p.kv_hi - base, g.r, g.ng);
  g.nq = qt1 > g.qt0 ? qt1 - g.qt0 : 0;
  g.nk = kt1 > g.kt0 ? kt1 - g.kt0 : 0;
  g.kq = g.kt0 - g.qt0;
  return g;
}

/* Position (global) of grid row t. */
__device__ __forceinline__ long long grid_pos(const Grid &g, int t) {
  return g.a + g.j + static_cast<long long>(t) * g.r;
}

/* s = X Y^T and dp = U W^T over the head dim (KS 16-wide k-steps) for this warp's 16 rows of
 * the X and U tiles (rows 16 warp ..., offsets ao) against NT 8-row column tiles of the Y and W
 * tiles (offsets bo), from zero: S^T and dP^T in dK/dV (X, U = K, V; Y, W = Q, dO), S and dP
 * in dQ (X, U = Q, dO; Y, W = K, V). */
template <int Dtype, int KS, int NT, int CHUNKS>
__device__ __forceinline__ void two_products(const unsigned char *x, const unsigned char *u,
                                             const unsigned char *y, const unsigned char *w,
                                             const LaneOfs<CHUNKS> &ao, const LaneOfs<CHUNKS> &bo,
                                             int warp, float (*s)[4], float (*dp)[4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
  }
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t xa[4], ua[4];
    ldmatrix_x4(xa, x + ao.at(ks, 16 * warp));
    ldmatrix_x4(ua, u + ao.at(ks, 16 * warp));
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t yb[4], wb[4];
      ldmatrix_x4(yb, y + bo.at(ks, 16 * np));
      mma<Dtype>(s[2 * np], xa, yb);
      mma<Dtype>(s[2 * np + 1], xa, yb + 2);
      ldmatrix_x4(wb, w + bo.at(ks, 16 * np));
      mma<Dtype>(dp[2 * np], ua, wb);
      mma<Dtype>(dp[2 * np + 1], ua, wb + 2);
    }
  }
}

/* kv_table twins: element offset of entry y's first key row (the launch's first key grid row of
 * its class) for batch entry b, in the 16-bit K block and the fp32 dK block alike; V and dV
 * follow after the class's whole batch, at the offset plus gridDim.z * sb (rda_params.h). rs is
 * the launch's row pitch. */
template <int D>
__device__ __forceinline__ long long table_row0(const rda_kv_table &t, long long rs, int y,
                                                long long b, long long *sb) {
  const int c = t.cls[y];
  *sb = rs * t.rows[c]; /* elements per batch entry */
  return t.at[c] + b * *sb + static_cast<long long>(t.slot[y]) * D;
}

/* The first key row's K and V of entry blockIdx.y of a kv_table twin launch (table_row0). */
template <int D>
__device__ __forceinline__ void table_kv(const rda_bwd_params &p, long long b, const uint16_t **kg,
                                         const uint16_t **vg) {
  long long sb;
  const long long off = table_row0<D>(p.kvt.kv, p.k_rs, static_cast<int>(blockIdx.y), b, &sb);
  *kg = static_cast<const uint16_t *>(p.k) + off;
  *vg = static_cast<const uint16_t *>(p.v) + off + static_cast<long long>(gridDim.z) * sb;
}

/* log2-domain LSE of a row for P = exp2(s * scale_log2 - lse2): +inf (so P = 0) when the
 * row has no keys at all. */
__device__ __forceinline__ float lse2_of(float lse) {
  return lse == neg_inf() ? pos_inf() : lse * kLog2e;
}

/* ------------------------------------------------------------------ dK / dV */

template <class Cfg>
struct DkdvTraits {
  static constexpr int D = Cfg::head_dim;
  static constexpr int BN = Cfg::block_n; /* key rows per block: 16 per warp */
  static constexpr int BM = Cfg::block_m; /* query rows per step */
  static constexpr int WARPS = Cfg::warps;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int STAGES = Cfg::stages; /* cp.async depth of the Q/dO pipeline */
  static constexpr int DSPLIT = Cfg::dsplit; /* blocks sharing one key tile's head dim */
  static constexpr int DA = D / DSPLIT;      /* dk/dv columns a block accumulates */
  static constexpr int CHUNKS = D / 8;
  static constexpr int ROW_BYTES = 2 * D;
  static constexpr int KV_BYTES = BN * ROW_BYTES;
  static constexpr int QT_BYTES = BM * ROW_BYTES;
  static constexpr int STAT_BYTES = 2 * BM * 4; /* lse2 and Dp of one query tile */
  /* A stage: the Q and dO tiles, then their statistics; on the wgmma path padded to a multiple
   * of 1024 bytes, so that every stage's tiles start on one (128-byte swizzle atoms). */
  static constexpr int STAT_SPAN = Cfg::wgmma ? (STAT_BYTES + 1023) / 1024 * 1024 : STAT_BYTES;
  static constexpr int STAGE_BYTES = 2 * QT_BYTES + STAT_SPAN;
  /* dq_atomic: dQ += dS K in this kernel too, by fp32 atomics (no dq kernel, not deterministic);
   * dS^T of a step is staged in shared memory, and warp w computes rows 16 (w % MT) of the
   * query tile over columns DQC (w / MT) ... of dQ. */
  static constexpr bool ATOMIC = Cfg::dq_atomic;
  static constexpr int DS_CHUNKS = BM / 8;
  static constexpr int DS_BYTES = ATOMIC ? BN * BM * 2 : 0;
  static constexpr int SMEM_BYTES = 2 * KV_BYTES + STAGES * STAGE_BYTES + DS_BYTES;
  static constexpr int NT = BM / 8; /* 8-query column tiles of S^T */
  static constexpr int KS = D / 16;
  static constexpr int DT = DA / 8;
  static constexpr int MT = BM / 16;
  static constexpr int NCG = MT <= WARPS ? WARPS / MT : 1;
  static constexpr int DQC = D / NCG;
  /* wgmma path: a warpgroup (4 warps) per 64 key rows, S^T = K Q^T and dP^T = V dO^T with
   * N = block_m = 64; tiles in 128-byte swizzle atoms (tile::smem_off). */
  static constexpr bool WG = Cfg::wgmma;
  static constexpr int GROUP_KEYS = WG ? 64 : 16; /* key rows skipped or masked together */

  static_assert(D == 32 || D == 64 || D == 96 || D == 128 || D == 256, "unsupported head_dim");
  static_assert(BN == 16 * WARPS, "each warp owns 16 key rows");
  static_assert(!WG || ((D == 64 || D == 128) && BM == 64 && (WARPS == 4 || WARPS == 8) &&
                        DSPLIT == 1 && !ATOMIC),
                "wgmma: head_dim 64 or 128, block_m 64, one or two warpgroups, no dsplit or "
                "dq_atomic (gen/plan.lua check_bwd_space says why)");
  static_assert(BM % 16 == 0 && BM >= 16, "block_m must be a multiple of 16");
  static_assert(STAGES >= 2, "the Q/dO pipeline needs at least 2 stages");
  static_assert(DSPLIT >= 1 && D % (16 * DSPLIT) == 0, "dsplit must split D into 16-col parts");
  static_assert(!ATOMIC || DSPLIT == 1, "dq_atomic needs dsplit = 1 (dQ would be added twice)");
  static_assert(!ATOMIC || (WARPS % MT == 0 && D % (16 * NCG) == 0),
                "dq_atomic: the warps must split the query tile's dQ into 16 x 16k pieces");
};

/* Byte offset of (row, chunk) in the dS^T staging tile (rows of BM/8 16-byte chunks), swizzled
 * so the 8 rows an ldmatrix reads fall into distinct 16-byte bank groups. */
template <int CHUNKS>
__device__ __forceinline__ int ds_off(int row, int chunk) {
  if constexpr (CHUNKS % 4 == 0) {
    return tile_off<CHUNKS>(row, chunk);
  } else {
    static_assert(CHUNKS == 2, "block_m must be 16 or a multiple of 32");
    return row * 32 + (chunk ^ ((row >> 2) & 1)) * 16;
  }
}

/* The lse2 and Dp of stage st: BM floats each, after its Q and dO tiles. */
template <class Cfg>
__device__ __forceinline__ float *dkdv_stat(unsigned char *st) {
  return reinterpret_cast<float *>(st + 2 * DkdvTraits<Cfg>::QT_BYTES);
}
template <class Cfg>
__device__ __forceinline__ const float *dkdv_stat(const unsigned char *st) {
  return reinterpret_cast<const float *>(st + 2 * DkdvTraits<Cfg>::QT_BYTES);
}

/* Issue the loads of query tile `qt` (rows qt * BM ... of the launch's nq query rows) into stage
 * buffer `st`: Q and dO by cp.async, lse2 and Dp by plain loads (visible after the next
 * barrier). */
template <class Cfg>
__device__ __forceinline__ void dkdv_issue(unsigned char *st, const uint16_t *qg,
                                           const uint16_t *dog, long long q_rs, long long do_rs,
                                           const float *lg, const float *dg, long long stat_rs,
                                           int qt, int nq, int tid) {
  using T = DkdvTraits<Cfg>;
  const int t0 = qt * T::BM;
  load_tile<T::CHUNKS, T::BM, T::THREADS, T::WG>(st, qg, q_rs, t0, nq, tid);
  load_tile<T::CHUNKS, T::BM, T::THREADS, T::WG>(st + T::QT_BYTES, dog, do_rs, t0, nq, tid);
  float *stat = dkdv_stat<Cfg>(st);
  for (int i = tid; i < T::BM; i += T::THREADS) {
    const int t = t0 + i;
    float l2 = pos_inf(), dp = 0.f;
    if (t < nq) {
      l2 = lse2_of(lg[t * stat_rs]);
      dp = dg[t * stat_rs];
    }
    stat[i] = l2;
    stat[T::BM + i] = dp;
  }
}

/* P^T from S^T (accumulator layout, this warp's keys kw0 + g and kw0 + g + 8, g = lane / 4),
 * in place: P^T = exp2(s * scale_log2 - lse2), 0 where masked (queries past the range, keys
 * past the range, causal: keys after the query). slse: the query tile's lse2. */
template <class Cfg, bool Mask, int NT>
__device__ __forceinline__ void dkdv_p(float (&s)[NT][4], const float *slse, float sl2, int q0,
                                       int kw0, int nq, int nk, int kq) {
  const int lane = lane_id();
  /* Element e of column tile nt: key kw0 + g + 8 (e / 2), query q0 + 8 nt + 2c + e % 2 (key
   * indices count from kt0, query indices from qt0: key + kq is the key in query index space). */
  const int g = lane >> 2;
  const int c2 = 2 * (lane & 3);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qi = nt * 8 + c2 + (e & 1);
      float pv = ex2(s[nt][e] * sl2 - slse[qi]);
      if constexpr (Mask) {
        const int key = kw0 + g + 8 * (e >> 1);
        const int qry = q0 + qi;
        if (qry >= nq || key >= nk || (Cfg::causal && key + kq > qry)) pv = 0.f;
      }
      s[nt][e] = pv;
    }
  }
}

/* dS^T = P^T (dP^T - Dp) into dp (layouts as dkdv_p). sdp: the query tile's Dp. */
template <int NT>
__device__ __forceinline__ void dkdv_ds(const float (&p)[NT][4], float (&dp)[NT][4],
                                        const float *sdp) {
  const int c2 = 2 * (lane_id() & 3);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[nt][e] = p[nt][e] * (dp[nt][e] - sdp[nt * 8 + c2 + (e & 1)]);
  }
}

/* One query tile for this warp's 16 keys: S^T = K Q^T, dP^T = V dO^T, P^T, dS^T, then
 * dV += P^T dO and dK += dS^T Q over this block's DA columns. */
template <class Cfg, bool Mask>
__device__ __forceinline__ void dkdv_step(const unsigned char *sk, const unsigned char *sv,
                                          const unsigned char *st,
                                          const LaneOfs<Cfg::head_dim / 8> &ao,
                                          const LaneOfs<Cfg::head_dim / 8> &bo, int warp, int part,
                                          float sl2, int q0, int kw0, int nq, int nk, int kq,
                                          float (*dk)[4], float (*dv)[4], unsigned char *sds) {
  using T = DkdvTraits<Cfg>;
  (void)sds;
  const unsigned char *sq = st;
  const unsigned char *sdo = st + T::QT_BYTES;

  float s[T::NT][4], dp[T::NT][4];
  two_products<Cfg::dtype, T::KS, T::NT>(sk, sv, sq, sdo, ao, bo, warp, s, dp);
  const float *stat = dkdv_stat<Cfg>(st);
  dkdv_p<Cfg, Mask>(s, stat, sl2, q0, kw0, nq, nk, kq);
  dkdv_ds(s, dp, stat + T::BM);

  /* dV += P^T dO, dK += dS^T Q: the accumulator layout of S^T is the A fragment. */
#pragma unroll
  for (int kk = 0; kk < T::BM / 16; ++kk) {
    uint32_t pa[4], da[4];
    pack_a<Cfg::dtype>(pa, s[2 * kk], s[2 * kk + 1]);
    pack_a<Cfg::dtype>(da, dp[2 * kk], dp[2 * kk + 1]);
    if constexpr (T::ATOMIC) {
      const int row = 16 * warp + (lane_id() >> 2);
      const int c2 = 2 * (lane_id() & 3);
      *reinterpret_cast<uint32_t *>(sds + ds_off<T::DS_CHUNKS>(row, 2 * kk) + 2 * c2) = da[0];
      *reinterpret_cast<uint32_t *>(sds + ds_off<T::DS_CHUNKS>(row + 8, 2 * kk) + 2 * c2) = da[1];
      *reinterpret_cast<uint32_t *>(sds + ds_off<T::DS_CHUNKS>(row, 2 * kk + 1) + 2 * c2) = da[2];
      *reinterpret_cast<uint32_t *>(sds + ds_off<T::DS_CHUNKS>(row + 8, 2 * kk + 1) + 2 * c2) =
          da[3];
    }
#pragma unroll
    for (int cp = 0; cp < T::DA / 16; ++cp) {
      const int col = part * (T::DA / 16) + cp;
      uint32_t ob[4], qb[4];
      ldmatrix_x4_trans(ob, sdo + ao.at(col, 16 * kk));
      mma<Cfg::dtype>(dv[2 * cp], pa, ob);
      mma<Cfg::dtype>(dv[2 * cp + 1], pa, ob + 2);
      ldmatrix_x4_trans(qb, sq + ao.at(col, 16 * kk));
      mma<Cfg::dtype>(dk[2 * cp], da, qb);
      mma<Cfg::dtype>(dk[2 * cp + 1], da, qb + 2);
    }
  }
}

/* One query tile on the wgmma path for this warpgroup's 64 keys: S^T = K Q^T and
 * dP^T = V dO^T (A = K, V from the group's rows, B = Q, dO: all K-major from shared memory) in
 * two groups, P^T computed while dP^T is still in flight, then dS^T, then dV += P^T dO and
 * dK += dS^T Q in one group (A = P^T, dS^T from registers, B = dO, Q MN-major: the queries are
 * K, the head dim N). sk, sv: the shared addresses of the group's first K and V rows (column
 * block 0); st: the stage. Each product is waited for before its accumulator is touched. */
template <class Cfg, bool Mask>
__device__ __forceinline__ void dkdv_step_wg(uint32_t sk, uint32_t sv, const unsigned char *st,
                                             float sl2, int q0, int kw0, int nq, int nk, int kq,
                                             float (&dk)[DkdvTraits<Cfg>::DT][4],
                                             float (&dv)[DkdvTraits<Cfg>::DT][4]) {
  using T = DkdvTraits<Cfg>;
  /* Opaque addresses keep the descriptors computed at each use, not hoisted out of the query
   * loop as loop invariants (64 bits each, 32 of them for K and V at d = 128) beside dK and dV:
   * at d = 128 ptxas spilled 8 bytes without this, none with it. */
  const uint32_t sq = opaque(smem_addr(st));
  const uint32_t sdo = opaque(smem_addr(st + T::QT_BYTES));
  sk = opaque(sk);
  sv = opaque(sv);
  float s[T::NT][4], dp[T::NT][4];

  wgmma_fence();
  tile::wgmma_kmajor_product<Cfg::dtype, T::BM, T::KS, T::BN, T::BM>(s, sk, sq);
  wgmma_commit();
  tile::wgmma_kmajor_product<Cfg::dtype, T::BM, T::KS, T::BN, T::BM>(dp, sv, sdo);
  wgmma_commit();
  const float *stat = dkdv_stat<Cfg>(st);
  wgmma_wait<1>(); /* S^T */
  wgmma_fence_operands(s);
  dkdv_p<Cfg, Mask>(s, stat, sl2, q0, kw0, nq, nk, kq);
  wgmma_wait<0>(); /* dP^T */
  wgmma_fence_operands(dp);
  dkdv_ds(s, dp, stat + T::BM);

  uint32_t pa[T::BM / 16][4], da[T::BM / 16][4];
  tile::pack_a_rows<Cfg::dtype, T::BM>(pa, s);
  tile::pack_a_rows<Cfg::dtype, T::BM>(da, dp);
  wgmma_fence_operands(pa);
  wgmma_fence_operands(da);
  wgmma_fence_operands(dv);
  wgmma_fence_operands(dk);
  wgmma_fence();
  tile::wgmma_rs_issue<Cfg::dtype, T::D, T::BM>(dv, pa, sdo); /* dV += P^T dO */
  tile::wgmma_rs_issue<Cfg::dtype, T::D, T::BM>(dk, da, sq);  /* dK += dS^T Q */
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(dv);
  wgmma_fence_operands(dk);
  wgmma_fence_operands(pa);
  wgmma_fence_operands(da);
}

/* dq_atomic, a warp with nothing to do this step: its rows of dS^T are 0. */
template <class Cfg>
__device__ __forceinline__ void dkdv_zero_ds(unsigned char *sds, int warp) {
  using T = DkdvTraits<Cfg>;
  const int lane = lane_id();
  for (int i = lane; i < 16 * (T::BM / 2); i += 32) {
    const int row = 16 * warp + i / (T::BM / 2);
    const int col = 2 * (i % (T::BM / 2));
    *reinterpret_cast<uint32_t *>(sds + ds_off<T::DS_CHUNKS>(row, col / 8) + 2 * (col % 8)) = 0u;
  }
}

/* dq_atomic: ao.at(cg * (DQC / 16) + cp, row16), the K offset of chunk pair cp of column group
 * cg. cg is known only at run time, and a run-time index into ao.ofs would put that array in
 * local memory: use the period of the swizzle when the group starts on one, else a select. */
template <class Cfg>
__device__ __forceinline__ int dq_k_off(const LaneOfs<Cfg::head_dim / 8> &ao, int cg, int cp,
                                        int row16) {
  using T = DkdvTraits<Cfg>;
  using L = LaneOfs<Cfg::head_dim / 8>;
  constexpr int GP = T::DQC / 16; /* chunk pairs per column group */
  if constexpr (T::NCG == 1) {
    (void)cg;
    return ao.at(cp, row16);
  } else if constexpr (GP % L::PAIRS == 0) {
    return ao.at(cp, row16) + cg * (GP / L::PAIRS) * L::PERIOD * 16;
  } else {
    const int pair = cg * GP + cp; /* >= 0 */
    const int k = pair % L::PAIRS;
    int v = ao.ofs[0];
#pragma unroll
    for (int i = 1; i < L::PAIRS; ++i)
      if (k == i) v = ao.ofs[i];
    return v + (pair / L::PAIRS) * L::PERIOD * 16 + row16 * (Cfg::head_dim / 8) * 16;
  }
}

/* dq_atomic: dQ[q0 .., :] += scale * dS K over this block's keys, by fp32 atomics. dS^T is in
 * sds (rows = keys, read as the A operand through ldmatrix .trans), K in sk. */
template <class Cfg>
__device__ __forceinline__ void dkdv_dq_atomic(const unsigned char *sds, const unsigned char *sk,
                                               const LaneOfs<Cfg::head_dim / 8> &ao, int warp,
                                               int q0, int nq, float *dqg, long long dq_rs,
                                               float scale) {
  using T = DkdvTraits<Cfg>;
  const int lane = lane_id();
  const int mt = warp % T::MT;
  const int cg = warp / T::MT;
  if (cg >= T::NCG) return;
  const int mi = lane >> 3;
  const int mr = lane & 7;
  float acc[T::DQC / 8][4];
#pragma unroll
  for (int dt = 0; dt < T::DQC / 8; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < T::BN / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4_trans(a,
                      sds + ds_off<T::DS_CHUNKS>(16 * kk + (mi >> 1) * 8 + mr, 2 * mt + (mi & 1)));
#pragma unroll
    for (int cp = 0; cp < T::DQC / 16; ++cp) {
      uint32_t kb[4];
      ldmatrix_x4_trans(kb, sk + dq_k_off<Cfg>(ao, cg, cp, 16 * kk));
      mma<Cfg::dtype>(acc[2 * cp], a, kb);
      mma<Cfg::dtype>(acc[2 * cp + 1], a, kb + 2);
    }
  }
  const int g = lane >> 2;
  const int c2 = 2 * (lane & 3);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = q0 + 16 * mt + g + 8 * hf;
    if (row < nq) {
      float *dst = dqg + row * dq_rs + cg * T::DQC + c2;
#pragma unroll
      for (int dt = 0; dt < T::DQC / 8; ++dt) {
        atomic_add_f32(dst + 8 * dt, scale * acc[dt][2 * hf]);
        atomic_add_f32(dst + 8 * dt + 1, scale * acc[dt][2 * hf + 1]);
      }
    }
  }
}

/* ------------------------------------------------------------------ dQ */

template <class Cfg>
struct DqTraits {
  static constexpr int D = Cfg::head_dim;
  static constexpr int BM = Cfg::block_m; /* query rows per block: 16 per warp */
  static constexpr int BN = Cfg::block_n; /* key rows per step */
  static constexpr int WARPS = Cfg::warps;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int STAGES = Cfg::stages; /* cp.async depth of the K/V pipeline */
  static constexpr int CHUNKS = D / 8;
  static constexpr int ROW_BYTES = 2 * D;
  static constexpr int Q_BYTES = BM * ROW_BYTES;
  static constexpr int KV_BYTES = BN * ROW_BYTES;
  static constexpr int SMEM_BYTES = 2 * Q_BYTES + 2 * STAGES * KV_BYTES;
  static constexpr int NT = BN / 8;
  static constexpr int KS = D / 16;
  static constexpr int DT = D / 8;
  /* wgmma path: a warpgroup (4 warps) per 64 query rows; tiles in 128-byte swizzle atoms
   * (tile::smem_off), which the 1024-byte multiples above keep aligned. */
  static constexpr bool WG = Cfg::wgmma;
  static constexpr int GROUP_ROWS = WG ? 64 : 16; /* query rows skipped or masked together */
  /* Cfg::overlap (wgmma only): dQ += dS K of key tile j-1 runs behind S and dP of tile j, and
   * tile j's dS is computed meanwhile. Tile j-1's K stage is then read until tile j's step
   * ends, so only stages - 2 tiles load ahead, not stages - 1. */
  static constexpr bool OVL = Cfg::overlap;
  static constexpr int AHEAD = OVL ? STAGES - 2 : STAGES - 1; /* K/V tiles loaded ahead */

  static_assert(D == 32 || D == 64 || D == 96 || D == 128 || D == 256, "unsupported head_dim");
  static_assert(BM == 16 * WARPS, "each warp owns 16 query rows");
  static_assert(BN % 16 == 0 && BN >= 16, "block_n must be a multiple of 16");
  static_assert(STAGES >= 2, "the K/V pipeline needs at least 2 stages");
  static_assert(!WG || ((D == 64 || D == 128) && (BN == 64 || BN == 128) && WARPS % 4 == 0),
                "wgmma: head_dim and block_n in {64, 128}, whole warpgroups");
  static_assert(!OVL || (WG && STAGES >= 3), "overlap: a wgmma tile with at least 3 stages");
};

/* P and dS from S and dP (accumulator layout, this warp's rows wrow0 + g and wrow0 + g + 8,
 * g = lane / 4), in place into s: P = exp2(s * scale_log2 - lse2), 0 where masked (keys past
 * the range, causal: keys after the row), dS = P (dP - Dp). Both instruction paths. */
template <class Cfg, bool Mask, int NT>
__device__ __forceinline__ void dq_ds(float (&s)[NT][4], const float (&dp)[NT][4], float sl2,
                                      const float lse2[2], const float dpr[2], int n0, int wrow0,
                                      int nk, int kq) {
  const int lane = lane_id();
  /* Element e of column tile nt: query wrow0 + g + 8 (e / 2), key n0 + 8 nt + 2c + e % 2
   * (queries counted from qt0, keys from kt0; key + kq is in query index space). */
  const int g = lane >> 2;
  const int c2 = 2 * (lane & 3);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hf = e >> 1;
      float pv = ex2(s[nt][e] * sl2 - lse2[hf]);
      if constexpr (Mask) {
        const int key = n0 + nt * 8 + c2 + (e & 1);
        const int row = wrow0 + g + 8 * hf;
        if (key >= nk || (Cfg::causal && key + kq > row)) pv = 0.f;
      }
      s[nt][e] = pv * (dp[nt][e] - dpr[hf]);
    }
  }
}

/* One key tile for this warp's 16 query rows: S = Q K^T, dP = dO V^T, dS, dQ += dS K. */
template <class Cfg, bool Mask>
__device__ __forceinline__ void dq_step(const unsigned char *sq, const unsigned char *sdo,
                                        const unsigned char *sk, const unsigned char *sv,
                                        const LaneOfs<Cfg::head_dim / 8> &ao,
                                        const LaneOfs<Cfg::head_dim / 8> &bo, int warp, float sl2,
                                        const float lse2[2], const float dpr[2], int n0, int wrow0,
                                        int nk, int kq, float (*acc)[4]) {
  using T = DqTraits<Cfg>;
  float s[T::NT][4], dp[T::NT][4];
  two_products<Cfg::dtype, T::KS, T::NT>(sq, sdo, sk, sv, ao, bo, warp, s, dp);
  dq_ds<Cfg, Mask>(s, dp, sl2, lse2, dpr, n0, wrow0, nk, kq);

#pragma unroll
  for (int kk = 0; kk < T::BN / 16; ++kk) {
    uint32_t da[4];
    pack_a<Cfg::dtype>(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
    for (int cp = 0; cp < T::D / 16; ++cp) {
      uint32_t kb[4];
      ldmatrix_x4_trans(kb, sk + ao.at(cp, 16 * kk));
      mma<Cfg::dtype>(acc[2 * cp], da, kb);
      mma<Cfg::dtype>(acc[2 * cp + 1], da, kb + 2);
    }
  }
}

/* One key tile on the wgmma path for this warpgroup's 64 query rows: S = Q K^T and dP = dO V^T
 * (A = Q, dO and B = K, V, all K-major from shared memory), dS as dq_step, then dQ += dS K
 * (A = dS from registers, B = K MN-major: keys are K, the head dim N). sq, sdo: the shared
 * addresses of the group's first Q and dO rows (column block 0); sk, sv: the stage's K and V
 * tiles. Each product is waited for before its accumulator is touched. */
template <class Cfg, bool Mask>
__device__ __forceinline__ void dq_step_wg(uint32_t sq, uint32_t sdo, uint32_t sk, uint32_t sv,
                                           float sl2, const float lse2[2], const float dpr[2],
                                           int n0, int wrow0, int nk, int kq,
                                           float (&acc)[DqTraits<Cfg>::DT][4]) {
  using T = DqTraits<Cfg>;
  float s[T::NT][4], dp[T::NT][4];

  wgmma_fence();
  tile::wgmma_kmajor_product<Cfg::dtype, T::BN, T::KS, T::BM, T::BN>(s, sq, sk);
  tile::wgmma_kmajor_product<Cfg::dtype, T::BN, T::KS, T::BM, T::BN>(dp, sdo, sv);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(s);
  wgmma_fence_operands(dp);

  dq_ds<Cfg, Mask>(s, dp, sl2, lse2, dpr, n0, wrow0, nk, kq);

  tile::wgmma_rs_product<Cfg::dtype, T::D, T::BN>(acc, s, sk); /* dQ += dS K */
}

/* The dQ += dS K product of a warpgroup's previous key tile (wgmma path with overlap): dS
 * packed to the storage dtype, and the shared address of that tile's K stage. */
template <class Cfg>
using PendingDsK = tile::PendingRs<Cfg::block_n>;

/* Completes the pending dQ += dS K, if any: on return acc is final and pd is empty. Every tile
 * of a warpgroup ends in a step or in this, before its K stage is loaded over. */
template <class Cfg>
__device__ __forceinline__ void dq_flush_pending(float (&acc)[DqTraits<Cfg>::DT][4],
                                                 PendingDsK<Cfg> &pd) {
  tile::wgmma_rs_flush<Cfg::dtype, DqTraits<Cfg>::D, Cfg::block_n>(acc, pd);
}

/* One key tile on the wgmma path with overlap: S = Q K^T and dP = dO V^T of this tile, then
 * (Pending) dQ += dS K of the previous one, as two groups; this tile's dS is computed once S
 * and dP have landed, while the dQ product still runs. Then this tile's dS becomes the pending
 * product, packed only after the previous one was waited for (the hardware reads register A
 * operands asynchronously), and nothing is in flight on return. Pending is a template
 * parameter: a branch between issue and wait makes ptxas serialize the kernel's wgmma (C7520). */
template <class Cfg, bool Mask, bool Pending>
__device__ __forceinline__ void dq_step_wg_overlap(uint32_t sq, uint32_t sdo, uint32_t sk,
                                                   uint32_t sv, float sl2, const float lse2[2],
                                                   const float dpr[2], int n0, int wrow0, int nk,
                                                   int kq, float (&acc)[DqTraits<Cfg>::DT][4],
                                                   PendingDsK<Cfg> &pd) {
  using T = DqTraits<Cfg>;
  float s[T::NT][4], dp[T::NT][4];

  wgmma_fence_operands(acc);
  wgmma_fence_operands(pd.a);
  wgmma_fence();
  tile::wgmma_kmajor_product<Cfg::dtype, T::BN, T::KS, T::BM, T::BN>(s, sq, sk);
  tile::wgmma_kmajor_product<Cfg::dtype, T::BN, T::KS, T::BM, T::BN>(dp, sdo, sv);
  wgmma_commit();
  if constexpr (Pending) {
    tile::wgmma_rs_issue<Cfg::dtype, T::D, T::BN>(acc, pd.a, pd.b); /* dQ += dS K, previous */
    wgmma_commit();
    wgmma_wait<1>(); /* S and dP have landed; the dQ product may still run */
  } else {
    wgmma_wait<0>();
  }
  wgmma_fence_operands(s);
  wgmma_fence_operands(dp);

  dq_ds<Cfg, Mask>(s, dp, sl2, lse2, dpr, n0, wrow0, nk, kq);

  if constexpr (Pending) {
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
    wgmma_fence_operands(pd.a);
  }
  tile::pack_a_rows<Cfg::dtype, T::BN>(pd.a, s);
  pd.b = sk;
  pd.live = true;
}

/* dq_step_wg_overlap with Mask and Pending as runtime flags (each combination a complete
 * step). */
template <class Cfg>
__device__ __forceinline__ void dq_step_wg_overlap_any(bool mask, uint32_t sq, uint32_t sdo,
                                                       uint32_t sk, uint32_t sv, float sl2,
                                                       const float lse2[2], const float dpr[2],
                                                       int n0, int wrow0, int nk, int kq,
                                                       float (&acc)[DqTraits<Cfg>::DT][4],
                                                       PendingDsK<Cfg> &pd) {
  if (pd.live) {
    if (mask)
      dq_step_wg_overlap<Cfg, true, true>(sq, sdo, sk, sv, sl2, lse2, dpr, n0, wrow0, nk, kq,
                                          acc, pd);
    else
      dq_step_wg_overlap<Cfg, false, true>(sq, sdo, sk, sv, sl2, lse2, dpr, n0, wrow0, nk, kq,
                                           acc, pd);
  } else {
    if (mask)
      dq_step_wg_overlap<Cfg, true, false>(sq, sdo, sk, sv, sl2, lse2, dpr, n0, wrow0, nk, kq,
                                           acc, pd);
    else
      dq_step_wg_overlap<Cfg, false, false>(sq, sdo, sk, sv, sl2, lse2, dpr, n0, wrow0, nk, kq,
                                            acc, pd);
  }
}

}  // namespace bwd_detail

/* Dp and the zeroed gradients (rda_bwd_prep_params). Grid-stride over rows of 1-D blocks.
 * Cfg: dtype, threads. */
template <class Cfg>
__device__ __forceinline__ void bwd_prep_kernel(const rda_bwd_prep_params &p) {
  using bwd_detail::neg_inf;
  const long long first = tile::first_index<Cfg::threads>();
  const long long step = tile::grid_stride<Cfg::threads>();
  const long long rows = p.batch * p.n * p.heads;
  for (long long i = first; i < rows; i += step) {
    const long long h = i % p.heads;
    const long long rest = i / p.heads;
    const long long n = rest % p.n;
    const long long b = rest / p.n;
    const float lse = p.lse[b * p.lse_sb + h * p.lse_sh + n];
    float acc = 0.f;
    if (lse != neg_inf()) {
      const float *o = p.o + b * p.o_sb + n * p.o_sn + h * p.o_sh;
      const uint16_t *d =
          static_cast<const uint16_t *>(p.dout) + b * p.do_sb + n * p.do_sn + h * p.do_sh;
      for (int c = 0; c < p.head_dim; ++c) acc += bwd_detail::widen<Cfg::dtype>(d[c]) * o[c];
      if (p.dlse != nullptr) acc -= p.dlse[b * p.dlse_sb + h * p.dlse_sh + n];
    }
    p.dp[b * p.dp_sb + h * p.dp_sh + n] = acc;
    float *dq = p.dq + b * p.dq_sb + n * p.dq_sn + h * p.dq_sh;
    for (int c = 0; c < p.head_dim; ++c) dq[c] = 0.f;
  }
  const long long kv_rows = p.batch * p.n * p.kv_heads;
  for (long long i = first; i < kv_rows; i += step) {
    const long long h = i % p.kv_heads;
    const long long rest = i / p.kv_heads;
    const long long n = rest % p.n;
    const long long b = rest / p.n;
    float *dk = p.dk + b * p.dk_sb + n * p.dk_sn + h * p.dk_sh;
    float *dv = p.dv + b * p.dv_sb + n * p.dv_sn + h * p.dv_sh;
    for (int c = 0; c < p.head_dim; ++c) dk[c] = dv[c] = 0.f;
  }
}
/* dK/dV of one branch for one query head per kv head (see rda_params.h for the grid and the
 * row ranges). Each warp owns 16 key rows of the block's key tile (K and V stay in shared
 * memory) and walks the query tiles of the launch's query range that can see them (causal: from
 * the tile holding the first key on), with a cp.async pipeline of `stages` Q/dO tiles. Key
 * tiles count from the launch's first key grid row, query tiles from its first query grid row;
 * rows outside the ranges are neither read nor written. Cfg: head_dim, dtype, causal, dilated,
 * block_n (= 16 * warps keys), block_m (queries per step), warps, stages, dsplit, dq_atomic
 * (also add this block's dQ contribution by fp32 atomics; then no dq launch is needed),
 * kv_table (blockIdx.y an entry of p.kvt: K/V from, dK/dV into, a ring round's class blocks),
 * wgmma (sm_90a warpgroup MMA, one warpgroup per 64 key rows: head_dim 64 or 128, block_m 64,
 * warps 4 or 8, dsplit 1, no dq_atomic; K, V, Q, dO in 128-byte swizzle atoms, skips
 * and masks per warpgroup). Dynamic shared memory: DkdvTraits<Cfg>::SMEM_BYTES = 2 block_n row
 * tiles (K, V) + stages x (2 block_m row tiles + 8 block_m bytes, wgmma: rounded up to 1024)
 * [+ 2 block_n block_m bytes with dq_atomic].
 * q, k, v, dout: 16-byte aligned, strides (and k_rs, v_rs) multiples of 8 elements; lse, dp,
 * dk, dv: no alignment requirement. */
template <class Cfg>
__device__ __forceinline__ void bwd_dkdv_kernel(const rda_bwd_params &p) {
  using T = bwd_detail::DkdvTraits<Cfg>;
  static_assert(Cfg::smem_bytes == T::SMEM_BYTES, "the planner's smem_bytes is not the layout's");
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = lane_id();

  const int part = static_cast<int>(blockIdx.x) % T::DSPLIT;
  const int tile_idx = static_cast<int>(blockIdx.x) / T::DSPLIT;
  const long long seg = tile_idx / p.tiles_per_seg + p.seg0;
  const int ktile = tile_idx % p.tiles_per_seg;
  int kvh, h;
  if constexpr (Cfg::kv_table) {
    /* blockIdx.y is a table entry: its query head, class block and kv slot (rda_params.h). */
    if (p.kvt.kv.cls[blockIdx.y] < 0) return;
    kvh = 0; /* unused: the table names the block */
    (void)kvh;
    h = p.head0 + p.kvt.head[blockIdx.y];
  } else {
    kvh = p.kv_head0 + static_cast<int>(blockIdx.y);
    h = kvh * p.kv_group + p.group_member;
    if (h < p.head0 || h >= p.head0 + p.nheads) return;
  }
  const long long b = blockIdx.z;
  const bwd_detail::Grid gr = bwd_detail::grid_of<Cfg::dilated>(p, seg, h);
  const int k0 = ktile * T::BN; /* the tile's first key, counted from kt0 */
  if (k0 >= gr.nk) return;

  /* Query tiles that see these keys: causal, only those at or after the first key. */
  const int kq0 = k0 + gr.kq; /* the first key in query index space */
  const int qt_first = Cfg::causal ? (kq0 > 0 ? kq0 : 0) / T::BM : 0;
  const int qt_end = (gr.nq + T::BM - 1) / T::BM;
  const int nq = qt_end - qt_first;
  if (nq <= 0) return; /* only with sub-ranges: no query of the launch sees these keys */

  /* Local rows of the first query and the first key of the launch. */
  const long long qpos = bwd_detail::grid_pos(gr, gr.qt0) - p.row_lo;
  const long long kpos = Cfg::kv_table ? 0 : bwd_detail::grid_pos(gr, gr.kt0) - p.kv_row_lo;
  const uint16_t *qg = static_cast<const uint16_t *>(p.q) + b * p.q_sb + h * p.q_sh + qpos * p.q_sn;
  const uint16_t *dog =
      static_cast<const uint16_t *>(p.dout) + b * p.do_sb + h * p.do_sh + qpos * p.do_sn;
  const uint16_t *kg, *vg; /* key grid row kt0 */
  if constexpr (Cfg::kv_table) {
    bwd_detail::table_kv<Cfg::head_dim>(p, b, &kg, &vg);
  } else {
    kg = static_cast<const uint16_t *>(p.k) + b * p.k_sb + kvh * p.k_sh + kpos * p.k_sn;
    vg = static_cast<const uint16_t *>(p.v) + b * p.v_sb + kvh * p.v_sh + kpos * p.v_sn;
  }
  const float *lg = p.lse + b * p.lse_sb + h * p.lse_sh + qpos;
  const float *dg = p.dp + b * p.dp_sb + h * p.dp_sh + qpos;
  const long long q_rs = gr.r * p.q_sn;
  const long long do_rs = gr.r * p.do_sn;

  unsigned char *smem = dynamic_smem();
  unsigned char *sk = smem;
  unsigned char *sv = smem + T::KV_BYTES;
  unsigned char *stages = smem + 2 * T::KV_BYTES;
  unsigned char *sds = stages + T::STAGES * T::STAGE_BYTES; /* dq_atomic only */
  float *dqg = p.dq + b * p.dq_sb + h * p.dq_sh + qpos * p.dq_sn;
  (void)dqg;

  bwd_detail::load_tile<T::CHUNKS, T::BN, T::THREADS, T::WG>(sk, kg, p.k_rs, k0, gr.nk, tid);
  bwd_detail::load_tile<T::CHUNKS, T::BN, T::THREADS, T::WG>(sv, vg, p.v_rs, k0, gr.nk, tid);
#pragma unroll
  for (int s = 0; s < T::STAGES - 1; ++s) {
    if (s < nq)
      bwd_detail::dkdv_issue<Cfg>(stages + s * T::STAGE_BYTES, qg, dog, q_rs, do_rs, lg, dg, gr.r,
                                  qt_first + s, gr.nq, tid);
    cp_async_commit();
  }

  float dk[T::DT][4], dv[T::DT][4];
#pragma unroll
  for (int dt = 0; dt < T::DT; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
  }
  const int mi = lane >> 3;
  const int mr = lane & 7;
  bwd_detail::LaneOfs<T::CHUNKS> ao, bo;
  ao.init((mi & 1) * 8 + mr, mi >> 1); /* A operands, and B operands through .trans */
  bo.init((mi >> 1) * 8 + mr, mi & 1); /* B operands of two n-tiles (non-trans) */
  const int kw0 = k0 + 16 * warp;      /* this warp's first key */
  /* Skips and masks are decided per group of key rows that computes together: a warp (mma.sync)
   * or a warpgroup (wgmma). */
  const int kg0 = k0 + T::GROUP_KEYS * (16 * warp / T::GROUP_KEYS);
  const int kgq = kg0 + gr.kq; /* the same, in query index space */
  const float sl2 = p.scale_log2;

  if constexpr (T::WG) {
    tile::require_atom_alignment(smem);
  }

  for (int it = 0; it < nq; ++it) {
    cp_async_wait<T::STAGES - 2>();
    if constexpr (T::WG) fence_proxy_async_smem(); /* wgmma reads through the async proxy */
    sync_threads(); /* tile `it` landed; every warp is done with the stage refilled below */
    const int nxt = it + T::STAGES - 1;
    if (nxt < nq)
      bwd_detail::dkdv_issue<Cfg>(stages + (nxt % T::STAGES) * T::STAGE_BYTES, qg, dog, q_rs, do_rs,
                                  lg, dg, gr.r, qt_first + nxt, gr.nq, tid);
    cp_async_commit();

    const int q0 = (qt_first + it) * T::BM;
    /* Group-uniform skips: keys past the range end, or (causal) keys after every query. */
    const bool idle = kg0 >= gr.nk || (Cfg::causal && kgq > q0 + T::BM - 1);
    if (!idle) {
      const unsigned char *st = stages + (it % T::STAGES) * T::STAGE_BYTES;
      const bool need_mask = q0 + T::BM > gr.nq || kg0 + T::GROUP_KEYS > gr.nk ||
                             (Cfg::causal && kgq + T::GROUP_KEYS - 1 > q0);
      if constexpr (T::WG) {
        const uint32_t gofs = tile::wgmma_group_offset(warp); /* the group's first key row */
        const uint32_t skg = smem_addr(sk) + gofs, svg = smem_addr(sv) + gofs;
        if (need_mask) {
          bwd_detail::dkdv_step_wg<Cfg, true>(skg, svg, st, sl2, q0, kw0, gr.nq, gr.nk, gr.kq, dk,
                                              dv);
        } else {
          bwd_detail::dkdv_step_wg<Cfg, false>(skg, svg, st, sl2, q0, kw0, gr.nq, gr.nk, gr.kq, dk,
                                               dv);
        }
      } else if (need_mask) {
        bwd_detail::dkdv_step<Cfg, true>(sk, sv, st, ao, bo, warp, part, sl2, q0, kw0, gr.nq, gr.nk,
                                         gr.kq, dk, dv, sds);
      } else {
        bwd_detail::dkdv_step<Cfg, false>(sk, sv, st, ao, bo, warp, part, sl2, q0, kw0, gr.nq,
                                          gr.nk, gr.kq, dk, dv, sds);
      }
    }
    if constexpr (T::ATOMIC) {
      if (idle) bwd_detail::dkdv_zero_ds<Cfg>(sds, warp);
      sync_threads(); /* dS^T of every warp staged */
      bwd_detail::dkdv_dq_atomic<Cfg>(sds, sk, ao, warp, q0, gr.nq, dqg, gr.r * p.dq_sn, p.scale);
    }
  }
  cp_async_wait<0>();

  /* dk += scale * acc, dv += acc: this launch is the only writer of these rows. */
  const int g = lane >> 2;
  const int c2 = 2 * (lane & 3);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = kw0 + g + 8 * hf;
    if (key < gr.nk) {
      float *dkr, *dvr;
      if constexpr (Cfg::kv_table) {
        /* The class's fp32 block: the K block's element offsets (recomputed from the table
         * rather than held through the loop). */
        long long sb;
        const long long off = bwd_detail::table_row0<Cfg::head_dim>(
            p.kvt.kv, p.dk_rs, static_cast<int>(blockIdx.y), b, &sb);
        dkr = p.dk + off + key * p.dk_rs + part * T::DA + c2;
        dvr =
            p.dv + off + static_cast<long long>(gridDim.z) * sb + key * p.dv_rs + part * T::DA + c2;
      } else {
        dkr =
            p.dk + b * p.dk_sb + kvh * p.dk_sh + kpos * p.dk_sn + key * p.dk_rs + part * T::DA + c2;
        dvr =
            p.dv + b * p.dv_sb + kvh * p.dv_sh + kpos * p.dv_sn + key * p.dv_rs + part * T::DA + c2;
      }
#pragma unroll
      for (int dt = 0; dt < T::DT; ++dt) {
        dkr[8 * dt] += p.scale * dk[dt][2 * hf];
        dkr[8 * dt + 1] += p.scale * dk[dt][2 * hf + 1];
        dvr[8 * dt] += dv[dt][2 * hf];
        dvr[8 * dt + 1] += dv[dt][2 * hf + 1];
      }
    }
  }
}

/* dQ of one branch: one block per query tile of the launch's query range, one warp per 16 query
 * rows, walking the key tiles of the key range that the rows see with a cp.async pipeline of
 * `stages` K/V tiles; each dq row is written by one block, so the result is deterministic.
 * Query tiles count from the launch's first query grid row, keys from its first key grid row;
 * rows outside the ranges are neither read nor written. Cfg: head_dim, dtype, causal, dilated,
 * block_m (= 16 * warps), block_n, warps, stages, kv_table (K/V of head head0 + blockIdx.y from
 * a ring round's class blocks through p.kvt, as the forward's twin), wgmma (sm_90a warpgroup
 * MMA, one warpgroup per 64 query rows: head_dim and block_n in {64, 128}, warps a multiple of
 * 4; Q, dO, K, V in 128-byte swizzle atoms, skips and masks per warpgroup), overlap (wgmma:
 * each key tile's dS computed beside the previous tile's dQ product). Dynamic shared memory:
 * DqTraits<Cfg>::SMEM_BYTES = 2 block_m row tiles (Q, dO) + 2 x stages block_n row tiles. */
template <class Cfg>
__device__ __forceinline__ void bwd_dq_kernel(const rda_bwd_params &p) {
  using T = bwd_detail::DqTraits<Cfg>;
  static_assert(Cfg::smem_bytes == T::SMEM_BYTES, "the planner's smem_bytes is not the layout's");
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = lane_id();

  const long long seg = static_cast<int>(blockIdx.x) / p.tiles_per_seg + p.seg0;
  const int tile_in = static_cast<int>(blockIdx.x) % p.tiles_per_seg;
  /* Causal: the last query tiles have the most keys; launch them first. */
  const int tile = Cfg::causal ? p.tiles_per_seg - 1 - tile_in : tile_in;
  const int h = p.head0 + static_cast<int>(blockIdx.y);
  const long long b = blockIdx.z;
  const bwd_detail::Grid gr = bwd_detail::grid_of<Cfg::dilated>(p, seg, h);
  const int t0 = tile * T::BM; /* the tile's first query, counted from qt0 */
  if (t0 >= gr.nq) return;

  /* Causal: keys up to the tile's last query row (key + kq <= row). */
  const int q_end = gr.nq < t0 + T::BM ? gr.nq : t0 + T::BM;
  const int n_end = Cfg::causal ? (gr.nk < q_end - gr.kq ? gr.nk : q_end - gr.kq) : gr.nk;
  const int ntiles = n_end > 0 ? (n_end + T::BN - 1) / T::BN : 0;
  if (ntiles == 0) return; /* only with sub-ranges: these rows see no key of the launch */

  /* Local rows of the first query and the first key of the launch. */
  const long long qpos = bwd_detail::grid_pos(gr, gr.qt0) - p.row_lo;
  const uint16_t *qg = static_cast<const uint16_t *>(p.q) + b * p.q_sb + h * p.q_sh + qpos * p.q_sn;
  const uint16_t *dog =
      static_cast<const uint16_t *>(p.dout) + b * p.do_sb + h * p.do_sh + qpos * p.do_sn;
  const uint16_t *kg, *vg; /* key grid row kt0 */
  if constexpr (Cfg::kv_table) {
    if (p.kvt.kv.cls[blockIdx.y] < 0) return; /* a head without keys in this launch */
    bwd_detail::table_kv<Cfg::head_dim>(p, b, &kg, &vg);
  } else {
    const int kvh = h / p.kv_group;
    const long long kpos = bwd_detail::grid_pos(gr, gr.kt0) - p.kv_row_lo;
    kg = static_cast<const uint16_t *>(p.k) + b * p.k_sb + kvh * p.k_sh + kpos * p.k_sn;
    vg = static_cast<const uint16_t *>(p.v) + b * p.v_sb + kvh * p.v_sh + kpos * p.v_sn;
  }

  unsigned char *smem = dynamic_smem();
  unsigned char *sq = smem;
  unsigned char *sdo = smem + T::Q_BYTES;
  unsigned char *sk = smem + 2 * T::Q_BYTES;
  unsigned char *sv = sk + T::STAGES * T::KV_BYTES;

  const long long q_rs = gr.r * p.q_sn;
  const long long do_rs = gr.r * p.do_sn;
  bwd_detail::load_tile<T::CHUNKS, T::BM, T::THREADS, T::WG>(sq, qg, q_rs, t0, gr.nq, tid);
  bwd_detail::load_tile<T::CHUNKS, T::BM, T::THREADS, T::WG>(sdo, dog, do_rs, t0, gr.nq, tid);
#pragma unroll
  for (int s = 0; s < T::AHEAD; ++s) {
    if (s < ntiles) {
      bwd_detail::load_tile<T::CHUNKS, T::BN, T::THREADS, T::WG>(sk + s * T::KV_BYTES, kg, p.k_rs,
                                                                 s * T::BN, gr.nk, tid);
      bwd_detail::load_tile<T::CHUNKS, T::BN, T::THREADS, T::WG>(sv + s * T::KV_BYTES, vg, p.v_rs,
                                                                 s * T::BN, gr.nk, tid);
    }
    cp_async_commit();
  }

  /* This lane's two rows: log2-domain LSE and Dp. */
  const int g = lane >> 2;
  const int c2 = 2 * (lane & 3);
  const int wrow0 = t0 + 16 * warp;
  float lse2[2], dpr[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = wrow0 + g + 8 * hf;
    lse2[hf] = bwd_detail::pos_inf();
    dpr[hf] = 0.f;
    if (row < gr.nq) {
      const long long pos = qpos + static_cast<long long>(row) * gr.r;
      lse2[hf] = bwd_detail::lse2_of(p.lse[b * p.lse_sb + h * p.lse_sh + pos]);
      dpr[hf] = p.dp[b * p.dp_sb + h * p.dp_sh + pos];
    }
  }

  float acc[T::DT][4];
#pragma unroll
  for (int dt = 0; dt < T::DT; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;
  const int mi = lane >> 3;
  const int mr = lane & 7;
  bwd_detail::LaneOfs<T::CHUNKS> ao, bo;
  ao.init((mi & 1) * 8 + mr, mi >> 1);
  bo.init((mi >> 1) * 8 + mr, mi & 1);
  const float sl2 = p.scale_log2;
  /* Skips and masks are decided per group of rows that computes together: a warp (mma.sync)
   * or a warpgroup (wgmma). */
  const int grow0 = t0 + T::GROUP_ROWS * (16 * warp / T::GROUP_ROWS);

  if constexpr (T::WG) {
    tile::require_atom_alignment(smem);
  }
  bwd_detail::PendingDsK<Cfg> pd = {}; /* overlap: the warpgroup's dQ += dS K not yet issued */

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<T::AHEAD - 1>();
    if constexpr (T::WG) fence_proxy_async_smem(); /* wgmma reads through the async proxy */
    sync_threads();
    const int nxt = it + T::AHEAD;
    if (nxt < ntiles) {
      const int st = nxt % T::STAGES;
      bwd_detail::load_tile<T::CHUNKS, T::BN, T::THREADS, T::WG>(sk + st * T::KV_BYTES, kg, p.k_rs,
                                                                 nxt * T::BN, gr.nk, tid);
      bwd_detail::load_tile<T::CHUNKS, T::BN, T::THREADS, T::WG>(sv + st * T::KV_BYTES, vg, p.v_rs,
                                                                 nxt * T::BN, gr.nk, tid);
    }
    cp_async_commit();

    const int n0 = it * T::BN;
    /* Group-uniform skips: rows all past the range end, or (causal) keys all in the future. */
    if (grow0 >= gr.nq) continue;
    if (Cfg::causal && n0 + gr.kq > grow0 + T::GROUP_ROWS - 1) {
      /* So are all later tiles: finish the last one's dQ product before its stage is reused. */
      if constexpr (T::OVL) bwd_detail::dq_flush_pending<Cfg>(acc, pd);
      continue;
    }
    const int st = it % T::STAGES;
    const bool need_mask = n0 + T::BN > gr.nk || (Cfg::causal && n0 + gr.kq + T::BN - 1 > grow0);
    if constexpr (T::OVL) {
      const uint32_t gofs = tile::wgmma_group_offset(warp); /* the group's first row */
      bwd_detail::dq_step_wg_overlap_any<Cfg>(
          need_mask, smem_addr(sq) + gofs, smem_addr(sdo) + gofs, smem_addr(sk + st * T::KV_BYTES),
          smem_addr(sv + st * T::KV_BYTES), sl2, lse2, dpr, n0, wrow0, gr.nk, gr.kq, acc, pd);
    } else if constexpr (T::WG) {
      const uint32_t gofs = tile::wgmma_group_offset(warp); /* the group's first row */
      const uint32_t sqg = smem_addr(sq) + gofs, sdog = smem_addr(sdo) + gofs;
      const uint32_t skt = smem_addr(sk + st * T::KV_BYTES);
      const uint32_t svt = smem_addr(sv + st * T::KV_BYTES);
      if (need_mask) {
        bwd_detail::dq_step_wg<Cfg, true>(sqg, sdog, skt, svt, sl2, lse2, dpr, n0, wrow0, gr.nk,
                                          gr.kq, acc);
      } else {
        bwd_detail::dq_step_wg<Cfg, false>(sqg, sdog, skt, svt, sl2, lse2, dpr, n0, wrow0, gr.nk,
                                           gr.kq, acc);
      }
    } else if (need_mask) {
      bwd_detail::dq_step<Cfg, true>(sq, sdo, sk + st * T::KV_BYTES, sv + st * T::KV_BYTES, ao, bo,
                                     warp, sl2, lse2, dpr, n0, wrow0, gr.nk, gr.kq, acc);
    } else {
      bwd_detail::dq_step<Cfg, false>(sq, sdo, sk + st * T::KV_BYTES, sv + st * T::KV_BYTES, ao, bo,
                                      warp, sl2, lse2, dpr, n0, wrow0, gr.nk, gr.kq, acc);
    }
  }
  if constexpr (T::OVL) bwd_detail::dq_flush_pending<Cfg>(acc, pd);
  cp_async_wait<0>();

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = wrow0 + g + 8 * hf;
    if (row < gr.nq) {
      const long long pos = qpos + static_cast<long long>(row) * gr.r;
      float *dqr = p.dq + b * p.dq_sb + h * p.dq_sh + pos * p.dq_sn + c2;
#pragma unroll
      for (int dt = 0; dt < T::DT; ++dt) {
        dqr[8 * dt] += p.scale * acc[dt][2 * hf];
        dqr[8 * dt + 1] += p.scale * acc[dt][2 * hf + 1];
      }
    }
  }
}

}  // namespace rda

#endif
