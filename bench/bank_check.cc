/* bank_check.cc — a static check that the forward kernel's shared-memory layouts are free of
 * bank conflicts: replays every ldmatrix, cp.async and epilogue access pattern of rda_fwd.cuh
 * (its own swizzle functions, compiled as host C++) per tile shape and counts wavefronts.
 * Run: g++ -std=c++17 -DRDA_EMU -I templates bench/bank_check.cc -o /tmp/bank_check &&
 * /tmp/bank_check (exit 1 when any access phase needs more than one wavefront). */
#include <cstdio>
#include <set>
#include <vector>

#include "rda_fwd.cuh"
using namespace rda::fwd_detail;

// wavefronts for one phase: max over banks of distinct 4-byte words touched in that bank
static int wavefronts(const std::vector<std::pair<long, int>> &acc) {  // (byte addr, bytes)
  std::set<long> words[32];
  for (auto &a : acc)
    for (int b = 0; b < a.second; b += 4) words[((a.first + b) / 4) % 32].insert((a.first + b) / 4);
  size_t m = 0;
  for (auto &w : words) m = std::max(m, w.size());
  return (int)m;
}

template <int D, int BM, int BN, int W>
bool check() {
  constexpr int C = D / 8;
  int worst = 0;
  // ldmatrix: each of 4 phases = one 8x8 matrix = lanes 8i..8i+7 row addresses, 16 bytes each.
  for (int warp = 0; warp < W; ++warp) {
    for (int kind = 0; kind < 3; ++kind) {
      LaneOfs<C> o[32];
      for (int lane = 0; lane < 32; ++lane) {
        int mi = lane >> 3, mr = lane & 7;
        if (kind == 0) o[lane].init(16 * warp + (mi & 1) * 8 + mr, mi >> 1);
        if (kind == 1) o[lane].init((mi >> 1) * 8 + mr, mi & 1);
        if (kind == 2) o[lane].init((mi & 1) * 8 + mr, mi >> 1);
      }
      for (int cp = 0; cp < C / 2; ++cp)
        for (int r16 = 0; r16 < (kind == 0 ? 1 : BN / 16); ++r16)
          for (int ph = 0; ph < 4; ++ph) {
            std::vector<std::pair<long, int>> a;
            for (int l = 8 * ph; l < 8 * ph + 8; ++l) a.push_back({o[l].at(cp, 16 * r16), 16});
            worst = std::max(worst, wavefronts(a));
          }
    }
  }
  int ldsm = worst;
  // cp.async 16-byte writes: thread tid writes (row, ch) per load_tile's mapping; phases of 8.
  worst = 0;
  constexpr int T = 32 * W;
  for (int rows : {BM, BN}) {
    std::vector<long> addr(T * 64, -1);
    int per = (rows * C + T - 1) / T;
    for (int i = 0; i < per; ++i) {
      for (int w = 0; w < W; ++w)
        for (int ph = 0; ph < 4; ++ph) {
          std::vector<std::pair<long, int>> a;
          for (int l = 8 * ph; l < 8 * ph + 8; ++l) {
            int tid = 32 * w + l, row, ch;
            if (T % C == 0 && rows % (T / C) == 0) {
              row = tid / C + i * (T / C);
              ch = tid % C;
            } else {
              int idx = tid + i * T;
              if (idx >= rows * C) continue;
              row = idx / C;
              ch = idx % C;
            }
            a.push_back({tile_off<C>(row, ch), 16});
          }
          worst = std::max(worst, wavefronts(a));
        }
    }
  }
  int cpa = worst;
  // epilogue float2 writes: phases of 16 lanes, 8 bytes each
  worst = 0;
  constexpr int C4 = D / 4;
  for (int hf = 0; hf < 2; ++hf)
    for (int dt = 0; dt < D / 8; ++dt)
      for (int ph = 0; ph < 2; ++ph) {
        std::vector<std::pair<long, int>> a;
        for (int lane = 16 * ph; lane < 16 * ph + 16; ++lane) {
          int row = (lane >> 2) + 8 * hf, chunk = 2 * dt + ((lane & 3) >> 1);
          a.push_back({4L * (row * D + swz_o(row, chunk) * 4 + 2 * (lane & 1)), 8});
        }
        worst = std::max(worst, wavefronts(a));
      }
  int epw = worst;
  worst = 0;  // epilogue float4 reads: idx = tid + k*T, phases of 8
  for (int base = 0; base < BM * C4; base += 8) {
    std::vector<std::pair<long, int>> a;
    for (int idx = base; idx < base + 8; ++idx) {
      int row = idx / C4, ch = idx % C4;
      a.push_back({4L * (row * D + swz_o(row, ch) * 4), 16});
    }
    worst = std::max(worst, wavefronts(a));
  }
  printf(
      "d%-4d bm%-4d bn%-4d: ldmatrix %d, cp.async %d, epi st.v2 %d, epi ld.v4 %d "
      "wavefronts/phase\n",
      D, BM, BN, ldsm, cpa, epw, worst);
  return ldsm == 1 && cpa == 1 && epw == 1 && worst == 1;
}

int main() {
  bool ok = true;
  /* The tiles of tuning/fwd_space.lua. */
  ok &= check<32, 128, 128, 8>();
  ok &= check<32, 64, 128, 4>();
  ok &= check<64, 128, 128, 8>();
  ok &= check<64, 64, 128, 4>();
  ok &= check<64, 64, 64, 4>();
  ok &= check<96, 128, 64, 8>();
  ok &= check<96, 64, 64, 4>();
  ok &= check<128, 128, 64, 8>();
  ok &= check<128, 64, 64, 4>();
  ok &= check<128, 64, 32, 4>();
  ok &= check<256, 128, 64, 8>();
  ok &= check<256, 64, 64, 4>();
  ok &= check<256, 64, 32, 4>();
  printf("%s\n", ok ? "conflict-free" : "BANK CONFLICTS");
  return ok ? 0 : 1;
}
