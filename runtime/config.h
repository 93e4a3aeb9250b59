/* config.h — a validated attention config (SPEC §3) as C sees it. Produced only by the
 * generator's validation (gen/config.lua through runtime/gen.c); never filled by hand from
 * untrusted input. */
#ifndef RDA_CONFIG_H
#define RDA_CONFIG_H

#include "../templates/rda_params.h"

#include <stdint.h>

#define RDA_MAX_BRANCHES 16

typedef struct rda_config {
  int heads;     /* H */
  int kv_heads;  /* Hkv, divides H */
  int head_dim;  /* 32, 64, 96, 128 or 256 */
  int dtype;     /* RDA_DTYPE_* */
  int nbranch;   /* k, 1..RDA_MAX_BRANCHES */
  int64_t segments[RDA_MAX_BRANCHES];  /* w_i >= 1 (not yet clamped to N) */
  int64_t dilations[RDA_MAX_BRANCHES]; /* r_i >= 1 */
  int offsets;   /* RDA_OFFSETS_* */
  int causal;    /* 0 or 1 */
  double scale;  /* resolved: 1/sqrt(head_dim) unless the config set it */
} rda_config;

/* The bounds every way into a config checks (gen/config.lua has the same for files):
 * a segment length or dilation rate is 1 .. RDA_CONFIG_MAX_SIZE (2^40, rda.h), and a scale is
 * finite with |scale| * log2(e) a finite fp32 (the kernels' log2-domain constant). Whether 0
 * means "the default" is the caller's rule. */
int rda_config_size_ok(long long v);
int rda_config_scale_fits(double scale);
double rda_config_scale_max(void); /* the bound on |scale| to print (%.8g), rounded down */

/* What a key length other than the query length would be, for the messages that refuse it
 * (rda_forward's checks, rdagen run's): SPEC §1 leaves it undefined. */
#define RDA_CROSS_ATTENTION_NOTE \
  " (keys of another length than the queries would be cross-attention, which is not defined: " \
  "SPEC section 1)"

/* "bf16" / "fp16"; "mod" / "block" / "group". */
const char *rda_dtype_name(int dtype);
const char *rda_offsets_name(int offsets);

/* Offset j of branch i for query head h (SPEC §1), or -1 when the head does not use the
 * branch (the "group" rule). */
int64_t rda_config_offset(const rda_config *c, int branch, int head);

/* 1 when row p (0 <= p < n) of query head `head` lies on some branch's grid (SPEC §1), so its
 * LSE is finite; 0 when no branch covers it (O exactly 0, LSE exactly -inf). */
int rda_config_covers(const rda_config *c, int64_t n, int head, int64_t p);

/* Heads [*head0, *head0 + *count) that use branch i. */
void rda_config_branch_heads(const rda_config *c, int branch, int *head0, int *count);

#endif
