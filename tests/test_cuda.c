/* test_cuda.c — the CUDA driver backend (a clear error with no driver, a real kernel when there
 * is a GPU; stream-ordered copies, events, streams and the device virtual-rank transport on the
 * GPU) and `rdagen emit` end to end: sources, cubins and a manifest that parses, zero
 * spills, sources rewritten only when changed, and exit codes 1 and 2 with no manifest. */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
// clang-format on

#include <ctype.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend.h"
#include "json.h"
#include "rda_test.h"
#include "rda_test_wgmma.h"
#include "transport.h"

/* NVRTC keeps process-lifetime allocations of its own; they are not rda's leaks. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
  return "leak:libnvrtc\nleak:libnvrtc-builtins\n";
}

/* --- a minimal JSON reader, enough to check the manifest --------------------------------- */

enum { JV_NULL, JV_BOOL, JV_NUM, JV_STR, JV_ARR, JV_OBJ };

typedef struct jv {
  int type;
  double num;
  char *str;   /* JV_STR */
  int n;       /* JV_ARR, JV_OBJ: count */
  char **keys; /* JV_OBJ */
  struct jv *items;
} jv;

typedef struct jparser {
  const char *p;
  int bad;
} jparser;

static void jv_free(jv *v) {
  if (v == NULL) return;
  free(v->str);
  for (int i = 0; i < v->n; ++i) {
    if (v->keys) free(v->keys[i]);
    jv_free(&v->items[i]);
  }
  free(v->keys);
  free(v->items);
  memset(v, 0, sizeof *v);
}

