-- bridge.lua — the functions runtime/gen.c calls. Each returns its result, or nil and a one-line
-- message for an expected failure (a bad config, an unknown arch, a plan that cannot fit);
-- anything raised instead is a bug and reaches C with a traceback.

local native = require "rda.native"
local config = require "gen.config"
local hw = require "gen.hw"
local plan = require "gen.plan"

local M = {}

-- Config text -> validated config table (dtype and offsets as names, scale resolved).
function M.config(text, where)
  return config.load(text, where)
end

-- Built-in profile of sm_`arch`.
function M.hw(arch)
  return hw.builtin(arch)
end

-- Validated config + profile -> plan (see gen/plan.lua), with the tile space from
-- tuning/fwd_space.lua when it exists; with `backward`, also the backward kernels (tiles
-- from tuning/bwd_space.lua); with `atomic` too, the atomic-dQ variants of the dK/dV kernels;
-- with `wgmma`, the tile space's wgmma candidates may serve an sm_90 target.
function M.plan(cfg, profile, backward, atomic, wgmma)
  hw.check(profile)
  local space, origin = plan.load_space(native.home(), native.source)
  if not space then return nil, "tile space: " .. origin end
  local bspace
  if backward then
    local borigin
    bspace, borigin = plan.load_bwd_space(native.home(), native.source)
    if not bspace then return nil, "backward tile space: " .. borigin end
  end
  local p, why = plan.build(cfg, profile, space, bspace, backward and atomic, wgmma)
  if not p then return nil, why end
  p.space = origin
  return p
end

return M
