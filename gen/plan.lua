-- plan.lua — from a validated config and a hardware profile to the kernels a forward pass needs:
-- one fwd variant per distinct (head_dim, dtype, causal, dilated, tile), the init and cast
-- kernels, the ring's row pack/add kernels, and one launch step per branch. Every variant fits
-- the target's resources. With tuning databases (gen/tuning.lua), each attention kernel of each
-- branch takes the first tile its key's entry ranks that is a fitting, allowed candidate now,
-- from an entry that tried every such candidate (M.tile_for).

local emit = require "gen.emit"
local hwinfo = require "gen.hw" -- (`hw` below is a profile)
local tuning = require "gen.tuning"

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
  return string.format("bm%d_bn%d_w%d_s%d%s", c.block_m, c.block_n, c.warps, c.stages,
                       c.overlap and "_wgo" or c.wgmma and "_wg" or "")
end

-- The wgmma path (templates/rda_fwd.cuh, rda_bwd.cuh): sm_90a only, whole warpgroups, wgmma
-- shapes N = 64 or 128 for every product: the head dim, and the rows of a step (block_n of the
-- forward and dQ, block_m of dK/dV).
local admitted = tuning.wgmma_admitted -- (hw, wgmma): wgmma on and an sm_90 target
local function wgmma_shape_ok(head_dim, steps, warps)
  return (head_dim == 64 or head_dim == 128) and (steps == 64 or steps == 128) and warps % 4 == 0
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
      if c.wgmma ~= nil and type(c.wgmma) ~= "boolean" then
        return nil, string.format("[%d][%d] %s: wgmma must be a boolean", d, i, tile_name(c))
      end
      if c.wgmma and not wgmma_shape_ok(d, c.block_n, c.warps) then
        return nil, string.format("[%d][%d] %s: a wgmma tile needs head_dim and block_n in "
                                  .. "{64, 128} and warps a multiple of 4", d, i, tile_name(c))
      end
      if c.overlap ~= nil and type(c.overlap) ~= "boolean" then
        return nil, string.format("[%d][%d] %s: overlap must be a boolean", d, i, tile_name(c))
      end
      -- overlap keeps a tile's V stage until the next tile's step: one stage more than it loads
      -- ahead, so at least 3.
      if c.overlap and not (c.wgmma and c.stages >= 3) then
        return nil, string.format("[%d][%d] %s: an overlap tile needs wgmma = true and stages "
                                  .. ">= 3", d, i, tile_name(c))
      end
    end
  end
  return space
end

-- A tuning space: the text of `rel` (from read(rel), else `home`/`rel` on the file system), run
-- with an empty environment and checked by `check`; `stand_in` when there is no text.
-- Returns space, origin (the file, or "built-in stand-in"), or nil and a message.
local function load_tuning(home, read, rel, stand_in, check)
  local path = home .. "/" .. rel
  local text
  if read then
    text = read(rel)
  else
    local f = io.open(path, "r")
    if f then
      text = f:read("a")
      f:close()
    end
  end
  if not text then return stand_in, "built-in stand-in" end
  local chunk, err = load(text, "@" .. path, "t", {})
  if not chunk then return nil, err end
  local ok, space = pcall(chunk)
  if not ok then return nil, path .. ": " .. tostring(space) end
  local checked, why = check(space)
  if not checked then return nil, path .. ": " .. why end
  return checked, path
end

