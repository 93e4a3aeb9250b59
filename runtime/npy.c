/* npy.c — NumPy .npy files: read format versions 1-3 holding little-endian C-order float16,
 * float32 or float64 into float64 (float16 decoded exactly), and write float32 files atomically.
 * The header is parsed as the Python dict literal it is; every rejection names the file. */
#include "npy.h"

#include "out_files.h"
#include "reference.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RDA_NPY_MAX_HEADER (1u << 20) /* far beyond any real header (numpy caps at 10000) */

static const char rda_npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
static const char rda_npy_expected[] =
    "expected a little-endian C-order float16, float32 or float64 array ('<f2', '<f4', '<f8')";

void rda_npy_free(rda_npy *a) {
  if (a == NULL) return;
  free(a->data);
  memset(a, 0, sizeof *a);
}

/* --- header parsing --------------------------------------------------------------------------- */

typedef struct rda_npy_parser {
  const char *s, *end;
  const char *path;
  rda_err *err;
} rda_npy_parser;

static rda_status rda_npy_bad_header(rda_npy_parser *p, const char *what) {
  return rda_err_set(p->err, RDA_ERR_IO, "%s: malformed .npy header: %s; %s", p->path, what,
                     rda_npy_expected);
}

static void rda_npy_skip_ws(rda_npy_parser *p) {
  while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) p->s++;
}

/* A quoted string without escapes into buf. */
static rda_status rda_npy_string(rda_npy_parser *p, char *buf, size_t cap) {
  if (p->s >= p->end || (*p->s != '\'' && *p->s != '"'))
    return rda_npy_bad_header(p, "expected a quoted string");
  const char quote = *p->s++;
  size_t n = 0;
  while (p->s < p->end && *p->s != quote) {
    if (*p->s == '\\' || *p->s == '\n' || *p->s == '\0')
      return rda_npy_bad_header(p, "unsupported string");
    if (n + 1 < cap) buf[n++] = *p->s;
    p->s++;
  }
  if (p->s >= p->end) return rda_npy_bad_header(p, "unterminated string");
  p->s++;
  buf[n] = '\0';
  return RDA_OK;
}

static int rda_npy_word(rda_npy_parser *p, const char *w) {
  const size_t n = strlen(w);
  if ((size_t)(p->end - p->s) < n || memcmp(p->s, w, n) != 0) return 0;
  const char *after = p->s + n;
  if (after < p->end && ((*after >= 'a' && *after <= 'z') || (*after >= 'A' && *after <= 'Z') ||
                         (*after >= '0' && *after <= '9') || *after == '_'))
    return 0;
  p->s = after;
  return 1;
}

static rda_status rda_npy_bool(rda_npy_parser *p, int *out) {
  if (rda_npy_word(p, "True"))
    *out = 1;
  else if (rda_npy_word(p, "False"))
    *out = 0;
  else
    return rda_npy_bad_header(p, "'fortran_order' must be True or False");
  return RDA_OK;
}

/* A tuple of non-negative integers, e.g. (), (5,), (2, 3). */
static rda_status rda_npy_shape(rda_npy_parser *p, rda_npy *a) {
  if (p->s >= p->end || *p->s != '(')
    return rda_npy_bad_header(p, "'shape' must be a tuple of integers");
  p->s++;
  a->ndim = 0;
  for (;;) {
    rda_npy_skip_ws(p);
    if (p->s < p->end && *p->s == ')') {
      p->s++;
      return RDA_OK;
    }
    if (p->s >= p->end || *p->s < '0' || *p->s > '9')
      return rda_npy_bad_header(p, "'shape' must be a tuple of non-negative integers");
    /* Python (whose literal the header is) reads 0, 00 but not 08: no leading zeros. */
    const char *first = p->s;
    long long v = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
      const int digit = *p->s - '0';
      if (v > (LLONG_MAX - digit) / 10)
        return rda_err_set(p->err, RDA_ERR_IO,
                           "%s: absurd shape in the .npy header (a dimension "
                           "overflows 64 bits); %s",
                           p->path, rda_npy_expected);
      v = v * 10 + digit;
      p->s++;
    }
    if (*first == '0' && v != 0)
      return rda_npy_bad_header(p, "a dimension with a leading zero");
    if (p->s < p->end && (*p->s == 'L' || *p->s == 'l')) p->s++; /* Python 2 longs */
    if (a->ndim >= RDA_NPY_MAX_DIMS)
      return rda_err_set(p->err, RDA_ERR_IO, "%s: more than %d dimensions in the .npy header; %s",
                         p->path, RDA_NPY_MAX_DIMS, rda_npy_expected);
    a->shape[a->ndim++] = v;
    rda_npy_skip_ws(p);
    if (p->s < p->end && *p->s == ',') {
      p->s++;
      continue;
    }
    if (p->s < p->end && *p->s == ')') {
      p->s++;
      return RDA_OK;
    }
    return rda_npy_bad_header(p, "'shape' must be a tuple of integers");
  }
}

