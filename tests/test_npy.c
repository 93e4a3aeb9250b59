/* test_npy.c — .npy reading and writing: round trips, format versions 1-3, float16/32/64
 * decoding (float16 exactly), header parsing robust to spacing and key order, every rejection
 * rule on hand-made byte files, and atomic writes that leave nothing behind on failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "err.h"
#include "npy.h"
#include "out_files.h"
#include "rda_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct fixture {
  char *dir;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (f == NULL) return -1;
  f->dir = rt_mkdtemp();
  if (f->dir == NULL) {
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  rt_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

/* A .npy file from parts: magic, version major.0, the header length (u16 for v1, u32 for v2/3),
 * the header text padded with spaces and '\n' to a multiple of 64 (when pad), then data. */
static char *make_file(const fixture *f, const char *name, int major, const char *dict, int pad,
                       const void *data, size_t data_len) {
  const size_t pre = major == 1 ? 10 : 12;
  size_t hlen = strlen(dict) + (pad ? 1 : 0);
  if (pad) hlen = (pre + hlen + 63) / 64 * 64 - pre;
  const size_t total = pre + hlen + data_len;
  unsigned char *buf = malloc(total);
  assert_non_null(buf);
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)major;
  buf[7] = 0;
  if (major == 1) {
    buf[8] = (unsigned char)(hlen & 0xff), buf[9] = (unsigned char)(hlen >> 8);
  } else {
    for (int i = 0; i < 4; i++) buf[8 + i] = (unsigned char)((hlen >> (8 * i)) & 0xff);
  }
  memcpy(buf + pre, dict, strlen(dict));
  if (pad) {
    memset(buf + pre + strlen(dict), ' ', hlen - strlen(dict));
    buf[pre + hlen - 1] = '\n';
  }
  if (data_len) memcpy(buf + pre + hlen, data, data_len);
  char *path = rt_path(f->dir, name);
  assert_true(rt_write_file(path, buf, total));
  free(buf);
  return path;
}

static void le_f32(unsigned char *out, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    for (int b = 0; b < 4; b++) out[4 * i + (size_t)b] = (unsigned char)((u >> (8 * b)) & 0xff);
  }
}

static void le_f64(unsigned char *out, const double *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t u;
    memcpy(&u, &x[i], 8);
    for (int b = 0; b < 8; b++) out[8 * i + (size_t)b] = (unsigned char)((u >> (8 * b)) & 0xff);
  }
}

/* --- reading ---------------------------------------------------------------------------------- */

static void test_npy_reads_versions_1_2_3(void **state) {
  fixture *f = *state;
  const float x[6] = {1.5f, -2.25f, 3.0e-7f, 1e30f, -0.0f, 7.0f};
  unsigned char data[24];
  le_f32(data, x, 6);
  for (int major = 1; major <= 3; major++) {
    char name[32];
    snprintf(name, sizeof name, "v%d.npy", major);
    char *path =
        make_file(f, name, major, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1,
                  data, sizeof data);
    rda_npy a;
    rda_err err = {0};
    assert_int_equal(rda_npy_read(path, &a, &err), RDA_OK);
    assert_int_equal(a.ndim, 2);
    assert_int_equal(a.shape[0], 2);
    assert_int_equal(a.shape[1], 3);
    assert_int_equal(a.count, 6);
    for (int i = 0; i < 6; i++) assert_true(a.data[i] == (double)x[i]);
    assert_true(signbit(a.data[4]));
    rda_npy_free(&a);
    free(path);
  }
}

static void test_npy_decodes_float16_exactly(void **state) {
  fixture *f = *state;
  const unsigned short bits[] = {0x3c00, 0xc100, 0x0001, 0x03ff, 0x0400, 0x7bff,
                                 0x7c00, 0xfc00, 0x7e00, 0x8000, 0x2e66, 0x8001};
  const size_t n = sizeof bits / sizeof bits[0];
  unsigned char data[sizeof bits];
  for (size_t i = 0; i < n; i++)
    data[2 * i] = bits[i] & 0xff, data[2 * i + 1] = (unsigned char)(bits[i] >> 8);
  char *path =
      make_file(f, "h.npy", 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (12,), }", 1,
                data, sizeof data);
  rda_npy a;
  rda_err err = {0};
  assert_int_equal(rda_npy_read(path, &a, &err), RDA_OK);
  assert_int_equal(a.ndim, 1);
  assert_int_equal(a.count, n);
  assert_true(a.data[0] == 1.0);
  assert_true(a.data[1] == -2.5);
  assert_true(a.data[2] == 0x1p-24);
  assert_true(a.data[3] == 1023 * 0x1p-24);
  assert_true(a.data[4] == 0x1p-14);
  assert_true(a.data[5] == 65504.0);
  assert_true(isinf(a.data[6]) && a.data[6] > 0);
  assert_true(isinf(a.data[7]) && a.data[7] < 0);
  assert_true(isnan(a.data[8]));
  assert_true(a.data[9] == 0.0 && signbit(a.data[9]));
  assert_true(a.data[10] == 0.0999755859375);
  assert_true(a.data[11] == -0x1p-24);
  rda_npy_free(&a);
  free(path);
}

