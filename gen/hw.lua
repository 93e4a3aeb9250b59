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