static rda_status rda_npy_descr(rda_npy_parser *p, const char *descr, int *itemsize) {
  if (strcmp(descr, "<f2") == 0)
    *itemsize = 2;
  else if (strcmp(descr, "<f4") == 0)
    *itemsize = 4;
  else if (strcmp(descr, "<f8") == 0)
    *itemsize = 8;
  else {
    const char *why = "an unsupported dtype";
    if (descr[0] == '>')
      why = "a big-endian dtype";
    else if (descr[0] == '|' && descr[1] == 'f')
      why = "a float dtype without a byte order";
    else if (descr[0] != '\0' && (descr[1] == 'i' || descr[1] == 'u' || descr[1] == 'b'))
      why = "an integer or boolean dtype";
    else if (descr[0] != '\0' && descr[1] == 'c')
      why = "a complex dtype";
    return rda_err_set(p->err, RDA_ERR_IO, "%s: dtype '%s' is %s; %s", p->path, descr, why,
                       rda_npy_expected);
  }
  return RDA_OK;
}

/* Parse the header dict into a (shape, count) and the item size. */
static rda_status rda_npy_parse_header(const char *path, const char *h, size_t len, rda_npy *a,
                                       int *itemsize, rda_err *err) {
  rda_npy_parser p = {h, h + len, path, err};
  int seen_descr = 0, seen_fortran = 0, seen_shape = 0, fortran = 0;
  char descr[64] = "";
  rda_npy_skip_ws(&p);
  if (p.s >= p.end || *p.s != '{') return rda_npy_bad_header(&p, "it is not a dict");
  p.s++;
  for (;;) {
    rda_npy_skip_ws(&p);
    if (p.s < p.end && *p.s == '}') break;
    char key[64];
    RDA_TRY(rda_npy_string(&p, key, sizeof key));
    rda_npy_skip_ws(&p);
    if (p.s >= p.end || *p.s != ':') return rda_npy_bad_header(&p, "expected ':' after a key");
    p.s++;
    rda_npy_skip_ws(&p);
    int *seen;
    if (strcmp(key, "descr") == 0) {
      seen = &seen_descr;
      if (p.s < p.end && *p.s == '[')
        return rda_err_set(err, RDA_ERR_IO, "%s: a structured dtype; %s", path, rda_npy_expected);
      RDA_TRY(rda_npy_string(&p, descr, sizeof descr));
    } else if (strcmp(key, "fortran_order") == 0) {
      seen = &seen_fortran;
      RDA_TRY(rda_npy_bool(&p, &fortran));
    } else if (strcmp(key, "shape") == 0) {
      seen = &seen_shape;
      RDA_TRY(rda_npy_shape(&p, a));
    } else {
      return rda_err_set(err, RDA_ERR_IO,
                         "%s: malformed .npy header: unexpected key '%s' "
                         "(expected 'descr', 'fortran_order', 'shape')",
                         path, key);
    }
    if (*seen)
      return rda_err_set(err, RDA_ERR_IO, "%s: malformed .npy header: key '%s' appears twice", path,
                         key);
    *seen = 1;
    rda_npy_skip_ws(&p);
    if (p.s < p.end && *p.s == ',') {
      p.s++;
      continue;
    }
    if (p.s < p.end && *p.s == '}') break;
    return rda_npy_bad_header(&p, "expected ',' or '}' after a value");
  }
  p.s++; /* '}' */
  rda_npy_skip_ws(&p);
  if (p.s != p.end) return rda_npy_bad_header(&p, "text after the dict");
  if (!seen_descr || !seen_fortran || !seen_shape)
    return rda_err_set(err, RDA_ERR_IO, "%s: malformed .npy header: missing key '%s'", path,
                       !seen_descr     ? "descr"
                       : !seen_fortran ? "fortran_order"
                                       : "shape");
  RDA_TRY(rda_npy_descr(&p, descr, itemsize));
  if (fortran)
    return rda_err_set(err, RDA_ERR_IO, "%s: the array is in Fortran order; %s", path,
                       rda_npy_expected);
  size_t count = 1;
  for (int i = 0; i < a->ndim; i++) {
    const unsigned long long d = (unsigned long long)a->shape[i];
    if (d != 0 && count > (SIZE_MAX / 8) / d)
      return rda_err_set(err, RDA_ERR_IO,
                         "%s: absurd shape in the .npy header (the element "
                         "count overflows); %s",
                         path, rda_npy_expected);
    count *= (size_t)d;
  }
  a->count = count;
  return RDA_OK;
}

