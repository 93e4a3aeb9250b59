-- plan.lua — from a validated config and a hardware profile to the kernels a forward pass needs:
-- one fwd variant per distinct (head_dim, dtype, causal, dilated, tile), the init and cast
-- kernels, and one launch step per branch. Every variant fits the target's resources.

local emit = require "gen.emit"

local M = {}

local MAX_THREADS_PER_BLOCK <const> = 1024
local SMALL_GRID <const> = 64 -- a branch whose grid rows per segment fit this prefers block_m <= 64

-- Tile candidates per head_dim, best first, until the kernel engineer's tuning/fwd_space.lua
-- exists (same format; that file wins as soon as it is there).
local STAND_IN <const> = {
  [32] = { { block_m = 128, block_n = 128, warps = 8, stages = 2 },
           { block_m = 64, block_n = 64, warps = 4, stages = 2 } },
  [64] = { { block_m = 128, block_n = 64, warps = 8, stages = 2 },
           { block_m = 64, block_n = 64, warps = 4, stages = 2 } },
  [96] = { { block_m = 128, block_n = 64, warps = 8, stages = 2 },
           { block_m = 64, block_n = 64, warps = 4, stages = 2 } },
  [128] = { { block_m = 128, block_n = 64, warps = 8, stages = 2 },
            { block_m = 64, block_n = 64, warps = 4, stages = 2 },
            { block_m = 64, block_n = 32, warps = 4, stages = 2 } },
  [256] = { { block_m = 128, block_n = 64, warps = 8, stages = 2 },
            { block_m = 64, block_n = 64, warps = 4, stages = 2 },
            { block_m = 64, block_n = 32, warps = 4, stages = 2 },
            { block_m = 64, block_n = 32, warps = 4, stages = 1 } },
}
M.STAND_IN = STAND_IN

local function positive_int(x) return math.type(x) == "integer" and x > 0 end

local function tile_name(c)
  return string.format("bm%d_bn%d_w%d_s%d", c.block_m, c.block_n, c.warps, c.stages)
end

-- Checks a tile space { [head_dim] = { {block_m, block_n, warps, stages}, ... } }.
-- Returns the space, or nil and what is wrong.
function M.check_space(space)
  if type(space) ~= "table" then return nil, "the tile space must be a table" end
  for d, list in pairs(space) do
    if not positive_int(d) or type(list) ~= "table" or #list == 0 then
      return nil, string.format("entry [%s] must map a head_dim to a non-empty list of tiles",
                                tostring(d))
    end
    for i, c in ipairs(list) do
      if type(c) ~= "table" or not (positive_int(c.block_m) and positive_int(c.block_n)
                                     and positive_int(c.warps) and positive_int(c.stages)) then
        return nil, string.format("[%d][%d] needs positive integers block_m, block_n, warps, "
                                  .. "stages", d, i)
      end
      if c.block_m ~= 16 * c.warps then
        return nil, string.format("[%d][%d] %s: block_m must be 16 * warps", d, i, tile_name(c))
      end
      if c.block_n % 16 ~= 0 then
        return nil, string.format("[%d][%d] %s: block_n must be a multiple of 16", d, i,
                                  tile_name(c))
      end
    end
  end
  return space
end

-- The tile space: `home`/tuning/fwd_space.lua when it exists, else the stand-in above.
-- Returns space, origin (the file, or "built-in stand-in"), or nil and a message.
function M.load_space(home)
  assert(type(home) == "string", "load_space needs the rda home directory")
  local path = home .. "/tuning/fwd_space.lua"
  local f = io.open(path, "r")
  if not f then return STAND_IN, "built-in stand-in" end
  f:close()
  local chunk, err = loadfile(path, "t", {})
  if not chunk then return nil, err end
  local ok, space = pcall(chunk)
  if not ok then return nil, path .. ": " .. tostring(space) end
  local checked, why = M.check_space(space)
  if not checked then return nil, path .. ": " .. why end
  return checked, path
end

-- Dynamic shared memory of a forward tile: Q block plus `stages` K and V blocks, 2-byte elements.
function M.fwd_smem(head_dim, c)
  return 2 * head_dim * (c.block_m + 2 * c.stages * c.block_n)
end

-- Whether tile c fits hw; when not, the reason.
function M.fits(head_dim, c, hw)
  local smem, threads = M.fwd_smem(head_dim, c), 32 * c.warps
  if smem > hw.smem_per_block then
    return false, string.format("%s needs %d bytes of shared memory, %d available per block",
                                tile_name(c), smem, hw.smem_per_block)
  end
  local max_threads = math.min(MAX_THREADS_PER_BLOCK, hw.max_threads_per_sm)
  if threads > max_threads then
    return false, string.format("%s needs %d threads, at most %d per block", tile_name(c),
                                threads, max_threads)
  end
  return true
