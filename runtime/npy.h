/* npy.h — NumPy .npy files (format versions 1-3): read little-endian C-order float16/32/64
 * arrays as float64, write float32. Every failure names the file and what was expected. */
#ifndef RDA_NPY_H
#define RDA_NPY_H

#include "err.h"

#include <stddef.h>

#define RDA_NPY_MAX_DIMS 8

typedef struct rda_npy {
  int ndim;
  long long shape[RDA_NPY_MAX_DIMS];
  size_t count;  /* product of the shape */
  double *data;  /* malloc'd, count values */
} rda_npy;

rda_status rda_npy_read(const char *path, rda_npy *out, rda_err *err);
void rda_npy_free(rda_npy *a); /* accepts NULL and zeroed arrays */

/* Write float32 data atomically: a temporary file in the same folder, fsync, rename; on any
 * failure no file (and no temporary) is left behind. A path that is a symbolic link writes the
 * file it leads to (runtime/out_files.h), keeping the link. */
rda_status rda_npy_write_f32(const char *path, int ndim, const long long *shape,
                             const float *data, rda_err *err);

/* The .npy bytes of float32 data written to fd at its current offset (nothing else: no sync,
 * no close); errors name `name`. For a caller that makes its own temporary
 * (runtime/out_files.h). */
rda_status rda_npy_write_f32_fd(int fd, const char *name, int ndim, const long long *shape,
                                const float *data, rda_err *err);

#endif
