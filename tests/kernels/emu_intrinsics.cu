// emu_intrinsics.cu — one-warp and one-block kernels that exercise each wrapper of ptx.cuh, so
// tests/test_emu.c can compare the emulator with scalar models of the PTX ISA. Several entries
// share this one source (one compile); emu_test_params must match the struct in test_emu.c.
#include "ptx.cuh"

struct emu_test_params {
  const void *in0, *in1, *in2;
  void *out0, *out1;
  long long n;
  int op;
  int pad;
};

// One warp: lane l holds A fragment in0[l][0..3], B fragment in1[l][0..1], C fragment
// in2[l][0..3]; writes D to out0[l][0..3]. op 0: bf16, op 1: f16.
extern "C" __global__ void __launch_bounds__(32) emu_mma(const emu_test_params p) {
  const int l = threadIdx.x;
  const uint32_t *a_in = static_cast<const uint32_t *>(p.in0) + 4 * l;
  const uint32_t *b_in = static_cast<const uint32_t *>(p.in1) + 2 * l;
  const float *c_in = static_cast<const float *>(p.in2) + 4 * l;
  uint32_t a[4] = {a_in[0], a_in[1], a_in[2], a_in[3]};
  uint32_t b[2] = {b_in[0], b_in[1]};
  float d[4] = {c_in[0], c_in[1], c_in[2], c_in[3]};
  if (p.op == 0)
    rda::mma_bf16_16816(d, a, b, d);
  else
    rda::mma_f16_16816(d, a, b, d);
  float *out = static_cast<float *>(p.out0) + 4 * l;
  for (int i = 0; i < 4; ++i) out[i] = d[i];
}

// Many mma per warp, for the emulation rate: A = B = ones, n iterations of D += A B (so every
// element of D ends at 16 n), op as in emu_mma; out0[global thread][0..3] = D.
extern "C" __global__ void __launch_bounds__(128) emu_mma_loop(const emu_test_params p) {
  const uint32_t one = p.op == 0 ? 0x3f803f80u : 0x3c003c00u;
  uint32_t a[4] = {one, one, one, one};
  uint32_t b[2] = {one, one};
  float d[4] = {0, 0, 0, 0};
  for (long long i = 0; i < p.n; ++i) {
    if (p.op == 0)
      rda::mma_bf16_16816(d, a, b, d);
    else
      rda::mma_f16_16816(d, a, b, d);
  }
  float *out = static_cast<float *>(p.out0) + 4 * (blockIdx.x * blockDim.x + threadIdx.x);
  for (int i = 0; i < 4; ++i) out[i] = d[i];
}

// One warp: copy p.n bytes of in0 into shared memory, then lane l loads from byte offset
// in1[l] (int); out0[l][0..3] = ldmatrix_x4, out1[l][0..3] = ldmatrix_x4_trans.
extern "C" __global__ void __launch_bounds__(32) emu_ldmatrix(const emu_test_params p) {
  unsigned char *smem = rda::dynamic_smem();
  const unsigned char *src = static_cast<const unsigned char *>(p.in0);
  for (long long i = threadIdx.x; i < p.n; i += 32) smem[i] = src[i];
  rda::sync_threads();
  const int off = static_cast<const int *>(p.in1)[threadIdx.x];
  uint32_t r[4], t[4];
  rda::ldmatrix_x4(r, smem + off);
  rda::ldmatrix_x4_trans(t, smem + off);
  uint32_t *o0 = static_cast<uint32_t *>(p.out0) + 4 * threadIdx.x;
  uint32_t *o1 = static_cast<uint32_t *>(p.out1) + 4 * threadIdx.x;
  for (int i = 0; i < 4; ++i) {
    o0[i] = r[i];
    o1[i] = t[i];
  }
}

// One warp: out0[m][l] = shfl_xor(in0[l] * (m + 1), m) for every lane mask m in 0..31 (a new
// value per round, so a deposit overwritten before every lane read it would show).
extern "C" __global__ void __launch_bounds__(32) emu_shfl_xor(const emu_test_params p) {
  const float v = static_cast<const float *>(p.in0)[threadIdx.x];
  float *out = static_cast<float *>(p.out0);
  for (int m = 0; m < 32; ++m)
    out[m * 32 + threadIdx.x] = rda::shfl_xor(v * static_cast<float>(m + 1), m);
}