-- The tile space: `home`/tuning/fwd_space.lua when it exists, else the stand-in above. With
-- `read` (e.g. native.source, which also serves librda's embedded copy), the text comes from
-- read("tuning/fwd_space.lua") instead of the file system.
-- Returns space, origin (the file, or "built-in stand-in"), or nil and a message.
function M.load_space(home, read)
  assert(type(home) == "string", "load_space needs the rda home directory")
  return load_tuning(home, read, "tuning/fwd_space.lua", STAND_IN, M.check_space)
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
-- preferring tiles ptxas does not spill on this target (gen/hw.lua, spills; `causal` of the
-- branch), then block_m <= 64 when a segment's grid has at most 64 rows. wgmma candidates count
-- only with `wgmma` on an sm_90 target.
function M.choose_tile(space, head_dim, w, r, hw, wgmma, causal)
  local list = space[head_dim]
  if not list then
    return nil, string.format("the tile space has no candidates for head_dim = %d", head_dim)
  end
  local small = w // r + (w % r > 0 and 1 or 0) <= SMALL_GRID -- ceil(w / r), no overflow
  local best, rank, why, least -- rank: 2 when it spills, + 1 when too large for a small grid
  for _, c in ipairs(list) do
    local ok, reason = M.fits(head_dim, c, hw)
    if c.wgmma and not admitted(hw, wgmma) then
      ok, reason = false, nil -- not a candidate here, whatever its size
    end
    if ok then
      local k = (hwinfo.spills(hw.arch, "fwd", head_dim, r > 1, causal == true, tile_name(c))
                 and 2 or 0) + ((small and c.block_m > SMALL_GRID) and 1 or 0)
      if k == 0 then return c end
      if not best or k < rank then best, rank = c, k end
    elseif reason and (not least or M.fwd_smem(head_dim, c) < least) then
      least, why = M.fwd_smem(head_dim, c), reason
    end
  end
  if best then return best end
  return nil, string.format("no forward tile for head_dim = %d fits %s: none of the %d "
                            .. "candidates fits (the smallest: %s)", head_dim, hw.name or "?",
                            #list, why or "the others are wgmma tiles, for sm_90 with wgmma on")
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

-- Appends v unless a variant of its name is there; returns its index. Branches that share a
-- variant share its tile: it counts as tuned when any of them took it from tuning.
local function add_variant(plan, index, v)
  local at = index[v.name]
  if at then
    if v.tuned then plan.variants[at].tuned = true end
    return at
  end
  plan.variants[#plan.variants + 1] = v
  index[v.name] = #plan.variants
  return #plan.variants
end

-- The plan: { variants = { {name, kind, source, threads, block_m, block_n, smem_bytes, ...} },
-- steps = { {kernel (index into variants), branch (0-based), head0, nheads, ring_kernel (the
-- kv_table twin of kernel, or nil)} },
-- init_kernel, cast_kernel, ring_pack_kernel, ring_add_kernel (indices into variants) }, or nil
-- and why it cannot fit.
-- With `bspace` (a backward tile space), the backward kernels too (and with `atomic` their
-- atomic-dQ variants): see M.add_backward.
-- With `tun` = { dbs = { database, ... } (gen/tuning.lua, first wins), target = "sm_90" or
-- "emu-sm_90", force = { kind, branch (0-based), tile } or nil }, the tiles come from tuning
-- where it has one (M.tile_for). Every fwd, bwd_dkdv and bwd_dq variant carries `tile` (its
-- tile's name) and `tuned` (true, or nil); neither changes its name or source.
function M.build(cfg, hw, space, bspace, atomic, wgmma, tun)
  check_cfg(cfg)
  assert(type(hw) == "table" and positive_int(hw.smem_per_block), "hw must be a profile")
  space = space or STAND_IN
  if tun then
    local ok, why = M.check_tuning(tun, cfg, bspace ~= nil)
    if not ok then return nil, why end
  end
  local plan, index = { variants = {}, steps = {} }, {}
  for i = 1, #cfg.segments do
    local r = cfg.dilations[i]
    local tile, tuned = M.tile_for("fwd", cfg, i - 1, hw, space, wgmma, tun)
    if not tile then return nil, tuned end
    local v = {
      kind = "fwd", head_dim = cfg.head_dim, dtype = cfg.dtype, causal = cfg.causal,
      dilated = r > 1, block_m = tile.block_m, block_n = tile.block_n, warps = tile.warps,
      stages = tile.stages, threads = 32 * tile.warps, smem_bytes = M.fwd_smem(cfg.head_dim, tile),
      wgmma = tile.wgmma or nil, overlap = tile.overlap or nil, tile = tile_name(tile),
      tuned = tuned or nil,
    }
    v.name = emit.fwd_name(v)
    v.source = emit.fwd_source(v)
    local head0, nheads = M.branch_heads(cfg, i - 1)
    plan.steps[i] = { kernel = add_variant(plan, index, v), branch = i - 1, head0 = head0,
                      nheads = nheads }
    -- A dilated branch whose heads take several offsets reaches a ring rank as several classes'
    -- blocks per round; its twin covers them in one launch (same tile, same resources).
    if v.dilated and cfg.offsets ~= "group" and nheads > 1 then
      local kt = {}
      for k, x in pairs(v) do kt[k] = x end
      kt.kv_table = true
      kt.name = emit.fwd_name(kt)
      kt.source = emit.fwd_source(kt)
      plan.steps[i].ring_kernel = add_variant(plan, index, kt)
    end
  end
  local small = { kind = "init", name = emit.init_name(), source = emit.init_source(),
                  threads = emit.SMALL_THREADS, block_m = 0, block_n = 0, smem_bytes = 0 }
  plan.init_kernel = add_variant(plan, index, small)
  small = { kind = "cast", name = emit.cast_name(cfg.dtype), source = emit.cast_source(cfg.dtype),
            threads = emit.SMALL_THREADS, block_m = 0, block_n = 0, smem_bytes = 0 }
  plan.cast_kernel = add_variant(plan, index, small)
  small = { kind = "ring_pack", name = emit.ring_pack_name(), source = emit.ring_pack_source(),
            threads = emit.SMALL_THREADS, block_m = 0, block_n = 0, smem_bytes = 0 }
  plan.ring_pack_kernel = add_variant(plan, index, small)
  small = { kind = "ring_add", name = emit.ring_add_name(), source = emit.ring_add_source(),
            threads = emit.SMALL_THREADS, block_m = 0, block_n = 0, smem_bytes = 0 }
  plan.ring_add_kernel = add_variant(plan, index, small)
  if bspace then
    local ok, why = M.add_backward(plan, index, cfg, hw, bspace, atomic, wgmma, tun)
    if not ok then return nil, why end
  end
  return plan
end

-- ---------------------------------------------------------------- backward

-- Backward tile candidates per head_dim when tuning/bwd_space.lua is absent (same format).
local BWD_STAND_IN <const> = {
  [32] = { dkdv = { { block_n = 32, block_m = 32, warps = 2, stages = 2, dsplit = 1 } },
           dq = { { block_m = 32, block_n = 32, warps = 2, stages = 2 } } },
  [64] = { dkdv = { { block_n = 32, block_m = 32, warps = 2, stages = 2, dsplit = 1 } },
           dq = { { block_m = 32, block_n = 32, warps = 2, stages = 2 } } },
  [96] = { dkdv = { { block_n = 32, block_m = 32, warps = 2, stages = 2, dsplit = 1 } },
           dq = { { block_m = 32, block_n = 32, warps = 2, stages = 2 } } },
  [128] = { dkdv = { { block_n = 32, block_m = 32, warps = 2, stages = 2, dsplit = 1 } },
            dq = { { block_m = 32, block_n = 32, warps = 2, stages = 2 } } },
  [256] = { dkdv = { { block_n = 32, block_m = 16, warps = 2, stages = 2, dsplit = 2 } },
            dq = { { block_m = 32, block_n = 16, warps = 2, stages = 2 } } },
}
M.BWD_STAND_IN = BWD_STAND_IN

local function bwd_tile_name(kind, c)
  if kind == "dkdv" then
    return string.format("bn%d_bm%d_w%d_s%d_x%d%s", c.block_n, c.block_m, c.warps, c.stages,
                         c.dsplit, c.wgmma and "_wg" or "")
  end
  return tile_name(c)
end

-- Checks a backward space { [head_dim] = { dkdv = {tiles}, dq = {tiles} } }.
-- Returns the space, or nil and what is wrong.
function M.check_bwd_space(space)
  if type(space) ~= "table" then return nil, "the backward tile space must be a table" end
  for d, e in pairs(space) do
    if not positive_int(d) or type(e) ~= "table" then
      return nil, string.format("entry [%s] must map a head_dim to { dkdv = ..., dq = ... }",
                                tostring(d))
    end
    for _, kind in ipairs { "dkdv", "dq" } do
      local list = e[kind]
      if type(list) ~= "table" or #list == 0 then
        return nil, string.format("[%d].%s must be a non-empty list of tiles", d, kind)
      end
      for i, c in ipairs(list) do
        if type(c) ~= "table" or not (positive_int(c.block_m) and positive_int(c.block_n)
                                       and positive_int(c.warps) and positive_int(c.stages)) then
          return nil, string.format("[%d].%s[%d] needs positive integers block_m, block_n, "
                                    .. "warps, stages", d, kind, i)
        end
        local rows, steps = c.block_m, c.block_n -- dq: rows per block, keys per step
        if kind == "dkdv" then
          rows, steps = c.block_n, c.block_m
          if not positive_int(c.dsplit) or d % (16 * c.dsplit) ~= 0 then
            return nil, string.format("[%d].dkdv[%d]: dsplit must be a positive integer with "
                                      .. "head_dim %% (16 * dsplit) == 0", d, i)
          end
        end
        if rows ~= 16 * c.warps then
          return nil, string.format("[%d].%s[%d] %s: rows per block must be 16 * warps", d, kind,
                                    i, bwd_tile_name(kind, c))
        end
        if steps % 16 ~= 0 or c.stages < 2 then
          return nil, string.format("[%d].%s[%d] %s: the step must be a multiple of 16 and "
                                    .. "stages >= 2", d, kind, i, bwd_tile_name(kind, c))
        end
        if c.wgmma ~= nil and type(c.wgmma) ~= "boolean" then
          return nil, string.format("[%d].%s[%d] %s: wgmma must be a boolean", d, kind, i,
                                    bwd_tile_name(kind, c))
        end
        if c.wgmma and kind == "dq" and not wgmma_shape_ok(d, steps, c.warps) then
          return nil, string.format("[%d].dq[%d] %s: a wgmma tile needs head_dim and block_n in "
                                    .. "{64, 128} and warps a multiple of 4", d, i,
                                    bwd_tile_name(kind, c))
        end
        -- overlap (dq only): a tile's K stage stays in use one step longer than the tiles
        -- loaded ahead, so at least 3 stages.
        if c.overlap ~= nil and type(c.overlap) ~= "boolean" then
          return nil, string.format("[%d].%s[%d] %s: overlap must be a boolean", d, kind, i,
                                    bwd_tile_name(kind, c))
        end
        if c.overlap and not (kind == "dq" and c.wgmma and c.stages >= 3) then
          return nil, string.format("[%d].%s[%d] %s: an overlap tile is a dq tile with wgmma = "
                                    .. "true and stages >= 3", d, kind, i, bwd_tile_name(kind, c))
        end
        -- dK/dV keeps a warpgroup's dK and dV (d / 2 registers each per thread) beside S^T and
        -- dP^T (block_m / 2 each): only block_m 64 fits, and at most two warpgroups a block
        -- (three would leave ptxas fewer than 255 registers a thread).
        if c.wgmma and kind == "dkdv" and not (wgmma_shape_ok(d, steps, c.warps)
                                               and c.block_m == 64 and c.warps <= 8
                                               and c.dsplit == 1) then
          return nil, string.format("[%d].dkdv[%d] %s: a wgmma tile needs head_dim 64 or 128, "
                                    .. "block_m 64, warps 4 or 8 and dsplit 1", d, i,
                                    bwd_tile_name(kind, c))
        end
      end
    end
  end
  return space
end

-- `home`/tuning/bwd_space.lua when it exists, else the stand-in above; with `read` (e.g.
-- native.source) the text comes from read("tuning/bwd_space.lua"), as in load_space.
-- Returns space, origin, or nil and a message.
function M.load_bwd_space(home, read)
  assert(type(home) == "string", "load_bwd_space needs the rda home directory")
  return load_tuning(home, read, "tuning/bwd_space.lua", BWD_STAND_IN, M.check_bwd_space)
end

-- Dynamic shared memory of the backward kernels (16-bit tiles, fp32 row statistics).
-- A wgmma dkdv stage rounds its 8 block_m bytes of statistics up to 1024, so that the next
-- stage's tiles start on a 1024-byte boundary (templates/rda_bwd.cuh, DkdvTraits::STAT_SPAN).
function M.bwd_smem(kind, head_dim, c)
  if kind == "dkdv" then
    local stats = 8 * c.block_m
    if c.wgmma then stats = (stats + 1023) // 1024 * 1024 end
    return 4 * head_dim * c.block_n + c.stages * (4 * head_dim * c.block_m + stats)
           + (c.dq_atomic and 2 * c.block_n * c.block_m or 0)
  end
  return 4 * head_dim * c.block_m + 4 * head_dim * c.stages * c.block_n
end

-- The first tile of the list that fits, passing over those ptxas spills on this target (gen/hw.lua,
-- spills) for a branch's variants (dilated, causal) where another fits; wgmma tiles count only
-- with `wgmma` on an sm_90 target.
local function choose_bwd_tile(space, kind, head_dim, hw, wgmma, dilated, causal)
  local e = space[head_dim]
  if not e then
    return nil, string.format("the backward tile space has no candidates for head_dim = %d",
                              head_dim)
  end
  local first
  for _, c in ipairs(e[kind]) do
    if M.usable("bwd_" .. kind, head_dim, c, hw, wgmma) then
      if not hwinfo.spills(hw.arch, "bwd_" .. kind, head_dim, dilated, causal,
                           bwd_tile_name(kind, c)) then
        return c
      end
      first = first or c
    end
  end
  if first then return first end
  return nil, string.format("no backward %s tile for head_dim = %d fits %s (%d bytes of shared "
                            .. "memory per block)", kind, head_dim, hw.name or "?",
                            hw.smem_per_block)
end

-- Adds the backward kernels to a forward plan: one dkdv and one dq variant per distinct
-- (dilated, tile) of the branches (each branch's tiles from M.tile_for: tuning's, else the
-- first that fits), the prep kernel, and plan.bwd_steps = { {dkdv_kernel, dq_kernel, dsplit,
-- branch, head0, nheads, dkdv_ring_kernel, dq_ring_kernel (their kv-table twins, or nil: as the
-- forward's ring_kernel)} } (one per branch, in branch order) and plan.bwd_prep_kernel. With
-- `atomic`, each step also gets dkdv_atomic_kernel: the dkdv variant that adds dQ by atomics
-- (for the non-deterministic mode), on the space's first mma.sync tile that fits, whatever the
-- step's own tile, when that tile has dsplit 1 (else the step has none; rda_bwd_step launches
-- it with dsplit 1). With `wgmma` on an sm_90 target, dkdv and dq tiles marked wgmma are
-- candidates too (those variants then get the "_wg" path; the atomic variant stays on
-- mma.sync). `tun` as M.build's. Returns true, or nil and why no tile fits.
function M.add_backward(plan, index, cfg, hw, bspace, atomic, wgmma, tun)
  local dks, dqs = {}, {} -- per branch: { tile, tuned }
  for i = 1, #cfg.segments do
    local tile, tuned = M.tile_for("bwd_dkdv", cfg, i - 1, hw, bspace, wgmma, tun)
    if not tile then return nil, tuned end
    dks[i] = { tile, tuned or nil }
    tile, tuned = M.tile_for("bwd_dq", cfg, i - 1, hw, bspace, wgmma, tun)
    if not tile then return nil, tuned end
    dqs[i] = { tile, tuned or nil }
  end
  -- The atomic dQ stages dS^T for mma.sync fragments: it has no wgmma path, and is not tuned:
  -- it takes the space's first fitting tile without wgmma (none fitting: no atomic variant, as
  -- at dsplit > 1).
  local dka = atomic and choose_bwd_tile(bspace, "dkdv", cfg.head_dim, hw) or nil
  plan.bwd_steps = {}
  for i = 1, #cfg.segments do
    local dilated = cfg.dilations[i] > 1
    local dk, dq = dks[i][1], dqs[i][1]
    local v = {
      kind = "bwd_dkdv", head_dim = cfg.head_dim, dtype = cfg.dtype, causal = cfg.causal,
      dilated = dilated, block_n = dk.block_n, block_m = dk.block_m, warps = dk.warps,
      stages = dk.stages, dsplit = dk.dsplit, threads = 32 * dk.warps,
      smem_bytes = M.bwd_smem("dkdv", cfg.head_dim, dk), wgmma = dk.wgmma or nil,
      tile = bwd_tile_name("dkdv", dk), tuned = dks[i][2],
    }
    v.name = emit.bwd_dkdv_name(v)
    v.source = emit.bwd_dkdv_source(v)
    local q = {
      kind = "bwd_dq", head_dim = cfg.head_dim, dtype = cfg.dtype, causal = cfg.causal,
      dilated = dilated, block_m = dq.block_m, block_n = dq.block_n, warps = dq.warps,
      stages = dq.stages, threads = 32 * dq.warps, smem_bytes = M.bwd_smem("dq", cfg.head_dim, dq),
      wgmma = dq.wgmma or nil, overlap = dq.overlap or nil, tile = tile_name(dq),
      tuned = dqs[i][2],
    }
    q.name = emit.bwd_dq_name(q)
    q.source = emit.bwd_dq_source(q)
    local head0, nheads = M.branch_heads(cfg, i - 1)
    plan.bwd_steps[i] = { dkdv_kernel = add_variant(plan, index, v),
                          dq_kernel = add_variant(plan, index, q), dsplit = dk.dsplit,
                          branch = i - 1, head0 = head0, nheads = nheads }
    if atomic and dka and dka.dsplit == 1 then -- at dsplit > 1 whole-width dK/dV would not fit
      local a = {}
      for key, val in pairs(v) do a[key] = val end
      a.block_n, a.block_m, a.warps, a.stages = dka.block_n, dka.block_m, dka.warps, dka.stages
      a.threads, a.dq_atomic, a.dsplit, a.wgmma = 32 * dka.warps, true, 1, nil
      a.tile, a.tuned = bwd_tile_name("dkdv", a), nil
      local mt = a.block_m // 16
      a.smem_bytes = M.bwd_smem("dkdv", cfg.head_dim, a)
      if a.warps % mt == 0 and cfg.head_dim % (16 * (a.warps // mt)) == 0
         and a.smem_bytes <= hw.smem_per_block then
        a.name = emit.bwd_dkdv_name(a)
        a.source = emit.bwd_dkdv_source(a)
        plan.bwd_steps[i].dkdv_atomic_kernel = add_variant(plan, index, a)
      end
    end
    -- The ring's twins, under the forward's condition (M.build): one launch of each covers a
    -- round's blocks of several classes from one peer.
    if dilated and cfg.offsets ~= "group" and nheads > 1 then
      local function twin(x, name_of, source_of)
        local t = {}
        for key, val in pairs(x) do t[key] = val end
        t.kv_table = true
        t.name = name_of(t)
        t.source = source_of(t)
        return add_variant(plan, index, t)
      end
      plan.bwd_steps[i].dkdv_ring_kernel = twin(v, emit.bwd_dkdv_name, emit.bwd_dkdv_source)
      plan.bwd_steps[i].dq_ring_kernel = twin(q, emit.bwd_dq_name, emit.bwd_dq_source)
    end
  end
  local prep = { kind = "bwd_prep", name = emit.bwd_prep_name(cfg.dtype),
                 source = emit.bwd_prep_source(cfg.dtype), threads = emit.SMALL_THREADS,
                 block_m = 0, block_n = 0, smem_bytes = 0 }
  plan.bwd_prep_kernel = add_variant(plan, index, prep)
  return true
end


-- ---------------------------------------------------------------- tuning

local SPACE_KIND <const> = { bwd_dkdv = "dkdv", bwd_dq = "dq" }
local MAX_CANDIDATES <const> = 16 -- RDA_TUNE_MAX_CANDIDATES (runtime/gen.h)
M.MAX_CANDIDATES = MAX_CANDIDATES

-- The name of tile c of tuning kind `kind` ("fwd", "bwd_dkdv", "bwd_dq"), as the tuning
-- databases name it.
function M.tile_name(kind, c)
  if kind == "bwd_dkdv" then return bwd_tile_name("dkdv", c) end
  return tile_name(c)
end

-- The space's tiles of `kind` for head_dim (space: a forward space for "fwd", else a
-- backward one), or nil and the message the default rule gives.
local function tiles_of(kind, space, head_dim)
  if kind == "fwd" then
    if not space[head_dim] then
      return nil, string.format("the tile space has no candidates for head_dim = %d", head_dim)
    end
    return space[head_dim]
  end
  if not space[head_dim] then
    return nil, string.format("the backward tile space has no candidates for head_dim = %d",
                              head_dim)
  end
  return space[head_dim][SPACE_KIND[kind]]
end

-- Whether tile c of `kind` is a fitting, allowed candidate on hw (choose_bwd_tile's rule, and
-- choose_tile's); else why not.
function M.usable(kind, head_dim, c, hw, wgmma)
  if c.wgmma and not admitted(hw, wgmma) then
    return false, "a wgmma tile, taken only on sm_90 with wgmma on"
  end
  if kind == "fwd" then
    local ok, why = M.fits(head_dim, c, hw)
    if not ok then return false, why end
    return true
  end
  local smem = M.bwd_smem(SPACE_KIND[kind], head_dim, c)
  if smem > hw.smem_per_block then
    return false, string.format("it needs %d bytes of shared memory, %d available per block",
                                smem, hw.smem_per_block)
  end
  local max_threads = math.min(MAX_THREADS_PER_BLOCK, hw.max_threads_per_sm)
  if 32 * c.warps > max_threads then
    return false, string.format("it needs %d threads, at most %d per block", 32 * c.warps,
                                max_threads)
  end
  return true
end

-- The names of the tiles of `list` (the space's tiles of `kind` for head_dim) that are fitting,
-- allowed candidates on hw now, in the list's order, each once: what a tune tries, and what a
-- tuning entry must have tried to be used.
function M.candidate_names(kind, list, head_dim, hw, wgmma)
  local names, named = {}, {}
  for _, c in ipairs(list) do
    local name = M.tile_name(kind, c)
    if not named[name] and M.usable(kind, head_dim, c, hw, wgmma) then
      named[name] = true
      names[#names + 1] = name
    end
  end
  return names
end

-- The tuning key (gen/tuning.lua) of `kind` for branch b (0-based) of cfg on `target`, with
-- `wgmma` whether the wgmma tiles are admitted (tuning.wgmma_admitted, not the bare switch;
-- nil: false).
function M.tuning_key(cfg, b, kind, target, wgmma)
  local w, r = cfg.segments[b + 1], cfg.dilations[b + 1]
  return tuning.key(target, kind, cfg.head_dim, cfg.dtype, cfg.causal, r > 1, tuning.rows(w, r),
                    wgmma == true)
end

-- Whether tuning entry e tried every name of `names` (a list).
local function tried_all(e, names)
  local tried = {}
  for _, name in ipairs(e.candidates) do tried[name] = true end
  for _, name in ipairs(names) do
    if not tried[name] then return false end
  end
  return true
end

-- Checks M.build's `tun` against cfg (backward: whether the backward is planned): the force
-- must name a planned kind and an existing branch. Returns true, or nil and why.
function M.check_tuning(tun, cfg, backward)
  assert(type(tun) == "table" and type(tun.dbs) == "table" and type(tun.target) == "string",
         "tuning must be { dbs, target, force }")
  local f = tun.force
  if f == nil then return true end
  assert(type(f) == "table", "tuning force must be a table")
  if f.kind ~= "fwd" and not SPACE_KIND[f.kind] then
    return nil, string.format("forced kind %s: must be fwd, bwd_dkdv or bwd_dq", tostring(f.kind))
  end
  if SPACE_KIND[f.kind] and not backward then
    return nil, string.format("forced kind %s: this plan has no backward", f.kind)
  end
  if not (math.type(f.branch) == "integer" and f.branch >= 0 and f.branch < #cfg.segments) then
    return nil, string.format("forced branch %s: the config has branches 0 to %d",
                              tostring(f.branch), #cfg.segments - 1)
  end
  if type(f.tile) ~= "string" then return nil, "the forced tile must be a tile name" end
  return true
end

-- The tile of `kind` ("fwd", "bwd_dkdv", "bwd_dq") for branch b (0-based) of cfg on hw, from
-- `space` (forward or backward, after kind), with `tun` (M.build's, or nil):
--   1. tun.force for this kind and branch (unless ignore_force): that tile, if it is a
--      fitting, allowed candidate; else nil and why;
--   2. else the first ranked tile, by name, that is a fitting, allowed candidate of the space
--      now, of the first database entry of the branch's key (its wgmma state: admitted here
--      or not) that has one and is not stale: an entry is stale, and skipped, when a fitting,
--      allowed candidate now is not among its candidates (the space gained it after the tune);
--   3. else the default rule, passing over tiles ptxas spills here where another fits:
--      choose_tile (small grids prefer block_m <= 64) for the forward, the first that fits for
--      the backward.
-- Returns tile, tuned (true for 1 and 2, nil for 3), or nil and why.
function M.tile_for(kind, cfg, b, hw, space, wgmma, tun, ignore_force)
  local d = cfg.head_dim
  local list, why = tiles_of(kind, space, d)
  if not list then return nil, why end
  if tun then
    local f = not ignore_force and tun.force
    if f and f.kind == kind and f.branch == b then
      for _, c in ipairs(list) do
        if M.tile_name(kind, c) == f.tile then
          local ok, reason = M.usable(kind, d, c, hw, wgmma)
          if ok then return c, true end
          return nil, string.format("%s is not a candidate for %s branch %d here: %s", f.tile,
                                    kind, b, reason)
        end
      end
      return nil, string.format("%s is not a candidate for %s branch %d here: the tile space "
                                .. "has no such tile for head_dim = %d", f.tile, kind, b, d)
    end
    local line = tuning.key_line(M.tuning_key(cfg, b, kind, tun.target, admitted(hw, wgmma)))
    local entries = tuning.entries(tun.dbs, line)
    local now = #entries > 0 and M.candidate_names(kind, list, d, hw, wgmma)
    for _, e in ipairs(entries) do
      if tried_all(e, now) then
        for _, ranked in ipairs(e.ranking) do
          for _, c in ipairs(list) do
            if M.tile_name(kind, c) == ranked.tile and M.usable(kind, d, c, hw, wgmma) then
              return c, true
            end
          end
        end
      end
    end
  end
  if kind == "fwd" then
    return M.choose_tile(space, d, cfg.segments[b + 1], cfg.dilations[b + 1], hw, wgmma,
                         cfg.causal)
  end
  return choose_bwd_tile(space, SPACE_KIND[kind], d, hw, wgmma, cfg.dilations[b + 1] > 1,
                         cfg.causal)
end

-- What `rdagen tune` measures for cfg on hw (runtime/gen.h, rda_tune_task): one task per
-- distinct key, the forward's by branch, then with `bspace` the dK/dV's and the dQ's: { kind,
-- branch (0-based, the first of the key), key (its line), fields (the key as a table; its
-- wgmma: whether wgmma tiles are admitted), candidates (M.candidate_names: every fitting,
-- allowed tile of the space, in its order), chosen (the name of what a plan with `tun` takes
-- now, force ignored), tuned (true when chosen came from a database entry, else nil) }. Returns the list, or nil and why (no tile fits; more than
-- MAX_CANDIDATES candidates).
function M.tune_tasks(cfg, hw, space, bspace, wgmma, tun)
  check_cfg(cfg)
  assert(type(hw) == "table" and positive_int(hw.smem_per_block), "hw must be a profile")
  space = space or STAND_IN
  local target = tun and tun.target or tuning.target(hw)
  local kinds = bspace and { "fwd", "bwd_dkdv", "bwd_dq" } or { "fwd" }
  local tasks, seen = {}, {}
  for _, kind in ipairs(kinds) do
    local sp = kind == "fwd" and space or bspace
    for b = 0, #cfg.segments - 1 do
      local fields = M.tuning_key(cfg, b, kind, target, admitted(hw, wgmma))
      local line = tuning.key_line(fields)
      if not seen[line] then
        seen[line] = true
        local chosen, tuned = M.tile_for(kind, cfg, b, hw, sp, wgmma, tun, true)
        if not chosen then return nil, tuned end
        local candidates = M.candidate_names(kind, tiles_of(kind, sp, cfg.head_dim), cfg.head_dim,
                                             hw, wgmma)
        if #candidates > MAX_CANDIDATES then
          return nil, string.format("%s: %d candidate tiles, more than the %d one task can time",
                                    line, #candidates, MAX_CANDIDATES)
        end
        tasks[#tasks + 1] = { kind = kind, branch = b, key = line, fields = fields,
                              candidates = candidates, chosen = M.tile_name(kind, chosen),
                              tuned = tuned or nil }
      end
    end
  end
  return tasks
end

return M
