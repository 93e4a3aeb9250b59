/* forward.c — a host program using librda's public API: one plan, one forward call, and a
 * check of the result against a small float64 reference of its own. Runs on the CPU emulator
 * device (host pointers); on a GPU the same calls take device pointers and a CUstream. */
#include <math.h>
#include <rda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, N = 40, H = 4, HKV = 2, D = 32, K = 2 };
static const long long kSeg[K] = {16, 32}, kDil[K] = {1, 2};

/* ---- inputs: normal(0, 1) draws rounded to bf16 ---- */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}
static double normal(void) {
  return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
}
static uint16_t to_bf16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static double from_bf16(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* ---- float64 reference of SPEC §1, offsets "mod", causal ---- */
static void reference(const double *q, const double *k, const double *v, double *o, double *lse) {
  const double scale = 1.0 / sqrt((double)D);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int p = 0; p < N; ++p) {
        double lse_i[K], o_i[K][D];
        for (int i = 0; i < K; ++i) {
          const long long w = kSeg[i] < N ? kSeg[i] : N, r = kDil[i], j = h % r;
          const long long a = p / w * w;
          lse_i[i] = -INFINITY;
          memset(o_i[i], 0, sizeof o_i[i]);
          if (p < a + j || (p - a - j) % r != 0) continue; /* p is not on this branch's grid */
          const double *qp = q + ((b * N + p) * H + h) * D;
          double mx = -INFINITY, sum = 0, s[N];
          for (long long t = a + j; t <= p; t += r) { /* causal: keys up to p */
            const double *kt = k + ((b * N + t) * HKV + h / (H / HKV)) * D;
            double dot = 0;
            for (int d = 0; d < D; ++d) dot += qp[d] * kt[d];
            s[t] = scale * dot;
            if (s[t] > mx) mx = s[t];
          }
          for (long long t = a + j; t <= p; t += r) sum += exp(s[t] - mx);
          lse_i[i] = mx + log(sum);
          for (long long t = a + j; t <= p; t += r) {
            const double *vt = v + ((b * N + t) * HKV + h / (H / HKV)) * D;
            for (int d = 0; d < D; ++d) o_i[i][d] += exp(s[t] - lse_i[i]) * vt[d];
          }
        }
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < K; ++i) mx = lse_i[i] > mx ? lse_i[i] : mx;
        for (int i = 0; i < K; ++i) sum += mx == -INFINITY ? 0 : exp(lse_i[i] - mx);
        const double l = mx == -INFINITY ? -INFINITY : mx + log(sum);
        lse[(b * H + h) * N + p] = l;
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int i = 0; i < K; ++i)
            if (lse_i[i] != -INFINITY) acc += exp(lse_i[i] - l) * o_i[i][d];
          o[((b * N + p) * H + h) * D + d] = acc;
        }
      }
}

#define CHECK(call)                                                                                \
  do {                                                                                             \
    rda_status s_ = (call);                                                                        \
    if (s_ != RDA_OK) {                                                                            \
      fprintf(stderr, "forward: %s: %s: %s\n", #call, rda_status_string(s_), rda_last_error(ctx)); \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

int main(void) {
  if (rda_version() / 10000 != RDA_VERSION_MAJOR) {
    fprintf(stderr, "forward: header %s but library %u\n", RDA_VERSION_STRING, rda_version());
    return 1;
  }
  static uint16_t qb[B * N * H * D], kb[B * N * HKV * D], vb[B * N * HKV * D], ob[B * N * H * D];
  static double q[B * N * H * D], k[B * N * HKV * D], v[B * N * HKV * D];
  static double o_ref[B * N * H * D], lse_ref[B * H * N];
  static float lse[B * H * N];
  for (int i = 0; i < B * N * H * D; ++i) q[i] = from_bf16(qb[i] = to_bf16((float)normal()));
  for (int i = 0; i < B * N * HKV * D; ++i) k[i] = from_bf16(kb[i] = to_bf16((float)normal()));
  for (int i = 0; i < B * N * HKV * D; ++i) v[i] = from_bf16(vb[i] = to_bf16((float)normal()));
  for (int i = 0; i < B * N * H * D; ++i) ob[i] = 0x7fc0; /* NaN: unwritten outputs show */
  for (int i = 0; i < B * H * N; ++i) lse[i] = NAN;

  rda_ctx *ctx = NULL;
  CHECK(rda_ctx_create_emulator(&ctx));
  rda_attn_config cfg = RDA_CONFIG_INIT;
  cfg.heads = H, cfg.kv_heads = HKV, cfg.head_dim = D, cfg.dtype = RDA_BF16, cfg.causal = 1;
  cfg.nbranch = K;
  for (int i = 0; i < K; ++i) cfg.segments[i] = kSeg[i], cfg.dilations[i] = kDil[i];
  rda_plan *plan = NULL;
  CHECK(rda_plan_create(&plan, ctx, &cfg, RDA_PLAN_FORWARD));

  const long long qs[4] = {B, N, H, D}, kvs[4] = {B, N, HKV, D}, ls[3] = {B, H, N};
  rda_tensor tq, tk, tv, to, tl;
  CHECK(rda_tensor_contiguous(&tq, qb, RDA_BF16, 4, qs));
  CHECK(rda_tensor_contiguous(&tk, kb, RDA_BF16, 4, kvs));
  CHECK(rda_tensor_contiguous(&tv, vb, RDA_BF16, 4, kvs));
  CHECK(rda_tensor_contiguous(&to, ob, RDA_BF16, 4, qs));
  CHECK(rda_tensor_contiguous(&tl, lse, RDA_FP32, 3, ls));
  size_t ws_bytes = 0;
  CHECK(rda_plan_workspace_size(plan, B, N, &ws_bytes));
  void *ws = aligned_alloc(256, (ws_bytes + 255) / 256 * 256); /* cudaMalloc on a GPU */
  if (ws == NULL) return 1;
  CHECK(rda_forward(plan, &tq, &tk, &tv, &to, &tl, ws, ws_bytes, NULL /* stream */));
  free(ws);
  rda_plan_destroy(plan);
  rda_ctx_destroy(ctx);

  reference(q, k, v, o_ref, lse_ref);
  double num = 0, den = 0, lse_err = 0;
  for (int i = 0; i < B * N * H * D; ++i) {
    const double e = from_bf16(ob[i]) - o_ref[i];
    num += e * e, den += o_ref[i] * o_ref[i];
  }
  for (int i = 0; i < B * H * N; ++i) {
    if (lse_ref[i] == -INFINITY) {
      if (lse[i] != -INFINITY) lse_err = INFINITY;
      continue;
    }
    const double e = fabs(lse[i] - lse_ref[i]);
    lse_err = e > lse_err || isnan(e) ? e : lse_err;
  }
  const double rel = sqrt(num / den);
  const int ok = rel <= 1e-2 && lse_err <= 2e-2; /* SPEC §5, bf16 */
  printf("forward: %s: rel_l2(O) = %.3g (<= 1e-2), max|LSE - ref| = %.3g (<= 2e-2), librda %u\n",
         ok ? "ok" : "MISMATCH", rel, lse_err, rda_version());
  return ok ? 0 : 1;
}