static void test_npy_reads_float64_exactly(void **state) {
  fixture *f = *state;
  double x[5] = {0.1, -1e300, 5e-324, 123456789.123456789, 0};
  rt_fill_normal(&x[4], 1, RT_DTYPE_F64);
  unsigned char data[40];
  le_f64(data, x, 5);
  char *path = make_file(f, "d.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }",
                         1, data, sizeof data);
  rda_npy a;
  rda_err err = {0};
  assert_int_equal(rda_npy_read(path, &a, &err), RDA_OK);
  for (int i = 0; i < 5; i++) assert_true(a.data[i] == x[i]);
  rda_npy_free(&a);
  free(path);
}

static void test_npy_header_parsing_tolerates_spacing_order_and_quotes(void **state) {
  fixture *f = *state;
  const float x[4] = {1, 2, 3, 4};
  unsigned char data[16];
  le_f32(data, x, 4);
  static const char *const dicts[] = {
      "{'shape': (2, 2), 'fortran_order': False, 'descr': '<f4'}",
      "{ \"descr\" :\"<f4\",\"fortran_order\":False,\"shape\":(2,2) }",
      "{'fortran_order': False,'descr': '<f4','shape': (2L, 2L),}",
      "{'descr':'<f4',\n 'fortran_order' : False ,\t'shape' : ( 2 , 2 , ) }",
  };
  for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++) {
    char *path = make_file(f, "s.npy", (int)(1 + i % 3), dicts[i], (int)(i % 2), data, sizeof data);
    rda_npy a;
    rda_err err = {0};
    if (rda_npy_read(path, &a, &err) != RDA_OK) {
      fprintf(stderr, "header %zu: %s\n", i, err.msg);
      fail();
    }
    assert_int_equal(a.ndim, 2);
    assert_int_equal(a.shape[0] * a.shape[1], 4);
    assert_true(a.data[3] == 4.0);
    rda_npy_free(&a);
    free(path);
  }
}

static void test_npy_reads_scalar_and_empty_shapes(void **state) {
  fixture *f = *state;
  const float x[1] = {42.0f};
  unsigned char data[4];
  le_f32(data, x, 1);
  char *path = make_file(f, "0d.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
                         1, data, 4);
  rda_npy a;
  rda_err err = {0};
  assert_int_equal(rda_npy_read(path, &a, &err), RDA_OK);
  assert_int_equal(a.ndim, 0);
  assert_int_equal(a.count, 1);
  assert_true(a.data[0] == 42.0);
  rda_npy_free(&a);
  free(path);
  path = make_file(f, "empty.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }",
                   1, NULL, 0);
  assert_int_equal(rda_npy_read(path, &a, &err), RDA_OK);
  assert_int_equal(a.count, 0);
  rda_npy_free(&a);
  free(path);
}

/* --- rejections: each names the file and what was wrong --------------------------------------- */

typedef struct bad_case {
  const char *what;
  int major;
  const char *dict;
  size_t data_len;    /* bytes of data appended */
  const char *expect; /* a phrase the message must hold */
} bad_case;

static void expect_rejected(const char *path, const char *what, const char *phrase) {
  rda_npy a;
  rda_err err = {0};
  const rda_status s = rda_npy_read(path, &a, &err);
  if (s != RDA_ERR_IO || strstr(err.msg, path) == NULL || strstr(err.msg, phrase) == NULL) {
    fprintf(stderr, "%s: status %s, message '%s' (wanted RDA_ERR_IO naming the file and '%s')\n",
            what, rda_status_string(s), err.msg, phrase);
    fail();
  }
  assert_null(a.data);
  assert_null(strchr(err.msg, '\n'));
}