/* --- reading ---------------------------------------------------------------------------------- */

static double rda_npy_decode(const unsigned char *b, int itemsize) {
  if (itemsize == 2) {
    const unsigned short bits = (unsigned short)(b[0] | (b[1] << 8));
    return rda_from_dtype_bits(bits, RDA_DTYPE_FP16);
  }
  if (itemsize == 4) {
    const uint32_t u =
        (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
  }
  uint64_t u = 0;
  for (int i = 7; i >= 0; i--) u = (u << 8) | b[i];
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

/* Values a pipe's buffer starts with (8 MiB of doubles). */
#define RDA_NPY_PIPE_CHUNK ((size_t)1 << 20)

static rda_status rda_npy_read_file(FILE *f, const char *path, rda_npy *out, rda_err *err) {
  unsigned char pre[12];
  const size_t got = fread(pre, 1, 10, f);
  if (got < 8 || memcmp(pre, rda_npy_magic, 6) != 0)
    return rda_err_set(err, RDA_ERR_IO, "%s: not a .npy file (no \\x93NUMPY magic); %s", path,
                       rda_npy_expected);
  const int major = pre[6], minor = pre[7];
  if (major < 1 || major > 3 || minor != 0)
    return rda_err_set(err, RDA_ERR_IO,
                       "%s: .npy format version %d.%d is not supported "
                       "(expected 1.0, 2.0 or 3.0)",
                       path, major, minor);
  size_t hlen;
  if (got < 10) return rda_err_set(err, RDA_ERR_IO, "%s: truncated .npy header", path);
  if (major == 1) {
    hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
  } else {
    if (fread(pre + 10, 1, 2, f) != 2)
      return rda_err_set(err, RDA_ERR_IO, "%s: truncated .npy header", path);
    hlen =
        (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) | ((size_t)pre[11] << 24);
  }
  if (hlen > RDA_NPY_MAX_HEADER)
    return rda_err_set(err, RDA_ERR_IO, "%s: .npy header of %zu bytes is absurdly long", path,
                       hlen);
  char *h = malloc(hlen + 1);
  if (h == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  if (fread(h, 1, hlen, f) != hlen) {
    free(h);
    return rda_err_set(err, RDA_ERR_IO, "%s: truncated .npy header (expected %zu header bytes)",
                       path, hlen);
  }
  h[hlen] = '\0';
  int itemsize = 0;
  const rda_status st = rda_npy_parse_header(path, h, hlen, out, &itemsize, err);
  free(h);
  if (st != RDA_OK) return st;

  /* A regular file must hold exactly the data the header promises: checked before allocating,
   * so a lying header cannot make us allocate what the file does not hold. */
  struct stat fst;
  const long pos = ftell(f);
  const int regular = pos >= 0 && fstat(fileno(f), &fst) == 0 && S_ISREG(fst.st_mode);
  if (regular) {
    const unsigned long long have = (unsigned long long)fst.st_size - (unsigned long long)pos;
    const unsigned long long want = (unsigned long long)out->count * (unsigned long long)itemsize;
    if (have < want)
      return rda_err_set(err, RDA_ERR_IO,
                         "%s: truncated .npy data: %llu bytes present, expected "
                         "%llu (%zu values of %d bytes)",
                         path, have, want, out->count, itemsize);
    if (have > want)
      return rda_err_set(err, RDA_ERR_IO,
                         "%s: %llu unexpected bytes after the %zu values of the "
                         "array",
                         path, have - want, out->count);
  }
  /* A pipe's size is not known before it is read: its buffer grows with the data that
   * arrives (doubling), so a lying header costs no more memory than the data sent. */
  size_t cap = out->count ? out->count : 1;
  if (!regular && cap > RDA_NPY_PIPE_CHUNK) cap = RDA_NPY_PIPE_CHUNK;
  out->data = malloc(cap * sizeof *out->data);
  if (out->data == NULL)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu values", path,
                       out->count);
  unsigned char buf[1 << 16];
  const size_t per = sizeof buf / (size_t)itemsize;
  size_t done = 0;
  while (done < out->count) {
    const size_t want = out->count - done < per ? out->count - done : per;
    if (done + want > cap) {
      const size_t grown = cap > out->count / 2 ? out->count : 2 * cap;
      double *d = realloc(out->data, grown * sizeof *out->data);
      if (d == NULL)
        return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu values", path,
                           out->count);
      out->data = d, cap = grown;
    }
    const size_t n = fread(buf, (size_t)itemsize, want, f);
    for (size_t i = 0; i < n; i++)
      out->data[done + i] = rda_npy_decode(buf + i * (size_t)itemsize, itemsize);
    done += n;
    if (n < want) {
      if (ferror(f))
        return rda_err_set(err, RDA_ERR_IO, "%s: read error: %s", path, strerror(errno));
      return rda_err_set(err, RDA_ERR_IO, "%s: truncated .npy data: %zu of %zu values present",
                         path, done, out->count);
    }
  }
  if (fgetc(f) != EOF)
    return rda_err_set(err, RDA_ERR_IO, "%s: unexpected bytes after the %zu values of the array",
                       path, out->count);
  if (ferror(f)) return rda_err_set(err, RDA_ERR_IO, "%s: read error: %s", path, strerror(errno));
  return RDA_OK;
}

rda_status rda_npy_read(const char *path, rda_npy *out, rda_err *err) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (f == NULL) return rda_err_set(err, RDA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    fclose(f);
    return rda_err_set(err, RDA_ERR_IO, "%s: is a folder, not a .npy file", path);
  }
  const rda_status s = rda_npy_read_file(f, path, out, err);
  fclose(f);
  if (s != RDA_OK) rda_npy_free(out);
  return s;
}

