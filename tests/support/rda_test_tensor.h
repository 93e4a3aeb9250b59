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

#endif