static void test_npy_rejects_each_bad_header(void **state) {
  fixture *f = *state;
  static const bad_case cases[] = {
      {"integers", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", 8, "integer"},
      {"unsigned", 1, "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", 4, "'<f4'"},
      {"big-endian", 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8,
       "big-endian"},
      {"no byte order", 1, "{'descr': '|f4', 'fortran_order': False, 'shape': (2,), }", 8, "'<f2'"},
      {"native order", 1, "{'descr': '=f4', 'fortran_order': False, 'shape': (2,), }", 8, "'=f4'"},
      {"complex", 1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16, "complex"},
      {"bfloat", 1, "{'descr': '<V2', 'fortran_order': False, 'shape': (2,), }", 4, "'<f8'"},
      {"structured", 1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8,
       "structured"},
      {"fortran", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, "Fortran"},
      {"missing shape", 1, "{'descr': '<f4', 'fortran_order': False, }", 0, "missing key 'shape'"},
      {"missing descr", 2, "{'fortran_order': False, 'shape': (2,)}", 8, "missing key 'descr'"},
      {"unknown key", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8,
       "unexpected key 'x'"},
      {"duplicate key", 1,
       "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8, "twice"},
      {"not a dict", 1, "['descr', '<f4']", 8, "not a dict"},
      {"text after", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", 8, "after"},
      {"negative dim", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8, "shape"},
      {"float dim", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,), }", 8, "shape"},
      {"shape list", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': [2], }", 8, "tuple"},
      {"bad bool", 3, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", 8, "True or False"},
      {"absurd shape", 1,
       "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", 0,
       "absurd"},
      {"huge dim", 1,
       "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0, "absurd"},
      {"lying shape", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776,), }", 8,
       "truncated"},
      {"lying shape 2", 1,
       "{'descr': '<f2', 'fortran_order': False, 'shape': (65536, 65536, 65536), }", 8,
       "truncated"},
      {"too many dims", 1,
       "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, "dimensions"},
      {"unterminated", 1, "{'descr': '<f4, 'fortran_order': False, 'shape': (2,), }", 8, "header"},
      /* Python, whose literal the header is, has no leading zeros (NumPy refuses these). */
      {"leading zero", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (02,), }", 8,
       "leading zero"},
      {"leading zeros", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 008), }", 32,
       "leading zero"},
  };
  unsigned char zeros[64] = {0};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char name[48];
    snprintf(name, sizeof name, "bad%zu.npy", i);
    char *path = make_file(f, name, cases[i].major, cases[i].dict, 1, zeros, cases[i].data_len);
    expect_rejected(path, cases[i].what, cases[i].expect);
    free(path);
  }
}

/* A NUL byte inside a quoted string (Python refuses a literal holding one) is refused, not
 * read as the end of the string; a dimension of 0 or 00 is Python's zero. */
static void test_npy_rejects_nul_in_strings_reads_zero_dims(void **state) {
  fixture *f = *state;
  static const char *const dicts[] = {
      "{'descr': '<f4~', 'fortran_order': False, 'shape': (2,), }",
      "{'descr~x': '<f4', 'fortran_order': False, 'shape': (2,), }",
  };
  unsigned char zeros[8] = {0};
  for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++) {
    char *path = make_file(f, "nul.npy", 1, dicts[i], 1, zeros, sizeof zeros);
    size_t len = 0;
    char *text = rt_read_file(path, &len);
    assert_non_null(text);
    char *at = memchr(text, '~', len);
    assert_non_null(at);
    *at = '\0';
    assert_true(rt_write_file(path, text, len));
    free(text);
    expect_rejected(path, "NUL in a string", "header");
    free(path);
  }
  char *path = make_file(f, "zero.npy", 1,
                         "{'descr': '<f4', 'fortran_order': False, 'shape': (00, 0), }", 1, NULL,
                         0);
  rda_npy a;
  rda_err err = {0};
  assert_int_equal(rda_npy_read(path, &a, &err), RDA_OK);
  assert_int_equal(a.ndim, 2);
  assert_int_equal(a.shape[0], 0);
  assert_int_equal(a.count, 0);
  rda_npy_free(&a);
  free(path);
}

/* A path of 1,200 characters (legal: PATH_MAX is 4096) leaves the message room for its
 * reason: the path loses its middle to "...", keeping its start and its file name. */
static void test_npy_long_path_keeps_the_reason(void **state) {
  fixture *f = *state;
  char *dir = strdup(f->dir);
  for (int i = 0; i < 6; i++) {
    char part[201];
    memset(part, 'a' + i, 200);
    part[200] = '\0';
    char *next = rt_path(dir, part);
    assert_int_equal(mkdir(next, 0700), 0);
    free(dir);
    dir = next;
  }
  char *path = make_file(f, "short.npy", 1, "{'descr': '<f4', 'fortran_order': False, "
                                            "'shape': (4,), }", 1, "abcd", 4);
  char *deep = rt_path(dir, "q.npy");
  assert_int_equal(rename(path, deep), 0);
  rda_npy a;
  rda_err err = {0};
  assert_int_equal(rda_npy_read(deep, &a, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "truncated .npy data: 4 bytes present, expected 16"));
  assert_non_null(strstr(err.msg, "..."));
  assert_non_null(strstr(err.msg, "ffff/q.npy: truncated"));
  assert_true(strncmp(err.msg, f->dir, strlen(f->dir) / 3) == 0);
  unlink(deep);
  free(path), free(deep), free(dir);

  /* Short text is copied as it is; words of 16 characters or fewer are never cut. */
  char text[64] = "a/b/c: fine", out[32];
  rda_text_fit(out, sizeof out, text);
  assert_string_equal(out, "a/b/c: fine");
  snprintf(text, sizeof text, "%s", "/0123456789/0123456789/0123456789/x.npy: bad");
  rda_text_fit(out, sizeof out, text);
  assert_string_equal(out, "/0123456...123456789/x.npy: bad");
  snprintf(text, sizeof text, "%s", "0123456789abcdef 0123456789abcdef 0123456789");
  rda_text_fit(out, 20, text);
  assert_string_equal(out, "0123456789abcdef 01");
  /* A cut never splits a UTF-8 character: 20 two-byte characters into 24 bytes. */
  snprintf(text, sizeof text, "%s", "\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9"
                                    "\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9"
                                    "\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9");
  rda_text_fit(out, 24, text);
  assert_string_equal(out, "\xC3\xA9\xC3\xA9\xC3\xA9...\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9"
                           "\xC3\xA9\xC3\xA9\xC3\xA9");
}