/* --- writing ---------------------------------------------------------------------------------- */

static rda_status rda_npy_write_body(int fd, const char *path, int ndim, const long long *shape,
                                     size_t count, const float *data, rda_err *err) {
  /* Header: magic, version 1.0, u16 length, the dict padded with spaces and ended by '\n' so
   * that the data starts at a multiple of 64 bytes. */
  char dict[512];
  int len = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
  for (int i = 0; i < ndim; i++)
    len += snprintf(dict + len, sizeof dict - (size_t)len, "%lld%s", shape[i],
                    ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
  len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
  size_t total = 10 + (size_t)len + 1;
  total = (total + 63) / 64 * 64;
  const size_t hlen = total - 10;
  unsigned char head[512 + 80];
  memcpy(head, rda_npy_magic, 6);
  head[6] = 1;
  head[7] = 0;
  head[8] = (unsigned char)(hlen & 0xff);
  head[9] = (unsigned char)(hlen >> 8);
  memcpy(head + 10, dict, (size_t)len);
  memset(head + 10 + len, ' ', hlen - (size_t)len - 1);
  head[total - 1] = '\n';
  RDA_TRY(rda_out_write_all(fd, path, head, total, err));

  unsigned char buf[1 << 16];
  size_t done = 0;
  while (done < count) {
    const size_t n = count - done < sizeof buf / 4 ? count - done : sizeof buf / 4;
    for (size_t i = 0; i < n; i++) {
      uint32_t u;
      memcpy(&u, &data[done + i], sizeof u);
      buf[4 * i + 0] = (unsigned char)(u & 0xff);
      buf[4 * i + 1] = (unsigned char)((u >> 8) & 0xff);
      buf[4 * i + 2] = (unsigned char)((u >> 16) & 0xff);
      buf[4 * i + 3] = (unsigned char)(u >> 24);
    }
    RDA_TRY(rda_out_write_all(fd, path, buf, 4 * n, err));
    done += n;
  }
  return RDA_OK;
}

/* Best effort: make the rename durable by syncing the folder that holds `file` (modified). */
static void rda_npy_sync_folder(char *file) {
  char *slash = strrchr(file, '/');
  const char *dir = ".";
  if (slash == file) {
    dir = "/";
  } else if (slash != NULL) {
    *slash = '\0';
    dir = file;
  }
  const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
}

/* The element count of a shape to write, checked. */
static rda_status rda_npy_write_count(const char *path, int ndim, const long long *shape,
                                      size_t *count, rda_err *err) {
  if (ndim < 0 || ndim > RDA_NPY_MAX_DIMS)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: cannot write %d dimensions", path, ndim);
  *count = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || (shape[i] != 0 && *count > SIZE_MAX / 4 / (size_t)shape[i]))
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: bad shape to write", path);
    *count *= (size_t)shape[i];
  }
  return RDA_OK;
}

