/* config.c — the parts of SPEC §1 that depend on the config alone: offset rules and which
 * heads a branch serves. Shared by the planner's C side, the reference and the launcher. */
#include "config.h"

#include <float.h>
#include <math.h>

#include "rda.h"

static const double kLog2e = 1.4426950408889634;

int rda_config_size_ok(long long v) { return v >= 1 && v <= RDA_CONFIG_MAX_SIZE; }

int rda_config_scale_fits(double scale) { return isfinite(scale) && fabs(scale) * kLog2e <= FLT_MAX; }

/* FLT_MAX / log2(e) rounded down to 8 significant digits (2.3586574e38): a bound a message may
 * print with %.8g and that every value it lets through really passes. */
double rda_config_scale_max(void) {
  const double exact = FLT_MAX / kLog2e;
  const double unit = pow(10.0, floor(log10(exact)) - 7);
  return floor(exact / unit) * unit;
}

const char *rda_dtype_name(int dtype) { return dtype == RDA_DTYPE_FP16 ? "fp16" : "bf16"; }

const char *rda_offsets_name(int offsets) {
  switch (offsets) {
    case RDA_OFFSETS_BLOCK: return "block";
    case RDA_OFFSETS_GROUP: return "group";
    default: return "mod";
  }
}

void rda_config_branch_heads(const rda_config *c, int branch, int *head0, int *count) {
  if (c->offsets != RDA_OFFSETS_GROUP) {
    *head0 = 0;
    *count = c->heads;
    return;
  }
  /* k contiguous groups; the first H mod k groups hold one head more. */
  const int k = c->nbranch, base = c->heads / k, extra = c->heads % k;
  *head0 = branch * base + (branch < extra ? branch : extra);
  *count = base + (branch < extra ? 1 : 0);
}

int64_t rda_config_offset(const rda_config *c, int branch, int head) {
  const int64_t r = c->dilations[branch];
  switch (c->offsets) {
    case RDA_OFFSETS_BLOCK: {
      const int64_t per = c->heads / r + (c->heads % r != 0); /* ceil(H / r), for any r */
      return head / per;
    }
    case RDA_OFFSETS_GROUP: {
      int h0, n;
      rda_config_branch_heads(c, branch, &h0, &n);
      if (head < h0 || head >= h0 + n) return -1;
      return branch % r;
    }
    default: return head % r;
  }
}

int rda_config_covers(const rda_config *c, int64_t n, int head, int64_t p) {
  for (int i = 0; i < c->nbranch; i++) {
    const int64_t j = rda_config_offset(c, i, head);
    const int64_t w = c->segments[i] < n ? c->segments[i] : n;
    const int64_t local = p % w; /* p's place in its segment [a, b), which holds it */
    if (j >= 0 && local >= j && (local - j) % c->dilations[i] == 0) return 1;
  }
  return 0;
}