static void test_npy_rejects_bad_magic_version_and_truncation(void **state) {
  fixture *f = *state;
  const float x[4] = {1, 2, 3, 4};
  unsigned char data[16];
  le_f32(data, x, 4);
  const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }";

  char *good = make_file(f, "good.npy", 1, dict, 1, data, sizeof data);
  size_t len = 0;
  char *bytes = rt_read_file(good, &len);
  assert_non_null(bytes);
  assert_int_equal(len, 128 + 16);

  char *path = rt_path(f->dir, "cut.npy");
  /* truncated data: every length between the header and the full file */
  for (size_t cut = 128; cut < len; cut += 3) {
    assert_true(rt_write_file(path, bytes, cut));
    expect_rejected(path, "truncated data", "truncated");
  }
  /* truncated header and pre-header */
  const size_t cuts[] = {0, 3, 6, 8, 9, 10, 30, 127};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    assert_true(rt_write_file(path, bytes, cuts[i]));
    expect_rejected(path, "truncated header", cuts[i] < 8 ? "magic" : "truncated");
  }
  /* trailing bytes after the data */
  char *longer = malloc(len + 1);
  assert_non_null(longer);
  memcpy(longer, bytes, len);
  longer[len] = 0;
  assert_true(rt_write_file(path, longer, len + 1));
  expect_rejected(path, "trailing data", "after");
  /* bad magic */
  memcpy(longer, bytes, len);
  longer[1] = 'X';
  assert_true(rt_write_file(path, longer, len));
  expect_rejected(path, "bad magic", "magic");
  /* unknown versions */
  memcpy(longer, bytes, len);
  longer[6] = 4;
  assert_true(rt_write_file(path, longer, len));
  expect_rejected(path, "version 4", "version");
  memcpy(longer, bytes, len);
  longer[7] = 1;
  assert_true(rt_write_file(path, longer, len));
  expect_rejected(path, "version 1.1", "version");
  /* a header length past the end of the file (v2: u32) */
  char *v2 = make_file(f, "v2.npy", 2, dict, 1, data, sizeof data);
  char *v2b = rt_read_file(v2, &len);
  assert_non_null(v2b);
  v2b[11] = 0x01; /* 16 MiB header */
  assert_true(rt_write_file(path, v2b, len));
  expect_rejected(path, "huge header", "header");
  free(v2b);
  free(v2);
  free(longer);
  free(path);
  free(bytes);
  free(good);
}

/* rda_npy_read of bytes that arrive through a pipe (/dev/fd/N), written by a child process. */
static rda_status read_through_pipe(const void *bytes, size_t len, rda_npy *a, rda_err *err) {
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fd[0]);
    const char *p = bytes;
    while (len > 0) {
      const ssize_t n = write(fd[1], p, len);
      if (n <= 0) _exit(1);
      p += n, len -= (size_t)n;
    }
    _exit(0);
  }
  close(fd[1]);
  char path[64];
  snprintf(path, sizeof path, "/dev/fd/%d", fd[0]);
  const rda_status s = rda_npy_read(path, a, err);
  close(fd[0]); /* first: a child blocked on a full pipe then ends */
  int wst = 0;
  assert_int_equal(waitpid(pid, &wst, 0), pid);
  return s;
}

/* A pipe's size is unknown until read: a header that claims far more than arrives (here
 * 2^36 values, 512 GiB as doubles) is a truncation error, not an allocation of what it claims;
 * and an honest pipe of more values than the first buffer holds reads back exactly. */
static void test_npy_pipe_reads_what_arrives(void **state) {
  fixture *f = *state;
  unsigned char data[100];
  for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 7 + 1);
  const char *lying = "{'descr': '<f4', 'fortran_order': False, 'shape': (68719476736,), }";
  char *path = make_file(f, "lying.npy", 1, lying, 1, data, sizeof data);
  size_t len = 0;
  char *bytes = rt_read_file(path, &len);
  assert_non_null(bytes);
  rda_npy a;
  rda_err err = {0};
  assert_int_equal(read_through_pipe(bytes, len, &a, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "truncated .npy data: 25 of 68719476736 values"));
  assert_null(a.data);
  free(bytes), free(path);

  const size_t n = ((size_t)3 << 20) + 5; /* past two doublings of the pipe buffer */
  float *x = malloc(n * sizeof *x);
  unsigned char *raw = malloc(n * 4);
  assert_true(x != NULL && raw != NULL);
  for (size_t i = 0; i < n; i++) x[i] = (float)i * 0.25f - 1000.0f;
  le_f32(raw, x, n);
  char dict[128];
  snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%zu,), }", n);
  path = make_file(f, "honest.npy", 1, dict, 1, raw, n * 4);
  bytes = rt_read_file(path, &len);
  assert_non_null(bytes);
  assert_int_equal(read_through_pipe(bytes, len, &a, &err), RDA_OK);
  assert_int_equal(a.count, n);
  for (size_t i = 0; i < n; i++)
    if (a.data[i] != (double)x[i]) fail_msg("value %zu: %g, expected %g", i, a.data[i], x[i]);
  rda_npy_free(&a);
  free(bytes), free(path), free(x), free(raw);
}