rda_status rda_npy_write_f32_fd(int fd, const char *name, int ndim, const long long *shape,
                                const float *data, rda_err *err) {
  size_t count = 0;
  RDA_TRY(rda_npy_write_count(name, ndim, shape, &count, err));
  return rda_npy_write_body(fd, name, ndim, shape, count, data, err);
}

rda_status rda_npy_write_f32(const char *path, int ndim, const long long *shape, const float *data,
                             rda_err *err) {
  size_t count = 0;
  RDA_TRY(rda_npy_write_count(path, ndim, shape, &count, err));
  /* Through a symbolic link the file it leads to is replaced, and the link kept. */
  char target[4096];
  RDA_TRY(rda_path_follow_links(path, target, sizeof target, err));
  const size_t plen = strlen(target);
  char *tmp = malloc(plen + 48);
  if (tmp == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  static atomic_uint counter;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
    snprintf(tmp, plen + 48, "%s.tmp-%ld-%u", target, (long)getpid(),
             atomic_fetch_add(&counter, 1u));
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    const int e = errno;
    free(tmp);
    return rda_err_set(err, RDA_ERR_IO, "%s: cannot create: %s", path, strerror(e));
  }
  rda_status s = rda_npy_write_body(fd, path, ndim, shape, count, data, err);
  if (s == RDA_OK && fsync(fd) != 0)
    s = rda_err_set(err, RDA_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
  if (close(fd) != 0 && s == RDA_OK)
    s = rda_err_set(err, RDA_ERR_IO, "%s: close failed: %s", path, strerror(errno));
  if (s == RDA_OK && rename(tmp, target) != 0)
    s = rda_err_set(err, RDA_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
  if (s != RDA_OK) unlink(tmp);
  if (s == RDA_OK) rda_npy_sync_folder(tmp);
  free(tmp);
  return s;
}
