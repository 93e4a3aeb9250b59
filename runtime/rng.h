/* rng.h — a small seeded generator for test and demo inputs: splitmix64 with normal(0, 1)
 * draws by Box-Muller. Deterministic for a seed, independent of the C library. */
#ifndef RDA_RNG_H
#define RDA_RNG_H

#include <stdint.h>

typedef struct rda_rng {
  uint64_t state;
  int has_spare;
  double spare;
} rda_rng;

void rda_rng_seed(rda_rng *g, uint64_t seed);
uint64_t rda_rng_u64(rda_rng *g);
double rda_rng_uniform(rda_rng *g); /* in (0, 1) */
double rda_rng_normal(rda_rng *g);  /* normal(0, 1) */

#endif
