-- bridge.lua — the functions runtime/gen.c calls. Each returns its result, or nil and a one-line
-- message for an expected failure (a bad config, an unknown arch, a plan that cannot fit);
-- plan, tune_tasks and tune_merge add a third value, "config", when the failure is a tuning
-- database that does not load or check. Anything raised instead is a bug and reaches C with a
-- traceback.

local native = require "rda.native"
local config = require "gen.config"
local hw = require "gen.hw"
local plan = require "gen.plan"
local tuning = require "gen.tuning"

local M = {}

-- Config text -> validated config table (dtype and offsets as names, scale resolved).
function M.config(text, where)
  return config.load(text, where)
end

-- Built-in profile of sm_`arch`.
function M.hw(arch)
  return hw.builtin(arch)
end

-- The forward space, and with `backward` the backward space; or nil and a message.
local function spaces(backward)
  local space, origin = plan.load_space(native.home(), native.source)
  if not space then return nil, "tile space: " .. origin end
  local bspace
  if backward then
    local borigin
    bspace, borigin = plan.load_bwd_space(native.home(), native.source)
    if not bspace then return nil, "backward tile space: " .. borigin end
  end
  return space, origin, bspace
end

-- What M.plan and M.tune_tasks start from: the checked profile, the tile spaces and the
-- tuning (tuning.for_plan). Returns space, origin, bspace, tuning; or nil, a message and, for
-- a tuning database that does not load or check, "config".
local function prepare(profile, backward, tun)
  hw.check(profile)
  local space, origin, bspace = spaces(backward)
  if not space then return nil, origin end
  local t, why, class = tuning.for_plan(profile, tun, native.source, native.home())
  if not t then return nil, why, nil, nil, class end
  return space, origin, bspace, t
end

-- Validated config + profile -> plan (see gen/plan.lua), with the tile space from
-- tuning/fwd_space.lua when it exists; with `backward`, also the backward kernels (tiles
-- from tuning/bwd_space.lua); with `atomic` too, the atomic-dQ variants of the dK/dV kernels;
-- with `wgmma`, the tile space's wgmma candidates may serve an sm_90 target. `tun` ({ user =
-- <the user's database text or nil>, user_name = <its name for messages, or nil>, force =
-- { kind, branch (0-based), tile } or nil }, or nil; see tuning.for_plan) ranks the tiles per
-- key before the shipped tuning/db.lua, and may force one.
-- Returns the plan; or nil, a message and "config" for a tuning database that does not load
-- or check; or nil and a message when no tile fits or the forced tile is not a candidate.
function M.plan(cfg, profile, backward, atomic, wgmma, tun)
  local space, origin, bspace, t, class = prepare(profile, backward, tun)
  if not space then return nil, origin, class end
  local p, why = plan.build(cfg, profile, space, bspace, backward and atomic, wgmma, t)
  if not p then return nil, why end
  p.space = origin
  return p
end

-- The tuning tasks of a config on a profile (plan.tune_tasks: { kind, branch, key (its line,
-- wgmma state included), fields, candidates, chosen, tuned }, in order: fwd by branch, then with
-- `backward` bwd_dkdv and bwd_dq by branch, one per distinct key). `tun` as M.plan's (its
-- force is ignored). Errors as M.plan's.
function M.tune_tasks(cfg, profile, backward, wgmma, tun)
  local space, origin, bspace, t, class = prepare(profile, backward, tun)
  if not space then return nil, origin, class end
  local tasks, why = plan.tune_tasks(cfg, profile, space, bspace, wgmma, t)
  if not tasks then return nil, why end
  return tasks
end

-- The text of the tuning database old_text (nil: empty; old_name names it, default "tuning
-- database") with `results` ({ { task = <1-based index into M.tune_tasks' list for the same
-- cfg, profile, backward and wgmma>, ranking = { { tile, us }, ... } } }) as entries measured
-- as `meta` ({ device, date, rda, n, batch }), replacing those of the same keys (the key has
-- the tasks' wgmma state: a tune without wgmma leaves a wgmma entry alone), each with its
-- task's candidates: sorted by key, deterministic. Returns the text; or nil, a message and
-- "config" when old_text does not load or check; or nil and a message for a bad result.
function M.tune_merge(old_text, old_name, cfg, profile, backward, wgmma, results, meta)
  hw.check(profile)
  old_name = old_name or "tuning database"
  local old = { entries = {} }
  if old_text ~= nil then
    local why
    old, why = tuning.load_user(old_text, old_name)
    if not old then return nil, why, "config" end
  end
  local space, origin, bspace = spaces(backward)
  if not space then return nil, origin end
  local tasks, why = plan.tune_tasks(cfg, profile, space, bspace, wgmma,
                                     { dbs = {}, target = tuning.target(profile) })
  if not tasks then return nil, why end
  return tuning.merge(old, tasks, results, meta)
end

return M