static void jp_ws(jparser *j) {
  while (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t') ++j->p;
}

static char *jp_string(jparser *j) {
  if (*j->p != '"') {
    j->bad = 1;
    return NULL;
  }
  ++j->p;
  size_t cap = 16, len = 0;
  char *s = malloc(cap);
  for (;;) {
    char c = *j->p++;
    if (c == '\0' || (unsigned char)c < 0x20) {
      j->bad = 1;
      free(s);
      return NULL;
    }
    if (c == '"') break;
    if (c == '\\') {
      const char e = *j->p++;
      switch (e) {
        case '"':
        case '\\':
        case '/': c = e; break;
        case 'n': c = '\n'; break;
        case 't': c = '\t'; break;
        case 'r': c = '\r'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'u':
          for (int k = 0; k < 4; ++k)
            if (!isxdigit((unsigned char)*j->p++)) j->bad = 1;
          c = '?';
          break;
        default:
          j->bad = 1;
          free(s);
          return NULL;
      }
    }
    if (len + 2 > cap) s = realloc(s, cap *= 2);
    s[len++] = c;
  }
  s[len] = '\0';
  return s;
}

static void jp_value(jparser *j, jv *v, int depth) {
  memset(v, 0, sizeof *v);
  jp_ws(j);
  if (depth > 32) {
    j->bad = 1;
    return;
  }
  const char c = *j->p;
  if (c == '{' || c == '[') {
    const int obj = c == '{';
    v->type = obj ? JV_OBJ : JV_ARR;
    ++j->p;
    jp_ws(j);
    if (*j->p == (obj ? '}' : ']')) {
      ++j->p;
      return;
    }
    for (;;) {
      v->items = realloc(v->items, (size_t)(v->n + 1) * sizeof *v->items);
      if (obj) v->keys = realloc(v->keys, (size_t)(v->n + 1) * sizeof *v->keys);
      if (obj) {
        jp_ws(j);
        v->keys[v->n] = jp_string(j);
        jp_ws(j);
        if (j->bad || *j->p != ':') {
          j->bad = 1;
          memset(&v->items[v->n], 0, sizeof *v->items);
          ++v->n;
          return;
        }
        ++j->p;
      }
      jp_value(j, &v->items[v->n], depth + 1);
      ++v->n;
      if (j->bad) return;
      jp_ws(j);
      if (*j->p == ',') {
        ++j->p;
        continue;
      }
      if (*j->p == (obj ? '}' : ']')) {
        ++j->p;
        return;
      }
      j->bad = 1;
      return;
    }
  }
  if (c == '"') {
    v->type = JV_STR;
    v->str = jp_string(j);
    return;
  }
  if (strncmp(j->p, "true", 4) == 0 || strncmp(j->p, "false", 5) == 0) {
    v->type = JV_BOOL;
    v->num = c == 't';
    j->p += c == 't' ? 4 : 5;
    return;
  }
  if (strncmp(j->p, "null", 4) == 0) {
    v->type = JV_NULL;
    j->p += 4;
    return;
  }
  if (c == '-' || isdigit((unsigned char)c)) {
    char *end = NULL;
    v->type = JV_NUM;
    v->num = strtod(j->p, &end);
    if (end == j->p) j->bad = 1;
    j->p = end;
    return;
  }
  j->bad = 1;
}

/* Parses a whole document; false (and *v empty) when it is not valid JSON. */
static bool jv_parse(const char *text, jv *v) {
  jparser j = {text, 0};
  jp_value(&j, v, 0);
  jp_ws(&j);
  if (j.bad || *j.p != '\0') {
    jv_free(v);
    return false;
  }
  return true;
}

static const jv *jv_get(const jv *o, const char *key) {
  if (o == NULL || o->type != JV_OBJ) return NULL;
  for (int i = 0; i < o->n; ++i)
    if (o->keys[i] && strcmp(o->keys[i], key) == 0) return &o->items[i];
  return NULL;
}

static void test_json_reader_rejects_malformed_documents(void **state) {
  (void)state;
  jv v;
  assert_true(jv_parse("{\"a\": [1, 2.5, \"x\\n\"], \"b\": {\"c\": null, \"d\": true}}", &v));
  assert_int_equal(jv_get(&v, "a")->n, 3);
  assert_string_equal(jv_get(&v, "a")->items[2].str, "x\n");
  jv_free(&v);
  assert_false(jv_parse("{\"a\": [1, 2,]}", &v));
  assert_false(jv_parse("{\"a\" 1}", &v));
  assert_false(jv_parse("{\"a\": 1} x", &v));
  assert_false(jv_parse("", &v));
}

static void test_json_writer_escapes_nests_and_reads_back(void **state) {
  (void)state;
  rda_json w;
  rda_err err = {0};
  rda_json_init(&w);
  rda_json_object_begin(&w);
  rda_json_key(&w, "s");
  rda_json_string(&w, "quote\" back\\ nl\n tab\t bell\a");
  rda_json_key(&w, "list");
  rda_json_array_begin(&w);
  rda_json_int(&w, -42);
  rda_json_double(&w, 0.125);
  rda_json_double(&w, INFINITY);
  rda_json_bool(&w, 1);
  rda_json_array_begin(&w);
  rda_json_array_end(&w);
  rda_json_object_begin(&w);
  rda_json_object_end(&w);
  rda_json_array_end(&w);
  rda_json_object_end(&w);
  assert_int_equal(rda_json_finish(&w, &err), RDA_OK);
  jv doc;
  if (!jv_parse(w.buf, &doc)) fail_msg("not JSON:\n%s", w.buf);
  assert_string_equal(jv_get(&doc, "s")->str, "quote\" back\\ nl\n tab\t bell?");
  const jv *list = jv_get(&doc, "list");
  assert_int_equal(list->n, 6);
  assert_true(list->items[0].type == JV_NUM && list->items[0].num == -42.0);
  assert_true(list->items[1].type == JV_NUM && list->items[1].num == 0.125);
  assert_int_equal(list->items[2].type, JV_NULL); /* not a number JSON can hold */
  assert_int_equal(list->items[3].type, JV_BOOL);
  assert_true(list->items[4].type == JV_ARR && list->items[4].n == 0);
  assert_true(list->items[5].type == JV_OBJ && list->items[5].n == 0);
  jv_free(&doc);
  rda_json_free(&w);

  /* Misuse is reported, not written: a value without a key, an unclosed container. */
  rda_json_init(&w);
  rda_json_object_begin(&w);
  rda_json_int(&w, 1);
  rda_json_object_end(&w);
  assert_int_equal(rda_json_finish(&w, &err), RDA_ERR_INTERNAL);
  rda_json_free(&w);
  rda_json_init(&w);
  rda_json_array_begin(&w);
  rda_err_clear(&err);
  assert_int_equal(rda_json_finish(&w, &err), RDA_ERR_INTERNAL);
  rda_json_free(&w);
}

/* --- the driver backend ------------------------------------------------------------------ */

typedef struct saxpy_params {
  float *y;
  const float *x;
  float a;
  int n;
} saxpy_params;

/* y = a x + y through dynamic shared memory (64 KiB: above the 48 KiB default). */
static const char saxpy_src[] =
    "struct saxpy_params { float *y; const float *x; float a; int n; };\n"
    "extern \"C\" __global__ void rda_test_saxpy(const saxpy_params p) {\n"
    "  extern __shared__ float s[];\n"
    "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  s[16383 - threadIdx.x] = i < p.n ? p.x[i] : 0.0f;\n"
    "  __syncthreads();\n"
    "  if (i < p.n) p.y[i] = p.a * s[16383 - threadIdx.x] + p.y[i];\n"
    "}\n";

static void run_saxpy_on_gpu(rda_backend *b) {
  rda_err err = {0};
  rda_hw hw;
  assert_int_equal(rda_backend_cuda_hw(b, &hw, &err), RDA_OK);
  print_message("GPU: %s sm_%d, %d SMs, %d B smem/block\n", hw.name, hw.arch, hw.sm_count,
                hw.smem_per_block);
  assert_int_equal(hw.live, 1);
  assert_int_equal(hw.arch, b->arch);
  assert_true(hw.sm_count > 0 && hw.smem_per_block >= 48 * 1024 && hw.smem_per_sm > 0);
  assert_true(hw.regs_per_sm > 0 && hw.regs_per_block > 0 && hw.max_threads_per_sm > 0);

  rda_variant v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "rda_test_saxpy");
  snprintf(v.kind, sizeof v.kind, "fwd");
  v.source = (char *)(uintptr_t)saxpy_src;
  v.threads = 256;
  v.smem_bytes = 64 * 1024;
  rda_module *m = NULL;
  if (b->load(b, &v, &m, &err) != RDA_OK) fail_msg("load: %s", err.msg);

  enum { N = 1000 };
  float x[N], y[N], out[N];
  for (int i = 0; i < N; ++i) {
    x[i] = (float)rt_rng_normal(rt_global_rng());
    y[i] = (float)rt_rng_normal(rt_global_rng());
  }
  void *dx = NULL, *dy = NULL;
  assert_int_equal(b->alloc(b, sizeof x, &dx, &err), RDA_OK);
  assert_int_equal(b->alloc(b, sizeof y, &dy, &err), RDA_OK);
  assert_int_equal(b->upload(b, dx, x, sizeof x, &err), RDA_OK);
  assert_int_equal(b->upload(b, dy, y, sizeof y, &err), RDA_OK);
  saxpy_params p = {(float *)dy, (const float *)dx, 1.5f, N};
  const unsigned grid[3] = {(N + 255) / 256, 1, 1};
  if (b->launch(b, m, grid, 256, 64 * 1024, &p, sizeof p, &err) != RDA_OK)
    fail_msg("launch: %s", err.msg);
  assert_int_equal(b->synchronize(b, &err), RDA_OK);
  assert_int_equal(b->download(b, out, dy, sizeof out, &err), RDA_OK);
  for (int i = 0; i < N; ++i) assert_float_equal(out[i], 1.5f * x[i] + y[i], 1e-5f);
  b->free(b, dx);
  b->free(b, dy);
  b->unload(b, m);
}

