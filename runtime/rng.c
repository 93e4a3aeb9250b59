/* rng.c — splitmix64 and Box-Muller normals (see rng.h). */
#include "rng.h"

#include <math.h>

void rda_rng_seed(rda_rng *g, uint64_t seed) {
  g->state = seed;
  g->has_spare = 0;
  g->spare = 0;
}

uint64_t rda_rng_u64(rda_rng *g) {
  uint64_t z = (g->state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double rda_rng_uniform(rda_rng *g) {
  /* 53 random bits, shifted off zero so log() below is finite. */
  return ((double)(rda_rng_u64(g) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double rda_rng_normal(rda_rng *g) {
  if (g->has_spare) {
    g->has_spare = 0;
    return g->spare;
  }
  const double u = rda_rng_uniform(g), v = rda_rng_uniform(g);
  const double rad = sqrt(-2.0 * log(u)), ang = 6.283185307179586 * v;
  g->spare = rad * sin(ang);
  g->has_spare = 1;
  return rad * cos(ang);
}
