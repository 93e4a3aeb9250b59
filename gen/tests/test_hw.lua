-- test_hw.lua — the built-in hardware profiles: the documented numbers, fresh copies, and a
-- clear error for an unknown target.

local testing = require "gen.testing"
local hw = require "gen.hw"

local T = testing.suite("test_hw")

T.test("known targets: Ampere, Orin, Ada, Hopper, Blackwell", function()
  local k = table.concat(hw.known(), ",")
  assert(k == "80,86,87,89,90,100,103,120,121", "known(): " .. k)
end)

T.test("sm_80 is an A100", function()
  local p = assert(hw.builtin(80))
  assert(p.sm_count == 108, "sm_count")
  assert(p.smem_per_block == 166912, "163 KiB opt-in per block")
  assert(p.smem_per_sm == 167936, "164 KiB per SM")
  assert(p.regs_per_sm == 65536 and p.regs_per_block == 65536, "registers")
  assert(p.max_threads_per_sm == 2048, "threads per SM")
  assert(p.arch == 80 and p.name == "sm_80 (built-in)" and p.live == false, "identity")
end)

T.test("sm_86 and sm_89 have 99 KiB per block and 1536 threads per SM", function()
  for _, a in ipairs { 86, 89 } do
    local p = assert(hw.builtin(a))
    assert(p.smem_per_block == 101376 and p.smem_per_sm == 102400, "shared memory of sm_" .. a)
    assert(p.max_threads_per_sm == 1536, "threads of sm_" .. a)
  end
  assert(hw.builtin(86).sm_count == 84 and hw.builtin(89).sm_count == 128, "SM counts")
end)

T.test("sm_90 is an H100 SXM", function()
  local p = assert(hw.builtin(90))
  assert(p.sm_count == 132 and p.smem_per_block == 232448 and p.smem_per_sm == 233472,
         "sm_90 numbers")
  assert(p.max_threads_per_sm == 2048, "threads")
end)

-- Shared memory as the toolkit's cuda_occupancy.h sizes the carve-outs (the largest per SM, and
-- 1 KiB less per block); threads per SM as the Programming Guide's table.
T.test("Orin and Blackwell: shared memory and threads per SM", function()
  local want = {
    [87] = { 164, 1536, 16 }, [100] = { 228, 2048, 148 }, [103] = { 228, 2048, 160 },
    [120] = { 100, 1536, 170 }, [121] = { 100, 1536, 48 },
  }
  for arch, w in pairs(want) do
    local p = assert(hw.builtin(arch))
    assert(p.smem_per_sm == w[1] * 1024 and p.smem_per_block == (w[1] - 1) * 1024,
           "shared memory of sm_" .. arch)
    assert(p.max_threads_per_sm == w[2] and p.sm_count == w[3], "threads and SMs of sm_" .. arch)
    assert(p.regs_per_sm == 65536 and p.regs_per_block == 65536, "registers of sm_" .. arch)
  end
end)

T.test("spills: the tiles ptxas spills, by target", function()
  local function fwd(arch, d, dilated, causal, tile)
    return hw.spills(arch, "fwd", d, dilated, causal, tile)
  end
  for _, a in ipairs { 100, 103, 120, 121 } do
    local b100 = a < 120
    assert(fwd(a, 128, true, true, "bm128_bn64_w8_s2") and fwd(a, 128, true, false,
           "bm64_bn64_w4_s2"), "d128 dilated, block_n 64, sm_" .. a)
    assert(fwd(a, 128, true, false, "bm128_bn64_w8_s2") == b100, "d128 full 128 rows, sm_" .. a)
    assert(not fwd(a, 128, true, true, "bm64_bn32_w4_s2"), "d128 dilated, block_n 32, sm_" .. a)
    assert(not fwd(a, 128, false, true, "bm64_bn64_w4_s2"), "d128 dense, sm_" .. a)
    assert(fwd(a, 64, true, false, "bm64_bn128_w4_s2") and not fwd(a, 64, true, false,
           "bm64_bn64_w4_s2"), "d64 dilated, sm_" .. a)
    assert(fwd(a, 64, true, true, "bm128_bn128_w8_s2") == b100
           and fwd(a, 64, true, false, "bm128_bn128_w8_s2") == not b100, "d64 128 rows, sm_" .. a)
    assert(fwd(a, 256, true, true, "bm128_bn64_w8_s2") == b100 and not fwd(a, 256, true, true,
           "bm64_bn32_w4_s2"), "d256 dilated, sm_" .. a)
  end
  assert(fwd(103, 256, true, false, "bm128_bn64_w8_s2") and fwd(103, 256, true, true,
         "bm64_bn64_w4_s2") and not fwd(100, 256, true, false, "bm128_bn64_w8_s2")
         and not fwd(100, 256, true, true, "bm64_bn64_w4_s2"), "d256: sm_103 spills more")
  for _, a in ipairs { 86, 87, 89 } do
    assert(fwd(a, 128, false, true, "bm64_bn64_w4_s2"), "d128 dense causal 64-row, sm_" .. a)
    assert(not fwd(a, 128, false, true, "bm128_bn64_w8_s2"), "128 rows, sm_" .. a)
    assert(not fwd(a, 128, false, false, "bm64_bn64_w4_s2")
           and not fwd(a, 128, true, true, "bm64_bn64_w4_s2"), "full or dilated, sm_" .. a)
  end
  assert(fwd(87, 256, false, true, "bm64_bn64_w4_s2") and not fwd(86, 256, false, true,
         "bm64_bn64_w4_s2"), "d256 dense causal on sm_87 alone")
  assert(hw.spills(103, "bwd_dkdv", 32, false, false, "bn64_bm64_w4_s2_x1")
         and not hw.spills(100, "bwd_dkdv", 32, false, false, "bn64_bm64_w4_s2_x1")
         and not hw.spills(103, "bwd_dkdv", 32, false, true, "bn64_bm64_w4_s2_x1")
         and not hw.spills(103, "fwd", 32, false, false, "bn64_bm64_w4_s2_x1"),
         "sm_103's dense d32 dK/dV")
  for _, a in ipairs { 80, 90 } do
    for _, d in ipairs { 32, 64, 96, 128, 256 } do
      for _, dil in ipairs { false, true } do
        for _, t in ipairs { "bm128_bn128_w8_s2", "bm128_bn64_w8_s2", "bm64_bn64_w4_s2" } do
          assert(not fwd(a, d, dil, true, t) and not fwd(a, d, dil, false, t), "none on sm_" .. a)
        end
      end
    end
  end
end)

T.test("every profile passes check", function()
  for _, a in ipairs(hw.known()) do hw.check(assert(hw.builtin(a))) end
end)

T.test("builtin returns a fresh copy", function()
  local p = assert(hw.builtin(90))
  p.smem_per_block = 1
  assert(hw.builtin(90).smem_per_block == 232448, "a caller changed the table")
end)

T.test("unknown arch names itself and the known ones", function()
  local p, msg = hw.builtin(75)
  assert(p == nil, "sm_75 has no profile")
  testing.contains(msg, "sm_75")
  testing.contains(msg, "sm_80, sm_86, sm_87, sm_89, sm_90, sm_100, sm_103, sm_120, sm_121")
end)

T.test("check rejects an incomplete profile", function()
  testing.contains(testing.raises(hw.check, { arch = 90 }), "sm_count")
end)

T.run()