end

-- The tile for a branch of segment length w and dilation r: the first candidate that fits,
-- preferring block_m <= 64 when a segment's grid has at most 64 rows.
function M.choose_tile(space, head_dim, w, r, hw)
  local list = space[head_dim]
  if not list then
    return nil, string.format("the tile space has no candidates for head_dim = %d", head_dim)
  end
  local small = w // r + (w % r > 0 and 1 or 0) <= SMALL_GRID -- ceil(w / r), no overflow
  local first, why, least
  for _, c in ipairs(list) do
    local ok, reason = M.fits(head_dim, c, hw)
    if ok then
      if not small or c.block_m <= SMALL_GRID then return c end
      first = first or c
    elseif not least or M.fwd_smem(head_dim, c) < least then
      least, why = M.fwd_smem(head_dim, c), reason
    end
  end
  if first then return first end
  return nil, string.format("no forward tile for head_dim = %d fits %s: none of the %d "
                            .. "candidates fits (the smallest: %s)", head_dim, hw.name or "?",
                            #list, why)
end

-- Heads [head0, head0 + count) that use branch b (0-based), as runtime/config.c computes them.
function M.branch_heads(cfg, b)
  if cfg.offsets ~= "group" then return 0, cfg.heads end
  local k = #cfg.segments
  local base, extra = cfg.heads // k, cfg.heads % k
  return b * base + math.min(b, extra), base + (b < extra and 1 or 0)
end

local function check_cfg(cfg)
  assert(type(cfg) == "table", "config must be a table")
  assert(positive_int(cfg.heads), "config heads must be a positive integer")
  assert(positive_int(cfg.head_dim), "config head_dim must be a positive integer")
  assert(cfg.dtype == "bf16" or cfg.dtype == "fp16", "config dtype must be bf16 or fp16")
  assert(type(cfg.segments) == "table" and type(cfg.dilations) == "table"
         and #cfg.segments >= 1 and #cfg.segments == #cfg.dilations,
         "config segments and dilations must be non-empty lists of equal length")
  assert(cfg.offsets ~= "group" or cfg.heads >= #cfg.segments,
         "config offsets = group needs heads >= branches")
  assert(type(cfg.causal) == "boolean", "config causal must be a boolean")
end

local function add_variant(plan, index, v)
  local at = index[v.name]
  if at then return at end
  plan.variants[#plan.variants + 1] = v
  index[v.name] = #plan.variants
  return #plan.variants
end

-- The plan: { variants = { {name, kind, source, threads, block_m, block_n, smem_bytes, ...} },
-- steps = { {kernel (index into variants), branch (0-based), head0, nheads} },
-- init_kernel, cast_kernel (indices into variants) }, or nil and why it cannot fit.
function M.build(cfg, hw, space)
  check_cfg(cfg)
  assert(type(hw) == "table" and positive_int(hw.smem_per_block), "hw must be a profile")
  space = space or STAND_IN
  local plan, index = { variants = {}, steps = {} }, {}
  for i = 1, #cfg.segments do
    local w, r = cfg.segments[i], cfg.dilations[i]
    local tile, why = M.choose_tile(space, cfg.head_dim, w, r, hw)
    if not tile then return nil, why end
    local v = {
      kind = "fwd", head_dim = cfg.head_dim, dtype = cfg.dtype, causal = cfg.causal,
      dilated = r > 1, block_m = tile.block_m, block_n = tile.block_n, warps = tile.warps,
      stages = tile.stages, threads = 32 * tile.warps, smem_bytes = M.fwd_smem(cfg.head_dim, tile),
    }
    v.name = emit.fwd_name(v)
    v.source = emit.fwd_source(v)
    local head0, nheads = M.branch_heads(cfg, i - 1)
    plan.steps[i] = { kernel = add_variant(plan, index, v), branch = i - 1, head0 = head0,
                      nheads = nheads }
  end
  local small = { kind = "init", name = emit.init_name(), source = emit.init_source(),
                  threads = emit.SMALL_THREADS, block_m = 0, block_n = 0, smem_bytes = 0 }
  plan.init_kernel = add_variant(plan, index, small)
  small = { kind = "cast", name = emit.cast_name(cfg.dtype), source = emit.cast_source(cfg.dtype),
            threads = emit.SMALL_THREADS, block_m = 0, block_n = 0, smem_bytes = 0 }
  plan.cast_kernel = add_variant(plan, index, small)
  return plan
end

return M
