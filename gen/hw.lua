-- hw.lua — built-in hardware profiles for offline targets, so planning never needs a GPU.
-- Numbers from the CUDA C++ Programming Guide (compute capabilities table; the shared memory
-- sizes are also those of the toolkit's cuda_occupancy.h) and the product data sheets (the SM
-- counts: a product fact, so each names its part). A live profile read through the driver API
-- replaces these when a GPU is present; offline, they decide which tiles fit (shared memory per
-- block, threads per SM). sm_110 (Thor) and sm_88 are left out until their numbers are sure.

local M = {}

local KIB <const> = 1024

-- smem_per_block is the opt-in maximum of dynamic shared memory one block may use
-- (cudaFuncAttributeMaxDynamicSharedMemorySize); smem_per_sm is the per-SM capacity.
local PROFILES <const> = {
  [80] = { -- A100: 108 SMs, 163 KiB per block, 164 KiB per SM
    sm_count = 108, smem_per_block = 163 * KIB, smem_per_sm = 164 * KIB,
    regs_per_sm = 65536, regs_per_block = 65536, max_threads_per_sm = 2048,
  },
  [86] = { -- RTX 3090 / A40 class: 84 SMs (GA102 full die), 99 KiB per block, 100 KiB per SM
    sm_count = 84, smem_per_block = 99 * KIB, smem_per_sm = 100 * KIB,
    regs_per_sm = 65536, regs_per_block = 65536, max_threads_per_sm = 1536,
  },
  [89] = { -- RTX 4090 / L40 class: 128 SMs, 99 KiB per block, 100 KiB per SM
    sm_count = 128, smem_per_block = 99 * KIB, smem_per_sm = 100 * KIB,
    regs_per_sm = 65536, regs_per_block = 65536, max_threads_per_sm = 1536,
  },
  [87] = { -- Jetson AGX Orin: 16 SMs, 163 KiB per block, 164 KiB per SM (as sm_80), 1536 threads
    sm_count = 16, smem_per_block = 163 * KIB, smem_per_sm = 164 * KIB,
    regs_per_sm = 65536, regs_per_block = 65536, max_threads_per_sm = 1536,
  },
  [90] = { -- H100 SXM: 132 SMs, 227 KiB per block, 228 KiB per SM
    sm_count = 132, smem_per_block = 227 * KIB, smem_per_sm = 228 * KIB,
    regs_per_sm = 65536, regs_per_block = 65536, max_threads_per_sm = 2048,
  },
  [100] = { -- B200: 148 SMs, 227 KiB per block, 228 KiB per SM
    sm_count = 148, smem_per_block = 227 * KIB, smem_per_sm = 228 * KIB,
    regs_per_sm = 65536, regs_per_block = 65536, max_threads_per_sm = 2048,
  },
  [103] = { -- B300 / GB300: 160 SMs (the whole GPU as NVIDIA describes it), sm_100's memory
    sm_count = 160, smem_per_block = 227 * KIB, smem_per_sm = 228 * KIB,
    regs_per_sm = 65536, regs_per_block = 65536, max_threads_per_sm = 2048,
  },
  [120] = { -- RTX 5090 class: 170 SMs, 99 KiB per block, 100 KiB per SM, 1536 threads
    sm_count = 170, smem_per_block = 99 * KIB, smem_per_sm = 100 * KIB,
    regs_per_sm = 65536, regs_per_block = 65536, max_threads_per_sm = 1536,
  },
  [121] = { -- GB10 (DGX Spark): 48 SMs, sm_120's memory and threads
    sm_count = 48, smem_per_block = 99 * KIB, smem_per_sm = 100 * KIB,
    regs_per_sm = 65536, regs_per_block = 65536, max_threads_per_sm = 1536,
  },
}

