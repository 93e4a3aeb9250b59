/* rda_test_tensor.h — rda_tensor descriptors of contiguous test buffers, for the tests of the
 * public API (include after cmocka.h and rda.h): a descriptor that cannot be made fails the
 * test. */
#ifndef RDA_TEST_TENSOR_H
#define RDA_TEST_TENSOR_H

/* [b, n, h, d] of dtype dt: q, k, v, o, dout and the gradients. */
static inline void rt_tensor4(rda_tensor *t, void *data, rda_dtype dt, long long b, long long n,
                              long long h, long long d) {
  const long long shape[4] = {b, n, h, d};
  assert_int_equal(rda_tensor_contiguous(t, data, dt, 4, shape), RDA_OK);
}

/* [b, h, n] fp32: lse and dlse. */
static inline void rt_tensor3(rda_tensor *t, void *data, long long b, long long h, long long n) {
  const long long shape[3] = {b, h, n};
  assert_int_equal(rda_tensor_contiguous(t, data, RDA_FP32, 3, shape), RDA_OK);
}

/* The ten tensors of an attention call over n rows: q, k, v and dout of dtype dt, o of o_dt,
 * lse and dlse, and the fp32 gradients (a NULL buffer makes a descriptor without data, as a
 * call that leaves it out or a rank without rows has). */
typedef struct rt_attn_bufs {
  void *q, *k, *v, *o, *lse, *dout, *dlse, *dq, *dk, *dv;
} rt_attn_bufs;
typedef struct rt_attn_tensors {
  rda_tensor q, k, v, o, lse, dout, dlse, dq, dk, dv;
} rt_attn_tensors;

/* RDA_OK, or the first rda_tensor_contiguous failure (not a test failure: also for threads). */
static inline rda_status rt_attn(rt_attn_tensors *t, const rt_attn_bufs *p, rda_dtype dt,
                                 rda_dtype o_dt, long long b, long long n, long long h,
                                 long long hkv, long long d) {
  const long long sq[4] = {b, n, h, d}, skv[4] = {b, n, hkv, d}, sl[3] = {b, h, n};
  const struct {
    rda_tensor *t;
    void *data;
    rda_dtype dt;
    int ndim;
    const long long *shape;
  } all[10] = {
      {&t->q, p->q, dt, 4, sq},
      {&t->k, p->k, dt, 4, skv},
      {&t->v, p->v, dt, 4, skv},
      {&t->o, p->o, o_dt, 4, sq},
      {&t->lse, p->lse, RDA_FP32, 3, sl},
      {&t->dout, p->dout, dt, 4, sq},
      {&t->dlse, p->dlse, RDA_FP32, 3, sl},
      {&t->dq, p->dq, RDA_FP32, 4, sq},
      {&t->dk, p->dk, RDA_FP32, 4, skv},
      {&t->dv, p->dv, RDA_FP32, 4, skv},
  };
  for (int i = 0; i < 10; ++i) {
    const rda_status s =
        rda_tensor_contiguous(all[i].t, all[i].data, all[i].dt, all[i].ndim, all[i].shape);
    if (s != RDA_OK) return s;
  }
  return RDA_OK;
}

#endif