// Elementwise conversions over n elements (any grid): op 0 pack_bf16x2(in0[2i], in0[2i+1]),
// 1 pack_f16x2, 2 f16_to_float(in0 u16), 3 bf16_to_float(in0 u16), 4 ex2(in0 float).
extern "C" __global__ void __launch_bounds__(256) emu_scalar(const emu_test_params p) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    const float *f = static_cast<const float *>(p.in0);
    const uint16_t *h = static_cast<const uint16_t *>(p.in0);
    uint32_t *u = static_cast<uint32_t *>(p.out0);
    float *o = static_cast<float *>(p.out0);
    switch (p.op) {
      case 0: u[i] = rda::pack_bf16x2(f[2 * i], f[2 * i + 1]); break;
      case 1: u[i] = rda::pack_f16x2(f[2 * i], f[2 * i + 1]); break;
      case 2: o[i] = rda::f16_to_float(h[i]); break;
      case 3: o[i] = rda::bf16_to_float(h[i]); break;
      default: o[i] = rda::ex2(f[i]); break;
    }
  }
}

// cp.async groups, one block of blockDim.x threads. Thread t copies 16-byte chunk
// c = g * T + t of in0 to shared memory in group g (g = 0, 1, 2; chunks with c % 7 == 3 are
// zero-filled: valid = false). It records what it sees of its own three chunks at four points
// (before any wait, after wait_group 2, 1, 0) into out1[t][point][g]: 1 the copied data,
// 0 the poison, 2 anything else. After a barrier, thread t writes chunks t, T + t, 2T + t of
// the whole shared buffer (copied by other threads) to out0.
extern "C" __global__ void __launch_bounds__(128) emu_cp_async(const emu_test_params p) {
  const int t = threadIdx.x;
  const int T = blockDim.x;
  unsigned char *smem = rda::dynamic_smem();
  const unsigned char *src = static_cast<const unsigned char *>(p.in0);
  for (int g = 0; g < 3; ++g) {
    const int c = g * T + t;
    rda::cp_async_16(smem + 16 * c, src + 16 * c, c % 7 != 3);
    rda::cp_async_commit();
  }
  int *seen = static_cast<int *>(p.out1) + 12 * t;
  for (int point = 0; point < 4; ++point) {
    if (point == 1) rda::cp_async_wait<2>();
    if (point == 2) rda::cp_async_wait<1>();
    if (point == 3) rda::cp_async_wait<0>();
    for (int g = 0; g < 3; ++g) {
      const int c = g * T + t;
      bool data = true, poison = true;
      for (int i = 0; i < 16; ++i) {
        const unsigned char want = c % 7 != 3 ? src[16 * c + i] : 0;
        data = data && smem[16 * c + i] == want;
        poison = poison && smem[16 * c + i] == 0xff;
      }
      seen[3 * point + g] = data ? 1 : poison ? 0 : 2;
    }
  }
  rda::sync_threads();
  unsigned char *out = static_cast<unsigned char *>(p.out0);
  for (int g = 0; g < 3; ++g) {
    const int c = g * T + (t + 1) % T;  // a chunk another thread copied
    for (int i = 0; i < 16; ++i) out[16 * c + i] = smem[16 * c + i];
  }
}

// A block-wide tree sum in shared memory (correct only if every barrier holds): out0[block] =
// sum of in0[block * T .. + T) (floats, T a power of two); out1[block * T + t] = the value
// thread t read from its neighbour (t + 37) % T after the first barrier.
extern "C" __global__ void __launch_bounds__(256) emu_block_sum(const emu_test_params p) {
  const int t = threadIdx.x;
  const int T = blockDim.x;
  float *s = reinterpret_cast<float *>(rda::dynamic_smem());
  const float *in = static_cast<const float *>(p.in0) + static_cast<long long>(blockIdx.x) * T;
  s[t] = in[t];
  rda::sync_threads();
  static_cast<float *>(p.out1)[blockIdx.x * T + t] = s[(t + 37) % T];
  rda::sync_threads();
  for (int half = T / 2; half > 0; half /= 2) {
    if (t < half) s[t] += s[t + half];
    rda::sync_threads();
  }
  if (t == 0) static_cast<float *>(p.out0)[blockIdx.x] = s[0];
}

RDA_EMU_EXPORT(emu_mma, emu_test_params)
RDA_EMU_EXPORT(emu_mma_loop, emu_test_params)
RDA_EMU_EXPORT(emu_ldmatrix, emu_test_params)
RDA_EMU_EXPORT(emu_shfl_xor, emu_test_params)
RDA_EMU_EXPORT(emu_scalar, emu_test_params)
RDA_EMU_EXPORT(emu_cp_async, emu_test_params)
RDA_EMU_EXPORT(emu_block_sum, emu_test_params)