static void test_npy_rejects_missing_file_and_folder(void **state) {
  fixture *f = *state;
  char *path = rt_path(f->dir, "nope.npy");
  expect_rejected(path, "missing file", "cannot open");
  expect_rejected(f->dir, "a folder", "folder");
  free(path);
}

/* Mutated files from valid ones of each version, dtype and shape kind: up to three changes to
 * the header (a token inserted, a range cut, a byte replaced), written with its true length,
 * padded or not, and its data, sometimes a value more or less; and in one round of three, raw
 * damage: any byte, the length field, the file cut short. Each either reads, with count the
 * product of its shape and the data the file holds, or fails with one line naming the file;
 * never a crash or an ASan report. Seeded (RDA_TEST_SEED), so a failure reruns exactly. */
static void test_npy_survives_mutated_files(void **state) {
  fixture *f = *state;
  static const struct {
    int major;
    const char *dict;
    size_t data_len, count;
  } seeds[] = {
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24, 6},
      {2, "{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }", 8, 4},
      {3, "{'shape': (1, 2, 2), 'descr': '<f8', 'fortran_order': False}", 32, 4},
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, 1},
      {1, "{'descr': '<f2', 'fortran_order': False, 'shape': (0, 3), }", 0, 0},
  };
  static const char *const tokens[] = {"(",         ")",
                                       ",",         "'",
                                       "\"",        "-",
                                       "0",         "00",
                                       "7",         "99999999999999999999",
                                       "{",         "}",
                                       ":",         " ",
                                       "\n",        "\t",
                                       "\\",        "True",
                                       "False",     "None",
                                       "<",         ">f4",
                                       "<f2",       "<f8",
                                       "<i4",       "'shape'",
                                       "'descr'",   "'fortran_order'",
                                       "[",         "]",
                                       "1e3",       "2.5",
                                       "\x93NUMPY", "#",
                                       "\xc3\xa9",  "\x01"};
  const long long ntok = (long long)(sizeof tokens / sizeof tokens[0]);
  enum { kRounds = 3000, kCap = 1024 };
  rt_rng rng;
  rt_rng_seed(&rng, rt_seed_value() ^ 0x6e70796d75746174ull);
  char *path = rt_path(f->dir, "m.npy");
  unsigned char *b = malloc(kCap);
  assert_non_null(b);
  int read_ok = 0, rejected = 0;
  for (int round = 0; round < kRounds; round++) {
    const int k = round % (int)(sizeof seeds / sizeof seeds[0]);
    const size_t pre = seeds[k].major == 1 ? 10 : 12;
    /* The header, mutated. */
    char h[512];
    size_t hl = strlen(seeds[k].dict);
    memcpy(h, seeds[k].dict, hl);
    const int nmut = (int)rt_rng_range(&rng, 0, 3); /* 0: the damage below alone */
    for (int m = 0; m < nmut; m++) {
      const size_t at = hl > 0 ? (size_t)rt_rng_range(&rng, 0, (long long)hl - 1) : 0;
      const long long op = rt_rng_range(&rng, 0, 3);
      if (op == 0 || hl == 0) { /* a token inserted */
        const char *t = tokens[rt_rng_range(&rng, 0, ntok - 1)];
        const size_t tl = strlen(t);
        if (hl + tl > 400) continue;
        memmove(h + at + tl, h + at, hl - at);
        memcpy(h + at, t, tl);
        hl += tl;
      } else if (op == 1) { /* a range cut out */
        const size_t n = (size_t)rt_rng_range(&rng, 1, 6), end = at + n < hl ? at + n : hl;
        memmove(h + at, h + end, hl - end);
        hl -= end - at;
      } else if (op == 2) { /* a byte replaced by a token's first */
        h[at] = tokens[rt_rng_range(&rng, 0, ntok - 1)][0];
      } else { /* any byte */
        h[at] = (char)rt_rng_next(&rng);
      }
    }
    /* The file: its true header length, padded to 64 (or not), the data (maybe a value more
     * or less: 2 bytes, the smallest item). */
    const int pad = rt_rng_range(&rng, 0, 3) != 0;
    size_t hlen = hl + (pad ? 1 : 0);
    if (pad) hlen = (pre + hlen + 63) / 64 * 64 - pre;
    const long long dd = rt_rng_range(&rng, 0, 5) == 0 ? rt_rng_range(&rng, -1, 1) * 2 : 0;
    const size_t dlen =
        (size_t)((long long)seeds[k].data_len + dd < 0 ? 0 : (long long)seeds[k].data_len + dd);
    size_t len = pre + hlen + dlen;
    assert_true(len <= kCap);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)seeds[k].major, b[7] = 0;
    for (size_t i = 0; i < pre - 8; i++) b[8 + i] = (unsigned char)((hlen >> (8 * i)) & 0xff);
    memcpy(b + pre, h, hl);
    if (pad) memset(b + pre + hl, ' ', hlen - hl), b[pre + hlen - 1] = '\n';
    for (size_t i = 0; i < dlen; i++) b[pre + hlen + i] = (unsigned char)(0x3c + i % 3);
    /* Raw damage, one round in three. */
    const int raw = rt_rng_range(&rng, 0, 2) == 0;
    if (raw) {
      const size_t at = (size_t)rt_rng_range(&rng, 0, (long long)len - 1);
      switch (rt_rng_range(&rng, 0, 2)) {
        case 0: b[at] = (unsigned char)rt_rng_next(&rng); break;
        case 1: b[8 + at % (pre - 8)] = (unsigned char)rt_rng_next(&rng); break;
        default: len = at; break;
      }
    }
    assert_true(rt_write_file(path, b, len));
    rda_npy a;
    rda_err err = {0};
    const rda_status s = rda_npy_read(path, &a, &err);
    /* Undamaged: read exactly when its data is whole. */
    if (nmut == 0 && !raw && (s == RDA_OK) != (dlen == seeds[k].data_len))
      fail_msg("round %d (seed %llu): %zu data bytes, the header says %zu: %s: '%s'", round,
               (unsigned long long)rt_seed_value(), dlen, seeds[k].data_len, rda_status_string(s),
               err.msg);
    if (nmut == 0 && !raw && s == RDA_OK && a.count != seeds[k].count)
      fail_msg("round %d: %zu values read, %zu written", round, a.count, seeds[k].count);
    if (s == RDA_OK) {
      read_ok++;
      size_t count = 1;
      for (int d = 0; d < a.ndim; d++) count *= (size_t)a.shape[d];
      if (a.ndim < 0 || a.ndim > RDA_NPY_MAX_DIMS || count != a.count ||
          (a.count > 0 && a.data == NULL) || a.count * 2 > len)
        fail_msg("round %d (seed %llu): read as %d dims, count %zu, from %zu bytes", round,
                 (unsigned long long)rt_seed_value(), a.ndim, a.count, len);
      rda_npy_free(&a);
    } else {
      rejected++;
      if (err.msg[0] == '\0' || strchr(err.msg, '\n') != NULL || strstr(err.msg, path) == NULL ||
          a.data != NULL)
        fail_msg("round %d (seed %llu): %s: '%s'", round, (unsigned long long)rt_seed_value(),
                 rda_status_string(s), err.msg);
    }
  }
  /* Both outcomes were reached, or the mutations tested nothing. */
  print_message("%d mutated files read, %d rejected\n", read_ok, rejected);
  assert_true(read_ok > kRounds / 50 && rejected > kRounds / 2);
  free(b);
  free(path);
}