-- Tiles that ptxas (CUDA 13.0) spills on some targets, found by compiling every planned variant
-- (tests/test_nvrtc.c's matrix, and `rdagen emit` for the targets it leaves out), kept by arch
-- so that live profiles get them too. Each rule: a kernel kind ("fwd", "bwd_dkdv", "bwd_dq"),
-- the archs, a head_dim, which variants (dilated, causal; nil: either) and the tiles, by name,
-- that spill there: the variant or its kv_table twin (a twin shares its branch's tile). The
-- planners' default rule passes over them when another tile fits (gen/plan.lua); a tuning
-- database may still rank them, by measurement.
-- Blackwell runs the mma.sync kernels: ptxas gives the dilated forwards below (mostly the twins,
-- whose launch bounds ask for one block per SM) all 255 registers and spills 8-248 bytes, up to
-- 13 loads and stores in the key loop; the tiles taken instead (half the keys per step; at
-- d = 256 on sm_100 half the rows) take 169-255 registers and spill nothing. sm_86, sm_87 and
-- sm_89 hold the dense causal d = 128 forward of 4 warps to 168 registers (three blocks per SM,
-- where its 80 KiB of shared memory let one or two): 28 bytes, four loads in the key loop; so
-- does sm_87 at d = 256 (255 registers, 60 bytes). sm_103's dense d = 32 dK/dV: 40 bytes, three
-- loads in its loop.
local BLACKWELL <const> = { 100, 103, 120, 121 }
local B100 <const> = { 100, 103 }
local B120 <const> = { 120, 121 }
local SPILLS <const> = {
  { kind = "fwd", archs = BLACKWELL, head_dim = 64, dilated = true,
    tiles = { "bm64_bn128_w4_s2" } },
  { kind = "fwd", archs = B100, head_dim = 64, dilated = true, causal = true,
    tiles = { "bm128_bn128_w8_s2" } },
  { kind = "fwd", archs = B120, head_dim = 64, dilated = true, causal = false,
    tiles = { "bm128_bn128_w8_s2" } },
  { kind = "fwd", archs = BLACKWELL, head_dim = 128, dilated = true,
    tiles = { "bm64_bn64_w4_s2" } },
  { kind = "fwd", archs = B100, head_dim = 128, dilated = true, tiles = { "bm128_bn64_w8_s2" } },
  { kind = "fwd", archs = B120, head_dim = 128, dilated = true, causal = true,
    tiles = { "bm128_bn64_w8_s2" } },
  { kind = "fwd", archs = { 100 }, head_dim = 256, dilated = true, causal = true,
    tiles = { "bm128_bn64_w8_s2" } },
  { kind = "fwd", archs = { 103 }, head_dim = 256, dilated = true, tiles = { "bm128_bn64_w8_s2" } },
  { kind = "fwd", archs = { 103 }, head_dim = 256, dilated = true, causal = true,
    tiles = { "bm64_bn64_w4_s2" } },
  { kind = "fwd", archs = { 86, 87, 89 }, head_dim = 128, dilated = false, causal = true,
    tiles = { "bm64_bn64_w4_s2" } },
  { kind = "fwd", archs = { 87 }, head_dim = 256, dilated = false, causal = true,
    tiles = { "bm64_bn64_w4_s2" } },
  { kind = "bwd_dkdv", archs = { 103 }, head_dim = 32, dilated = false, causal = false,
    tiles = { "bn64_bm64_w4_s2_x1" } },
}

local function has(list, x)
  for _, y in ipairs(list) do
    if y == x then return true end
  end
  return false
end

-- Whether ptxas is known to spill the `kind` variants (head_dim, dilated, causal) of the tile
-- named `tile` on sm_`arch`: SPILLS above.
function M.spills(arch, kind, head_dim, dilated, causal, tile)
  for _, r in ipairs(SPILLS) do
    if r.kind == kind and r.head_dim == head_dim and (r.dilated == nil or r.dilated == dilated)
       and (r.causal == nil or r.causal == causal) and has(r.archs, arch)
       and has(r.tiles, tile) then
      return true
    end
  end
  return false
end

-- The known archs, ascending: { 80, 86, 87, 89, 90, 100, 103, 120, 121 }.
function M.known()
  local archs = {}
  for arch in pairs(PROFILES) do archs[#archs + 1] = arch end
  table.sort(archs)
  return archs
end

local function known_list()
  local names = {}
  for i, arch in ipairs(M.known()) do names[i] = "sm_" .. arch end
  return table.concat(names, ", ")
end

-- A fresh copy of the profile of sm_`arch`, or nil plus a message listing the known archs.
function M.builtin(arch)
  assert(math.type(arch) == "integer", "arch must be an integer such as 90")
  local p = PROFILES[arch]
  if not p then
    return nil, string.format("no built-in hardware profile for sm_%d: known targets are %s "
                              .. "(a GPU of that kind plans from its own properties; only "
                              .. "planning without it needs a profile)", arch, known_list())
  end
  local hw = { name = string.format("sm_%d (built-in)", arch), arch = arch, live = false }
  for k, v in pairs(p) do hw[k] = v end
  return hw
end

-- Checks that a profile (built-in or live) has every field the planner reads.
function M.check(hw)
  assert(type(hw) == "table", "hardware profile must be a table")
  for _, k in ipairs { "arch", "sm_count", "smem_per_block", "smem_per_sm", "regs_per_sm",
                       "regs_per_block", "max_threads_per_sm" } do
    assert(math.type(hw[k]) == "integer" and hw[k] > 0,
           "hardware profile field " .. k .. " must be a positive integer")
  end
  return hw
end

return M