static void test_cuda_open_fails_clearly_without_a_driver_or_runs_a_kernel(void **state) {
  (void)state;
  rda_backend *b = NULL;
  rda_err err = {0};
  const rda_status s = rda_backend_cuda_open(&b, 0, &err);
  if (s == RDA_OK) {
    assert_non_null(b);
    assert_string_equal(b->name, "cuda");
    run_saxpy_on_gpu(b);
    b->destroy(b);
    return;
  }
  assert_null(b);
  print_message("no GPU: %s\n", err.msg);
  assert_int_not_equal(s, RDA_ERR_INTERNAL);
  assert_null(strchr(err.msg, '\n'));
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    assert_int_equal(s, RDA_ERR_CUDA);
    assert_non_null(strstr(err.msg, "no CUDA driver: libcuda.so.1: "));
  } else {
    /* A driver but no usable GPU: the failing call is named. */
    dlclose(lib);
    assert_true(s == RDA_ERR_CUDA || s == RDA_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "cu"));
  }
  /* A second attempt fails the same way (the driver is looked up once). */
  rda_err again = {0};
  assert_int_equal(rda_backend_cuda_open(&b, 0, &again), s);
  assert_string_equal(again.msg, err.msg);
}

static void test_cuda_open_rejects_a_negative_ordinal(void **state) {
  (void)state;
  rda_backend *b = NULL;
  rda_err err = {0};
  assert_int_equal(rda_backend_cuda_open(&b, -1, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_null(b);
  assert_non_null(strstr(err.msg, "-1"));
}

static void test_cuda_hw_rejects_what_is_not_a_cuda_backend(void **state) {
  (void)state;
  rda_backend fake;
  memset(&fake, 0, sizeof fake);
  fake.name = "emu";
  rda_hw hw;
  rda_err err = {0};
  assert_int_equal(rda_backend_cuda_hw(&fake, &hw, &err), RDA_ERR_INVALID_ARGUMENT);
  rda_err_clear(&err);
  assert_int_equal(rda_backend_cuda_hw(NULL, &hw, &err), RDA_ERR_INVALID_ARGUMENT);
}

/* --- stream-ordered operations and the device transport (GPU only) ----------------------- */

/* The cuda backend on GPU 0, or NULL (the caller skips) when there is none. */
static rda_backend *open_gpu(void) {
  rda_backend *b = NULL;
  rda_err err = {0};
  if (rda_backend_cuda_open(&b, 0, &err) != RDA_OK) {
    print_message("skipped: %s\n", err.msg);
    return NULL;
  }
  return b;
}

/* Host-wait for everything enqueued so far on b's current stream, through an event. */
static rda_status sync_current(rda_backend *b, void *ev, rda_err *err) {
  int done = 0;
  RDA_TRY(b->event_record(b, ev, err));
  while (!done) RDA_TRY(b->event_query(b, ev, &done, err));
  return RDA_OK;
}

static void test_cuda_stream_ops_order_work_across_streams(void **state) {
  (void)state;
  rda_backend *b = open_gpu();
  if (b == NULL) skip();
  rda_err err = {0};
  enum { N = 32 << 20 }; /* large enough that an unordered copy would overtake the memset */
  unsigned char *host = malloc(N), *back = malloc(N);
  assert_non_null(host);
  assert_non_null(back);
  for (size_t i = 0; i < N; i++) host[i] = (unsigned char)rt_rng_next(rt_global_rng());
  void *x = NULL, *y = NULL, *side = NULL, *ev1 = NULL, *ev2 = NULL, *ev3 = NULL;
  assert_int_equal(b->alloc(b, N, &x, &err), RDA_OK);
  assert_int_equal(b->alloc(b, N, &y, &err), RDA_OK);
  assert_int_equal(b->stream_create(b, &side, &err), RDA_OK);
  assert_int_equal(b->event_create(b, &ev1, &err), RDA_OK);
  assert_int_equal(b->event_create(b, &ev2, &err), RDA_OK);
  assert_int_equal(b->event_create(b, &ev3, &err), RDA_OK);
  assert_non_null(side);
  assert_true(ev1 != NULL && ev2 != NULL && ev1 != ev2);
  int done = 0;
  assert_int_equal(b->event_query(b, ev3, &done, &err), RDA_OK); /* never recorded: done */
  assert_int_equal(done, 1);
  for (int round = 0; round < 4; round++) {
    const int value = 0x11 * (round + 1);
    assert_int_equal(b->upload(b, x, host, N, &err), RDA_OK);
    /* The backend's stream overwrites x; the side stream copies x to y only after that. */
    assert_int_equal(b->memset_async(b, y, 0xEE, N, &err), RDA_OK);
    assert_int_equal(b->memset_async(b, x, value, N, &err), RDA_OK);
    assert_int_equal(b->event_record(b, ev1, &err), RDA_OK);
    assert_null(b->set_stream(b, side)); /* the previous choice: none */
    assert_int_equal(b->stream_wait_event(b, ev1, &err), RDA_OK);
    assert_int_equal(b->copy_async(b, y, x, N, &err), RDA_OK);
    assert_int_equal(b->event_record(b, ev2, &err), RDA_OK);
    assert_ptr_equal(b->set_stream(b, NULL), side);
    /* Downloads run on the backend's stream: make it wait for the side stream's copy. */
    assert_int_equal(b->stream_wait_event(b, ev2, &err), RDA_OK);
    assert_int_equal(b->download(b, back, y, N, &err), RDA_OK);
    assert_int_equal(b->event_query(b, ev2, &done, &err), RDA_OK);
    assert_int_equal(done, 1);
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) bad += back[i] != (unsigned char)value;
    if (bad != 0) fail_msg("round %d: %zu of %d bytes not ordered after the memset", round, bad, N);
  }
  /* A copy of random bytes on the current stream, checked byte for byte. */
  assert_int_equal(b->upload(b, x, host, N, &err), RDA_OK);
  assert_int_equal(b->copy_async(b, y, x, N, &err), RDA_OK);
  if (sync_current(b, ev3, &err) != RDA_OK) fail_msg("%s", err.msg);
  assert_int_equal(b->download(b, back, y, N, &err), RDA_OK);
  assert_memory_equal(back, host, N);
  /* Errors are one line; NULL handles are argument errors. */
  rda_err_clear(&err);
  assert_int_equal(b->event_record(b, NULL, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_null(strchr(err.msg, '\n'));
  b->event_destroy(b, ev1);
  b->event_destroy(b, ev2);
  b->event_destroy(b, ev3);
  b->event_destroy(b, NULL);
  b->stream_destroy(b, side);
  b->stream_destroy(b, NULL);
  b->free(b, x);
  b->free(b, y);
  b->destroy(b);
  free(host);
  free(back);
}

/* P virtual ranks on one GPU: each rank's compute stream (rda_backend_cuda_use_stream) writes
 * its send blocks and poisons its receive blocks right before group_end, and reads what
 * arrived right after wait, without any host synchronization in between. */
typedef struct gpu_rank {
  rda_device_world *world;
  rda_backend *b;
  int rank, P, rounds;
  rda_status status;
  char msg[1024];
  long long bad;
  uint64_t sent, received;
} gpu_rank;

enum { GPU_BLOCK = 1 << 20 };

static unsigned char gpu_byte(int from, int to, int round, size_t i) {
  return (unsigned char)((size_t)from * 131u + (size_t)to * 17u + (size_t)round * 7u + i * 13u +
                         (i >> 8));
}

static void *gpu_rank_main(void *arg) {
  gpu_rank *c = arg;
  rda_backend *b = c->b;
  rda_err err = {0};
  rda_transport *t = NULL;
  const size_t all = (size_t)c->P * GPU_BLOCK;
  unsigned char *host = malloc(all), *back = malloc(all);
  void *stage = NULL, *sbuf = NULL, *rbuf = NULL, *compute = NULL, *ev = NULL;
  if (host == NULL || back == NULL) abort();
  if (b->alloc(b, all, &stage, &err) != RDA_OK || b->alloc(b, all, &sbuf, &err) != RDA_OK ||
      b->alloc(b, all, &rbuf, &err) != RDA_OK || b->stream_create(b, &compute, &err) != RDA_OK ||
      b->event_create(b, &ev, &err) != RDA_OK)
    goto done;
  rda_backend_cuda_use_stream(compute);
  if (rda_device_world_join(c->world, c->rank, 77, b, &t, &err) != RDA_OK) goto done;
  for (int round = 0; round < c->rounds && err.status == RDA_OK; round++) {
    for (int q = 0; q < c->P; q++)
      for (size_t i = 0; i < GPU_BLOCK; i++)
        host[(size_t)q * GPU_BLOCK + i] = gpu_byte(c->rank, q, round, i);
    /* Staged outside the ring (upload waits for it), then moved on the compute stream. */
    if (b->upload(b, stage, host, all, &err) != RDA_OK) break;
    if (b->copy_async(b, sbuf, stage, all, &err) != RDA_OK ||
        b->memset_async(b, rbuf, 0xEE, all, &err) != RDA_OK)
      break;
    if (rda_transport_group_start(t, &err) != RDA_OK) break;
    for (int k = 0; k < c->P && err.status == RDA_OK; k++) {
      const int q = (c->rank + k) % c->P; /* every rank starts with a different peer */
      rda_transport_recv(t, q, (char *)rbuf + (size_t)q * GPU_BLOCK, GPU_BLOCK, &err);
      rda_transport_send(t, q, (char *)sbuf + (size_t)q * GPU_BLOCK, GPU_BLOCK, &err);
    }
    if (err.status != RDA_OK || rda_transport_group_end(t, &err) != RDA_OK ||
        rda_transport_wait(t, &err) != RDA_OK)
      break;
    /* On the compute stream: ordered after the copies by wait. */
    if (b->copy_async(b, stage, rbuf, all, &err) != RDA_OK) break;
    if (sync_current(b, ev, &err) != RDA_OK) break;
    if (b->download(b, back, stage, all, &err) != RDA_OK) break;
    for (int q = 0; q < c->P; q++)
      for (size_t i = 0; i < GPU_BLOCK; i++)
        c->bad += back[(size_t)q * GPU_BLOCK + i] != gpu_byte(q, c->rank, round, i);
  }
done:
  if (t != NULL && err.status != RDA_OK) rda_transport_abort(t, err.msg); /* peers fail fast */
  if (t != NULL) rda_transport_bytes(t, &c->sent, &c->received);
  rda_transport_destroy(t);
  /* After a failure the compute stream may still run a copy or memset on these buffers (free
   * synchronizes only the backend's own stream): drain it before they are freed. */
  if (compute != NULL && ev != NULL) {
    rda_err ignored = {0};
    (void)sync_current(b, ev, &ignored);
  }
  rda_backend_cuda_own_stream();
  b->event_destroy(b, ev);
  b->stream_destroy(b, compute);
  b->free(b, stage), b->free(b, sbuf), b->free(b, rbuf);
  free(host), free(back);
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

static void test_cuda_device_transport_moves_blocks_between_virtual_ranks(void **state) {
  (void)state;
  rda_backend *b = open_gpu();
  if (b == NULL) skip();
  enum { P = 4, ROUNDS = 6 };
  rda_device_world *w = NULL;
  rda_err err = {0};
  assert_int_equal(rda_device_world_create(P, 30.0, &w, &err), RDA_OK);
  gpu_rank ctx[P];
  pthread_t th[P];
  memset(ctx, 0, sizeof ctx);
  for (int x = 0; x < P; x++) {
    ctx[x].world = w, ctx[x].b = b, ctx[x].rank = x, ctx[x].P = P, ctx[x].rounds = ROUNDS;
    assert_int_equal(pthread_create(&th[x], NULL, gpu_rank_main, &ctx[x]), 0);
  }
  for (int x = 0; x < P; x++) pthread_join(th[x], NULL);
  rda_device_world_destroy(w);
  b->destroy(b);
  for (int x = 0; x < P; x++) {
    if (ctx[x].status != RDA_OK) fail_msg("rank %d: %s", x, ctx[x].msg);
    if (ctx[x].bad != 0) fail_msg("rank %d: %lld bytes wrong", x, ctx[x].bad);
    assert_int_equal(ctx[x].sent, (uint64_t)ROUNDS * P * GPU_BLOCK);
    assert_int_equal(ctx[x].received, (uint64_t)ROUNDS * P * GPU_BLOCK);
  }
}

/* --- wgmma on sm_90a: tests/kernels/emu_wgmma.cu natively (GPU of compute capability 9.0) ----
 * The same kernel test_emu.c checks the emulator's wgmma model with, on hardware: this is what
 * validates the descriptor semantics the model (templates/emu/wgmma_emu.h) follows. */

/* Must match emu_test_params of tests/kernels/emu_wgmma.cu. */
typedef struct wg_params {
  const void *in0, *in1, *in2;
  void *out0, *out1;
  long long n;
  int op;
  int pad;
} wg_params;

/* A random 16-bit value of magnitude in [2^-3, 2^3), and its exact value. */
static uint16_t wg_random(int f16, double *value) {
  const uint64_t r = rt_rng_next(rt_global_rng());
  const int sign = (int)(r & 1), e = (int)((r >> 1) % 6) - 3;
  if (f16) {
    const int m = (int)((r >> 8) & 0x3ff);
    *value = (sign ? -1 : 1) * ldexp(1024 + m, e - 10);
    return (uint16_t)(sign << 15 | (e + 15) << 10 | m);
  }
  const int m = (int)((r >> 8) & 0x7f);
  *value = (sign ? -1 : 1) * ldexp(128 + m, e - 7);
  return (uint16_t)(sign << 15 | (e + 127) << 7 | m);
}

/* Runs one case on the GPU; every element of every thread's d against a float64 reference.
 * A mismatch names the case, thread, register, D element, and which reference element (if
 * any) the value matches instead: the signature of a layout misreading. Returns 0 when good. */
static int wg_run_case(rda_backend *b, rda_module *m, rt_wg_case c) {
  rda_err err = {0};
  const int K = 16 * c.steps, N = c.n, T = 128 * c.warpgroups;
  rt_wg_place(&c);
  const int bytes = (rt_wg_extent(&c.b, N, K) + 15) / 16 * 16;
  uint16_t *img = malloc((size_t)bytes);
  double *val = malloc(sizeof(double) * (size_t)bytes / 2);
  double *A = malloc(sizeof(double) * 64 * (size_t)K),
         *B = malloc(sizeof(double) * (size_t)(K * N));
  uint16_t *Abits = malloc(sizeof(uint16_t) * 64 * (size_t)K);
  const size_t dn = (size_t)T * (size_t)(N / 2);
  float *d0 = malloc(sizeof(float) * dn), *d = malloc(sizeof(float) * dn);
  double *ref = malloc(sizeof(double) * 64 * (size_t)N),
         *mag = malloc(sizeof(double) * 64 * (size_t)N);
  assert_true(img && val && A && B && Abits && d0 && d && ref && mag);
  for (int i = 0; i < bytes / 2; ++i) img[i] = wg_random(c.f16, &val[i]);
  for (int r = 0; r < 64; ++r)
    for (int k = 0; k < K; ++k) {
      if (c.rs) {
        Abits[r * K + k] = wg_random(c.f16, &A[r * K + k]);
      } else {
        Abits[r * K + k] = img[rt_wg_phys(&c.a, r, k) / 2];
        A[r * K + k] = val[rt_wg_phys(&c.a, r, k) / 2];
      }
    }
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n) B[k * N + n] = val[rt_wg_phys(&c.b, n, k) / 2];
  size_t cfg_bytes;
  int *cfg = rt_wg_config(&c, Abits, &cfg_bytes);
  assert_non_null(cfg);
  for (size_t i = 0; i < dn; ++i) {
    d0[i] = c.acc ? (float)rt_rng_normal(rt_global_rng()) : NAN;
    d[i] = -12345.0f;
  }
  void *dimg = NULL, *dcfg = NULL, *dd0 = NULL, *dd = NULL;
  assert_int_equal(b->alloc(b, (size_t)bytes, &dimg, &err), RDA_OK);
  assert_int_equal(b->alloc(b, cfg_bytes, &dcfg, &err), RDA_OK);
  assert_int_equal(b->alloc(b, sizeof(float) * dn, &dd0, &err), RDA_OK);
  assert_int_equal(b->alloc(b, sizeof(float) * dn, &dd, &err), RDA_OK);
  assert_int_equal(b->upload(b, dimg, img, (size_t)bytes, &err), RDA_OK);
  assert_int_equal(b->upload(b, dcfg, cfg, cfg_bytes, &err), RDA_OK);
  assert_int_equal(b->upload(b, dd0, d0, sizeof(float) * dn, &err), RDA_OK);
  assert_int_equal(b->upload(b, dd, d, sizeof(float) * dn, &err), RDA_OK);
  wg_params p = {.in0 = dimg, .in1 = dcfg, .in2 = dd0, .out0 = dd, .out1 = dd, .n = bytes};
  const unsigned grid[3] = {1, 1, 1};
  if (b->launch(b, m, grid, (unsigned)T, (unsigned)bytes + 1024, &p, sizeof p, &err) != RDA_OK ||
      b->synchronize(b, &err) != RDA_OK)
    fail_msg("wgmma %s: launch: %s", c.what, err.msg);
  assert_int_equal(b->download(b, d, dd, sizeof(float) * dn, &err), RDA_OK);
  /* The product without d, for the "matches another element" diagnosis. */
  for (int r = 0; r < 64; ++r)
    for (int n = 0; n < N; ++n) {
      double s = 0, a = 0;
      for (int k = 0; k < K; ++k)
        s += A[r * K + k] * B[k * N + n], a += fabs(A[r * K + k] * B[k * N + n]);
      ref[r * N + n] = s, mag[r * N + n] = a;
    }
  int bad = 0;
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < N / 2; ++e) {
      const int w = (t / 32) % 4, g = (t % 32) / 4, q = t % 4;
      const int row = 16 * w + g + 8 * ((e % 4) >> 1), col = 8 * (e / 4) + 2 * q + (e & 1);
      const size_t at = (size_t)t * (size_t)(N / 2) + (size_t)e;
      const double old = c.acc ? d0[at] : 0.0, want = old + ref[row * N + col];
      const double tol = 4 * K * FLT_EPSILON * (fabs(old) + mag[row * N + col]);
      if (fabs(d[at] - want) <= tol) continue;
      if (bad++ >= 8) continue;
      char also[96] = "";
      for (int r2 = 0; r2 < 64 && !also[0]; ++r2)
        for (int n2 = 0; n2 < N; ++n2)
          if (fabs(d[at] - old - ref[r2 * N + n2]) <= tol) {
            snprintf(also, sizeof also, "; it equals old d + (A B)[%d][%d]", r2, n2);
            break;
          }
      print_message(
          "wgmma %s (%s, N=%d, %s): thread %d d[%d] = D[%d][%d] = %.9g, expected %.9g "
          "(tol %.2g)%s\n",
          c.what, c.f16 ? "f16" : "bf16", N, c.rs ? "rs" : "ss", t, e, row, col, d[at], want, tol,
          also);
    }
  if (bad) print_message("wgmma %s: %d mismatches\n", c.what, bad);
  b->free(b, dimg), b->free(b, dcfg), b->free(b, dd0), b->free(b, dd);
  free(img), free(val), free(A), free(B), free(Abits), free(cfg), free(d0), free(d), free(ref),
      free(mag);
  return bad;
}

static void test_cuda_wgmma_matches_ptx_layouts_on_sm90(void **state) {
  (void)state;
  rda_backend *b = open_gpu();
  if (b == NULL) skip();
  rda_err err = {0};
  rda_hw hw;
  assert_int_equal(rda_backend_cuda_hw(b, &hw, &err), RDA_OK);
  if (hw.arch != 90) {
    print_message("skipped: wgmma needs sm_90 (this GPU is sm_%d)\n", hw.arch);
    b->destroy(b);
    skip();
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/kernels/emu_wgmma.cu", RDA_SOURCE_DIR);
  char *src = rt_read_file(path, NULL);
  assert_non_null(src);
  rda_variant v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "emu_wgmma");
  snprintf(v.kind, sizeof v.kind, "test");
  v.source = src;
  v.threads = 256;
  v.smem_bytes = 64 * 1024;
  rda_module *m = NULL;
  if (b->load(b, &v, &m, &err) != RDA_OK) fail_msg("load emu_wgmma: %s", err.msg);
  int bad = 0;
  for (int f16 = 0; f16 < 2; ++f16)
    for (int n = 64; n <= 128; n += 64) {
      rt_wg_case cases[RT_WG_NCASES];
      const int nc = rt_wg_layout_cases(f16, n, cases);
      for (int i = 0; i < nc; ++i) bad += wg_run_case(b, m, cases[i]);
    }
  b->unload(b, m);
  b->destroy(b);
  free(src);
  assert_int_equal(bad, 0);
}

/* --- rdagen emit ------------------------------------------------------------------------- */

static const char small_config[] =
    "-- two branches, one dense and one dilated\n"
    "return { heads = 4, kv_heads = 2, head_dim = 64, dtype = \"bf16\",\n"
    "         segments = { 128, 256 }, dilations = { 1, 2 }, causal = true }\n";

typedef struct emit_fixture {
  char *dir;    /* temp folder */
  char *config; /* dir/cfg.lua */
  char *out;    /* dir/out (not created) */
} emit_fixture;

static int emit_setup(void **state) {
  emit_fixture *f = calloc(1, sizeof *f);
  if (f == NULL || (f->dir = rt_mkdtemp()) == NULL) return -1;
  f->config = rt_path(f->dir, "cfg.lua");
  f->out = rt_path(f->dir, "out");
  if (!rt_write_file(f->config, small_config, strlen(small_config))) return -1;
  *state = f;
  return 0;
}

static int emit_teardown(void **state) {
  emit_fixture *f = *state;
  if (f == NULL) return 0;
  rt_rmtree(f->dir);
  free(f->dir);
  free(f->config);
  free(f->out);
  free(f);
  return 0;
}

/* Runs rdagen with the given arguments (NULL-terminated after "emit"). */
static rt_proc run_emit(const char *first, ...) {
  char *argv[32];
  int n = 0;
  argv[n++] = (char *)(uintptr_t)RDAGEN_PATH;
  argv[n++] = (char *)(uintptr_t) "emit";
  va_list ap;
  va_start(ap, first);
  for (const char *a = first; a != NULL && n < 31; a = va_arg(ap, const char *))
    argv[n++] = (char *)(uintptr_t)a;
  va_end(ap);
  argv[n] = NULL;
  rt_proc p;
  assert_true(rt_run(argv, 600, &p));
  return p;
}

static bool has_manifest(const char *out) {
  char *m = rt_path(out, "manifest.json");
  const bool e = rt_exists(m);
  free(m);
  return e;
}

/* Checks one manifest entry against the files in out; returns its arch. */
static const char *check_entry(const jv *k, const char *out) {
  static const char *const keys[] = {"name",      "arch",        "entry",      "cubin",
                                     "registers", "spill_bytes", "smem_bytes", "compile_s",
                                     "source_sha256", "tile",     "tuned",      "cubin_sha256"};
  const size_t nkeys = sizeof keys / sizeof keys[0];
  assert_int_equal(k->type, JV_OBJ);
  const jv *ptx_key = jv_get(k, "ptx"); /* listed with --ptx */
  assert_int_equal(k->n, nkeys + (ptx_key != NULL));
  if (ptx_key != NULL) assert_int_equal(ptx_key->type, JV_STR);
  for (size_t i = 0; i < nkeys; ++i)
    if (jv_get(k, keys[i]) == NULL) fail_msg("manifest entry without \"%s\"", keys[i]);
  const jv *name = jv_get(k, "name"), *arch = jv_get(k, "arch"), *entry = jv_get(k, "entry");
  const jv *cubin = jv_get(k, "cubin");
  assert_int_equal(name->type, JV_STR);
  assert_int_equal(arch->type, JV_STR);
  assert_int_equal(entry->type, JV_STR);
  assert_int_equal(cubin->type, JV_STR);
  assert_int_equal(jv_get(k, "source_sha256")->type, JV_STR); /* what RDA_KERNEL_PATH matches */
  assert_int_equal(strlen(jv_get(k, "source_sha256")->str), 64);
  assert_string_equal(entry->str, name->str);
  assert_true(strcmp(arch->str, "sm_80") == 0 || strcmp(arch->str, "sm_90") == 0);
  for (size_t i = 4; i < 8; ++i) assert_int_equal(jv_get(k, keys[i])->type, JV_NUM);
  assert_true(jv_get(k, "registers")->num > 0);
  if (jv_get(k, "spill_bytes")->num != 0)
    fail_msg("%s %s spills %g bytes", name->str, arch->str, jv_get(k, "spill_bytes")->num);
  assert_true(jv_get(k, "smem_bytes")->num >= 0);
  assert_true(jv_get(k, "compile_s")->num > 0);
  /* The attention kernels name their tile; no tuning database is set up here, so none is tuned. */
  assert_int_equal(jv_get(k, "tile")->type, JV_STR);
  assert_int_equal(jv_get(k, "tuned")->type, JV_BOOL);
  assert_false(jv_get(k, "tuned")->num != 0);
  const bool attention = strstr(name->str, "rda_fwd") == name->str ||
                         strstr(name->str, "rda_bwd_dkdv") == name->str ||
                         strstr(name->str, "rda_bwd_dq") == name->str;
  if (attention != (jv_get(k, "tile")->str[0] != '\0'))
    fail_msg("%s: tile \"%s\"", name->str, jv_get(k, "tile")->str);

  char expect[256];
  snprintf(expect, sizeof expect, "%s.%s.cubin", name->str, arch->str);
  assert_string_equal(cubin->str, expect);
  char *path = rt_path(out, cubin->str);
  size_t len = 0;
  char *img = rt_read_file(path, &len);
  if (img == NULL) fail_msg("manifest lists %s, which does not exist", path);
  assert_true(len > 4);
  assert_memory_equal(img,
                      "\x7f"
                      "ELF",
                      4);
  free(img);
  free(path);
  snprintf(expect, sizeof expect, "%s.cu", name->str);
  path = rt_path(out, expect);
  char *src = rt_read_file(path, NULL);
  assert_non_null(src);
  assert_non_null(strstr(src, name->str));
  free(src);
  free(path);
  return arch->str;
}

static void test_emit_writes_sources_cubins_and_a_manifest(void **state) {
  emit_fixture *f = *state;
  rt_proc p =
      run_emit(f->config, "--arch", "sm_80", "--arch=sm_90", "--out", f->out, "--ptx", NULL);
  if (p.exit_code != 0) fail_msg("rdagen emit exited %d: %s", p.exit_code, p.err);
  rt_proc_free(&p);

  char *mpath = rt_path(f->out, "manifest.json");
  char *text = rt_read_file(mpath, NULL);
  assert_non_null(text);
  jv doc;
  if (!jv_parse(text, &doc)) fail_msg("manifest.json is not JSON:\n%s", text);
  assert_int_equal(doc.type, JV_OBJ);
  assert_int_equal(doc.n, 1);
  const jv *kernels = jv_get(&doc, "kernels");
  assert_non_null(kernels);
  assert_int_equal(kernels->type, JV_ARR);
  /* Per arch: a dense and a dilated forward kernel, init and cast. */
  assert_true(kernels->n >= 8);
  int per_arch[2] = {0, 0}, fwd = 0;
  for (int i = 0; i < kernels->n; ++i) {
    const char *arch = check_entry(&kernels->items[i], f->out);
    ++per_arch[strcmp(arch, "sm_90") == 0];
    const char *name = jv_get(&kernels->items[i], "name")->str;
    fwd += strncmp(name, "rda_fwd_", 8) == 0;
    char ptx[256];
    snprintf(ptx, sizeof ptx, "%s.%s.ptx", name, arch);
    char *path = rt_path(f->out, ptx);
    char *text_ptx = rt_read_file(path, NULL);
    if (text_ptx == NULL) fail_msg("--ptx did not write %s", path);
    assert_non_null(strstr(text_ptx, ".entry"));
    free(text_ptx);
    free(path);
  }
  assert_int_equal(per_arch[0], per_arch[1]);
  assert_true(fwd >= 4);
  jv_free(&doc);
  free(text);
  free(mpath);
}

static void test_emit_rewrites_a_source_only_when_it_changed(void **state) {
  emit_fixture *f = *state;
  rt_proc p = run_emit(f->config, "--arch", "sm_90", "--out", f->out, NULL);
  assert_int_equal(p.exit_code, 0);
  rt_proc_free(&p);
  char *cu = rt_path(f->out, "rda_init.cu");
  struct stat before, after;
  assert_int_equal(stat(cu, &before), 0);
  p = run_emit(f->config, "--arch", "sm_90", "--out", f->out, NULL);
  assert_int_equal(p.exit_code, 0);
  rt_proc_free(&p);
  assert_int_equal(stat(cu, &after), 0);
  assert_true(before.st_ino == after.st_ino); /* not replaced */
  /* A changed file is put back. */
  assert_true(rt_write_file(cu, "stale\n", 6));
  p = run_emit(f->config, "--arch", "sm_90", "--out", f->out, NULL);
  assert_int_equal(p.exit_code, 0);
  rt_proc_free(&p);
  char *src = rt_read_file(cu, NULL);
  assert_non_null(strstr(src, "rda_init"));
  free(src);
  free(cu);
  assert_true(has_manifest(f->out));
}

static void expect_usage_error(emit_fixture *f, rt_proc p, const char *what) {
  if (p.exit_code != 2) fail_msg("%s: exit %d, expected 2; stderr: %s", what, p.exit_code, p.err);
  assert_non_null(strstr(p.err, "rdagen: "));
  assert_false(has_manifest(f->out));
  rt_proc_free(&p);
}

static void test_emit_bad_usage_exits_2_without_a_manifest(void **state) {
  emit_fixture *f = *state;
  expect_usage_error(f, run_emit(f->config, "--arch", "sm_90", NULL), "missing --out");
  expect_usage_error(f, run_emit(f->config, "--out", f->out, NULL), "missing --arch");
  expect_usage_error(f, run_emit("--arch", "sm_90", "--out", f->out, NULL), "missing CONFIG");
  expect_usage_error(f, run_emit(f->config, "--arch", "sm_7x", "--out", f->out, NULL), "sm_7x");
  expect_usage_error(f, run_emit(f->config, "--arch", "foo", "--out", f->out, NULL), "foo");
  expect_usage_error(f, run_emit(f->config, "--arch", "sm_95", "--out", f->out, NULL),
                     "an arch NVRTC cannot target");
  expect_usage_error(f, run_emit(f->config, "--arch", "sm_75", "--out", f->out, NULL),
                     "an arch without a built-in profile");
  expect_usage_error(f, run_emit(f->config, "--arch", "sm_90", "--out", f->out, "--bogus", NULL),
                     "an unknown flag");
  expect_usage_error(f, run_emit(f->config, "--arch", NULL), "--arch without a value");
}

static void expect_input_error(emit_fixture *f, rt_proc p, const char *what) {
  if (p.exit_code != 1) fail_msg("%s: exit %d, expected 1; stderr: %s", what, p.exit_code, p.err);
  assert_int_equal(strncmp(p.err, "rdagen: error: ", 15), 0);
  assert_int_equal(rt_count_lines(p.err), 1);
  assert_false(has_manifest(f->out));
  rt_proc_free(&p);
}

static void test_emit_bad_config_exits_1_without_a_manifest(void **state) {
  emit_fixture *f = *state;
  char *bad = rt_path(f->dir, "bad.lua");
  static const char text[] =
      "return { heads = 4, head_dim = 48, dtype = \"bf16\", segments = { 64 }, dilations = { 1 } "
      "}\n";
  assert_true(rt_write_file(bad, text, strlen(text)));
  expect_input_error(f, run_emit(bad, "--arch", "sm_90", "--out", f->out, NULL), "head_dim 48");
  char *missing = rt_path(f->dir, "missing.lua");
  expect_input_error(f, run_emit(missing, "--arch", "sm_80", "--out", f->out, NULL),
                     "a missing config");
  free(bad);
  free(missing);
}

static void test_emit_out_that_is_a_file_exits_1(void **state) {
  emit_fixture *f = *state;
  /* --out is a file, not a folder: nothing can be written, and the file is left alone. */
  char *file_out = rt_path(f->dir, "cfg.lua");
  rt_proc p = run_emit(f->config, "--arch", "sm_80", "--out", file_out, NULL);
  assert_int_equal(p.exit_code, 1);
  assert_int_equal(strncmp(p.err, "rdagen: error: ", 15), 0);
  assert_non_null(strstr(p.err, "not a folder"));
  rt_proc_free(&p);
  char *cfg = rt_read_file(file_out, NULL);
  assert_string_equal(cfg, small_config);
  free(cfg);
  free(file_out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_json_reader_rejects_malformed_documents),
      cmocka_unit_test(test_json_writer_escapes_nests_and_reads_back),
      cmocka_unit_test(test_cuda_open_fails_clearly_without_a_driver_or_runs_a_kernel),
      cmocka_unit_test(test_cuda_open_rejects_a_negative_ordinal),
      cmocka_unit_test(test_cuda_hw_rejects_what_is_not_a_cuda_backend),
      cmocka_unit_test(test_cuda_stream_ops_order_work_across_streams),
      cmocka_unit_test(test_cuda_device_transport_moves_blocks_between_virtual_ranks),
      cmocka_unit_test(test_cuda_wgmma_matches_ptx_layouts_on_sm90),
      cmocka_unit_test_setup_teardown(test_emit_writes_sources_cubins_and_a_manifest, emit_setup,
                                      emit_teardown),
      cmocka_unit_test_setup_teardown(test_emit_rewrites_a_source_only_when_it_changed, emit_setup,
                                      emit_teardown),
      cmocka_unit_test_setup_teardown(test_emit_bad_usage_exits_2_without_a_manifest, emit_setup,
                                      emit_teardown),
      cmocka_unit_test_setup_teardown(test_emit_bad_config_exits_1_without_a_manifest, emit_setup,
                                      emit_teardown),
      cmocka_unit_test_setup_teardown(test_emit_out_that_is_a_file_exits_1, emit_setup,
                                      emit_teardown),
  };
  const char *filter = getenv("RDA_TEST_FILTER"); /* e.g. "*parses*" while developing */
  if (filter != NULL) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