/* --- writing ---------------------------------------------------------------------------------- */

static void test_npy_write_then_read_round_trips(void **state) {
  fixture *f = *state;
  const long long shapes[][4] = {{2, 3, 4, 5}, {1, 1, 1, 1}, {7, 0, 0, 0}, {3, 65, 2, 0}};
  const int ndims[] = {4, 4, 1, 3};
  for (size_t s = 0; s < 4; s++) {
    size_t n = 1;
    for (int i = 0; i < ndims[s]; i++) n *= (size_t)shapes[s][i];
    float *x = malloc(n * sizeof *x);
    double *d = rt_normal(n, RT_DTYPE_F64);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)d[i];
    if (n > 1) x[1] = -INFINITY;
    char *path = rt_path(f->dir, "rt.npy");
    rda_err err = {0};
    assert_int_equal(rda_npy_write_f32(path, ndims[s], shapes[s], x, &err), RDA_OK);
    rda_npy a;
    assert_int_equal(rda_npy_read(path, &a, &err), RDA_OK);
    assert_int_equal(a.ndim, ndims[s]);
    for (int i = 0; i < ndims[s]; i++) assert_int_equal(a.shape[i], shapes[s][i]);
    assert_int_equal(a.count, n);
    for (size_t i = 0; i < n; i++) assert_true(a.data[i] == (double)x[i]);
    rda_npy_free(&a);
    assert_int_equal(rt_count_entries(f->dir), 1); /* no temporary left */
    free(path), free(x), free(d);
  }
}

/* The exact bytes numpy writes: version 1.0, the dict, spaces, '\n', data at a multiple of 64
 * (128 here, as numpy's own files of this shape). */
static void test_npy_write_header_is_numpy_v1_padded_to_64(void **state) {
  fixture *f = *state;
  const long long shape[3] = {2, 1, 3};
  const float x[6] = {1, 2, 3, 4, 5, 6};
  char *path = rt_path(f->dir, "h.npy");
  rda_err err = {0};
  assert_int_equal(rda_npy_write_f32(path, 3, shape, x, &err), RDA_OK);
  size_t len = 0;
  char *b = rt_read_file(path, &len);
  assert_non_null(b);
  assert_int_equal(len, 128 + 24);
  assert_memory_equal(b, "\x93NUMPY\x01\x00", 8);
  assert_int_equal((unsigned char)b[8] | ((unsigned char)b[9] << 8), 118);
  const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1, 3), }";
  assert_memory_equal(b + 10, dict, strlen(dict));
  for (size_t i = 10 + strlen(dict); i < 127; i++) assert_int_equal(b[i], ' ');
  assert_int_equal(b[127], '\n');
  unsigned char want[24];
  le_f32(want, x, 6);
  assert_memory_equal(b + 128, want, 24);
  free(b);
  /* 1-D shapes carry the tuple comma */
  const long long one[1] = {6};
  assert_int_equal(rda_npy_write_f32(path, 1, one, x, &err), RDA_OK);
  b = rt_read_file(path, &len);
  assert_non_null(strstr(b + 10, "'shape': (6,), }"));
  free(b);
  free(path);
}

static void test_npy_write_replaces_existing_file_atomically(void **state) {
  fixture *f = *state;
  char *path = rt_path(f->dir, "o.npy");
  assert_true(rt_write_file(path, "old contents", 12));
  const long long shape[1] = {3};
  const float x[3] = {1, 2, 3};
  rda_err err = {0};
  assert_int_equal(rda_npy_write_f32(path, 1, shape, x, &err), RDA_OK);
  rda_npy a;
  assert_int_equal(rda_npy_read(path, &a, &err), RDA_OK);
  assert_true(a.data[2] == 3.0);
  rda_npy_free(&a);
  assert_int_equal(rt_count_entries(f->dir), 1);
  free(path);
}

static void test_npy_write_failure_leaves_nothing_behind(void **state) {
  fixture *f = *state;
  const long long shape[1] = {3};
  const float x[3] = {1, 2, 3};
  rda_err err = {0};
  /* a missing folder */
  char *missing = rt_path(f->dir, "no/such/folder/o.npy");
  assert_int_equal(rda_npy_write_f32(missing, 1, shape, x, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, missing));
  assert_int_equal(rt_count_entries(f->dir), 0);
  /* the target is a folder: the rename fails, and the temporary goes away */
  char *sub = rt_path(f->dir, "sub");
  assert_int_equal(mkdir(sub, 0755), 0);
  rda_err_clear(&err);
  assert_int_equal(rda_npy_write_f32(sub, 1, shape, x, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, sub));
  assert_int_equal(rt_count_entries(f->dir), 1);
  assert_int_equal(rt_count_entries(sub), 0);
  /* a read-only folder (meaningless for root, who may write anyway) */
  if (geteuid() != 0) {
    assert_int_equal(chmod(sub, 0500), 0);
    char *ro = rt_path(sub, "o.npy");
    rda_err_clear(&err);
    assert_int_equal(rda_npy_write_f32(ro, 1, shape, x, &err), RDA_ERR_IO);
    assert_int_equal(rt_count_entries(sub), 0);
    chmod(sub, 0755);
    free(ro);
  }
  free(sub);
  free(missing);
}

/* Writing through a symbolic link replaces the file it leads to and keeps the link. */
static void test_npy_write_through_a_link_keeps_it(void **state) {
  fixture *f = *state;
  char *target = rt_path(f->dir, "target.npy"), *link_path = rt_path(f->dir, "link.npy");
  assert_int_equal(symlink("target.npy", link_path), 0); /* dangling: writing creates it */
  const long long shape[1] = {2};
  const float x[2] = {4, 5};
  rda_err err = {0};
  assert_int_equal(rda_npy_write_f32(link_path, 1, shape, x, &err), RDA_OK);
  struct stat st;
  assert_int_equal(lstat(link_path, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  rda_npy a;
  assert_int_equal(rda_npy_read(target, &a, &err), RDA_OK);
  assert_true(a.count == 2 && a.data[1] == 5.0);
  rda_npy_free(&a);
  assert_int_equal(rt_count_entries(f->dir), 2);
  free(target), free(link_path);
}

/* --- replacing a set of outputs all or nothing (runtime/out_files.h) --------------------------- */

static int renames_left; /* failing_rename: how many succeed before one fails */

static int failing_rename(const char *from, const char *to) {
  if (renames_left-- <= 0) {
    errno = EXDEV;
    return -1;
  }
  return rename(from, to);
}

/* ctx: the text to write; "FAIL" makes the write fail. */
static rda_status write_text(int fd, const char *path, const void *ctx, rda_err *err) {
  const char *text = ctx;
  if (strcmp(text, "FAIL") == 0) return rda_err_set(err, RDA_ERR_IO, "%s: write failed", path);
  const size_t len = strlen(text);
  return write(fd, text, len) == (ssize_t)len ? RDA_OK
                                              : rda_err_set(err, RDA_ERR_IO, "%s: short", path);
}

static bool has_text(const char *path, const char *text) {
  size_t len = 0;
  char *b = rt_read_file(path, &len);
  const bool same = b != NULL && len == strlen(text) && memcmp(b, text, len) == 0;
  free(b);
  return same;
}

static ino_t inode_of(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return st.st_ino;
}

/* Four outputs: a (existing), b (new), d reached through the link d-link (existing), c
 * (existing). Whichever rename fails (or a write, or a target turned into a folder after the
 * check), every target is as it was (same inode, same bytes), the new one absent, the link
 * kept, and nothing else is left; the message names the user's path, never a temporary. With no
 * failure every target holds its new content. */
static void test_out_files_failure_restores_every_target(void **state) {
  fixture *f = *state;
  char *a = rt_path(f->dir, "a"), *b = rt_path(f->dir, "b"), *c = rt_path(f->dir, "c");
  char *d = rt_path(f->dir, "d"), *dl = rt_path(f->dir, "d-link");
  const char *const paths[4] = {a, b, dl, c};
  const char *const fresh[4] = {"new-a", "new-b", "new-d", "new-c"};
  assert_int_equal(symlink("d", dl), 0);
  for (int mode = 0; mode <= 6; mode++) { /* 0-3: rename k fails; 4: a write; 5: a folder; 6: ok */
    assert_true(rt_write_file(a, "old-a", 5));
    assert_true(rt_write_file(c, "old-c", 5));
    assert_true(rt_write_file(d, "old-d", 5));
    const ino_t ia = inode_of(a), ic = inode_of(c), id = inode_of(d);
    rda_out_file files[4];
    rda_out_job jobs[4];
    rda_err err = {0};
    for (int i = 0; i < 4; i++) {
      assert_int_equal(rda_out_file_check(paths[i], &files[i], &err), RDA_OK);
      jobs[i] = (rda_out_job){&files[i], write_text, fresh[i]};
    }
    assert_false(files[1].exists);
    assert_true(files[2].exists && strcmp(files[2].target + files[2].base, "d") == 0);
    if (mode == 4) jobs[2].ctx = "FAIL";
    if (mode == 5) assert_int_equal(mkdir(b, 0755), 0); /* b's rename now fails for real */
    renames_left = mode < 4 ? mode : 100;
    const rda_status st = rda_out_files_replace(jobs, 4, failing_rename, &err);
    if (mode == 6) {
      assert_int_equal(st, RDA_OK);
      assert_true(has_text(a, "new-a") && has_text(b, "new-b") && has_text(c, "new-c"));
      assert_true(has_text(d, "new-d"));
      assert_int_equal(rt_count_entries(f->dir), 5);
      unlink(b);
    } else {
      assert_int_equal(st, RDA_ERR_IO);
      const char *named = paths[mode < 4 ? mode : mode == 4 ? 2 : 1];
      if (strncmp(err.msg, named, strlen(named)) != 0 || strstr(err.msg, "partial") != NULL ||
          strstr(err.msg, ".rdagen-") != NULL) {
        fprintf(stderr, "mode %d: %s\n", mode, err.msg);
        fail();
      }
      assert_true(has_text(a, "old-a") && has_text(c, "old-c") && has_text(d, "old-d"));
      assert_true(inode_of(a) == ia && inode_of(c) == ic && inode_of(d) == id);
      if (mode == 5) {
        struct stat sb;
        assert_int_equal(lstat(b, &sb), 0);
        assert_true(S_ISDIR(sb.st_mode));
        assert_int_equal(rt_count_entries(b), 0);
        assert_int_equal(rmdir(b), 0);
      }
      assert_false(rt_exists(b));
      assert_int_equal(rt_count_entries(f->dir), 4); /* a, c, d, d-link */
    }
    struct stat sl;
    assert_int_equal(lstat(dl, &sl), 0);
    assert_true(S_ISLNK(sl.st_mode));
  }
  free(a), free(b), free(c), free(d), free(dl);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_npy_reads_versions_1_2_3, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_survives_mutated_files, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_decodes_float16_exactly, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_reads_float64_exactly, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_header_parsing_tolerates_spacing_order_and_quotes,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_reads_scalar_and_empty_shapes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_rejects_each_bad_header, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_rejects_nul_in_strings_reads_zero_dims, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_npy_long_path_keeps_the_reason, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_rejects_bad_magic_version_and_truncation, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_npy_pipe_reads_what_arrives, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_rejects_missing_file_and_folder, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_write_then_read_round_trips, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_write_header_is_numpy_v1_padded_to_64, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_npy_write_replaces_existing_file_atomically, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_npy_write_failure_leaves_nothing_behind, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_npy_write_through_a_link_keeps_it, setup, teardown),
      cmocka_unit_test_setup_teardown(test_out_files_failure_restores_every_target, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
