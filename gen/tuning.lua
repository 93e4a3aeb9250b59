-- tuning.lua — the tuning databases (runtime/gen.h, "tuning"): per key, a ranking of tiles
-- measured by `rdagen tune`, fastest first. Keys, the database text (read, checked, written),
-- lookup, and the merge of new measurements. The planner (gen/plan.lua) uses an entry only
-- when it tried every tile that is a fitting, allowed candidate of the space now (else the
-- entry is stale: the space or the rules changed since), and then takes its first ranked tile
-- that is such a candidate.
--
-- The text is a Lua chunk returning a list of entries:
--   { target = "sm_90", kind = "fwd", head_dim = 128, dtype = "bf16", causal = true,
--     dilated = false, rows = 2048, wgmma = false,
--     candidates = { "bm128_bn64_w8_s2", "bm64_bn64_w4_s2", "bm64_bn32_w4_s2" },
--     ranking = { { tile = "bm128_bn64_w8_s2", us = 812.5 }, ... },   -- fastest first
--     measured = { device = "...", date = "YYYY-MM-DD", rda = "...", n = 32768, batch = 1 } }
-- target "sm_<arch>", or "emu-sm_<arch>" for plans of the CPU emulator; kind "fwd", "bwd_dkdv"
-- or "bwd_dq"; rows the branch's grid rows ceil(w / r) rounded up to a power of two, at least
-- 16; wgmma whether the wgmma tiles were admitted (wgmma on and an sm_90 target: always false
-- elsewhere), so a tune without them never steers a plan with them, nor replaces their entry;
-- candidates every tile the tuner tried, in its order, failed ones included (the ranking's
-- tiles are among them). measured is optional, and so is each of its fields. At most one
-- entry per key; any other key anywhere is an error (a typo must not silently void an entry).

local native = require "rda.native"

local M = {}

local KINDS <const> = { "fwd", "bwd_dkdv", "bwd_dq" }
local KIND_ORDER <const> = { fwd = 1, bwd_dkdv = 2, bwd_dq = 3 }
local DTYPES <const> = { bf16 = true, fp16 = true }
local MIN_ROWS <const> = 16
local MAX_TEXT <const> = 200 -- characters of a string field (a device name, a version)
local MAX_TILE <const> = 47  -- RDA_TUNE_NAME - 1 (runtime/gen.h)
-- A user database runs sandboxed under these limits, at every plan: a real one of a few hundred
-- entries takes well under a tenth of them.
local MAX_INSTRUCTIONS <const> = 10000000
local MAX_BYTES <const> = 64 * 1024 * 1024

M.KINDS = KINDS
M.MAX_INSTRUCTIONS = MAX_INSTRUCTIONS
M.MAX_BYTES = MAX_BYTES

local function positive_int(x) return math.type(x) == "integer" and x > 0 end

-- ---------------------------------------------------------------- keys

-- The key's rows for a branch of segment w and dilation r: ceil(w / r) grid rows, rounded up to
-- a power of two, at least 16. Integers throughout: w may be up to 2^63 - 1, and the grids
-- beyond 2^62 rows (no larger power of two is an integer) share the bucket 2^62.
local MAX_ROWS <const> = 1 << 62
function M.rows(w, r)
  assert(positive_int(w) and positive_int(r), "rows needs positive integers w and r")
  local g = w // r + (w % r > 0 and 1 or 0)
  local p = MIN_ROWS
  while p < g and p < MAX_ROWS do p = p * 2 end
  return p
end

-- The target of a hardware profile: "sm_90", or "emu-sm_90" when the CPU emulator plans with
-- it (emulated = true; nil counts as false).
function M.target(hw)
  assert(type(hw) == "table" and positive_int(hw.arch), "target needs a profile with an arch")
  assert(hw.emulated == nil or type(hw.emulated) == "boolean", "profile emulated must be a boolean")
  return string.format("%ssm_%d", hw.emulated and "emu-" or "", hw.arch)
end

-- A key as a table with the fields of an entry. wgmma: whether the wgmma tiles are admitted
-- (M.wgmma_admitted), a boolean.
function M.key(target, kind, head_dim, dtype, causal, dilated, rows, wgmma)
  return { target = target, kind = kind, head_dim = head_dim, dtype = dtype, causal = causal,
           dilated = dilated, rows = rows, wgmma = wgmma }
end

-- Whether a plan on hw with the wgmma switch `wgmma` (nil: off) admits the wgmma tiles: only
-- on sm_90 (gen/plan.lua's rule). Always a boolean, as a key's wgmma is.
local WGMMA_ARCH <const> = 90
M.WGMMA_ARCH = WGMMA_ARCH
function M.wgmma_admitted(hw, wgmma)
  return wgmma and hw.arch == WGMMA_ARCH or false
end

-- One line naming a key (an entry has the key's fields), e.g.
-- "sm_90 fwd d128 bf16 causal dense rows2048 mma" ("... wgmma" with the wgmma tiles).
function M.key_line(k)
  return string.format("%s %s d%d %s %s %s rows%d %s", k.target, k.kind, k.head_dim, k.dtype,
                       k.causal and "causal" or "noncausal", k.dilated and "dilated" or "dense",
                       k.rows, k.wgmma and "wgmma" or "mma")
end

-- Entries in key order: target, kind (fwd, bwd_dkdv, bwd_dq), head_dim, dtype, causal,
-- dilated (false first), rows, wgmma (false first).
local function key_less(a, b)
  if a.target ~= b.target then return a.target < b.target end
  if a.kind ~= b.kind then return KIND_ORDER[a.kind] < KIND_ORDER[b.kind] end
  if a.head_dim ~= b.head_dim then return a.head_dim < b.head_dim end
  if a.dtype ~= b.dtype then return a.dtype < b.dtype end
  if a.causal ~= b.causal then return b.causal end
  if a.dilated ~= b.dilated then return b.dilated end
  if a.rows ~= b.rows then return a.rows < b.rows end
  if a.wgmma ~= b.wgmma then return b.wgmma end
  return false
end

-- ---------------------------------------------------------------- checking

-- A short, one-line rendering of a value for messages.
local function show(v)
  if type(v) == "string" then
    local s = string.format("%q", #v > 40 and v:sub(1, 40) .. "..." or v)
    return (s:gsub("\\\n", "\\n"))
  elseif type(v) == "number" and v ~= v then
    return "nan" -- tostring gives "-nan" or "nan" by platform
  elseif type(v) == "number" or type(v) == "boolean" or v == nil then
    return tostring(v)
  end
  return "a " .. type(v)
end

-- A decimal field of a tile name: canonical (no sign, no leading zero), positive, not absurd.
local function tile_number(s)
  return s ~= nil and #s <= 6 and s:match("^[1-9]%d*$") ~= nil
end

-- Whether `name` is a well-formed tile name of `kind` (gen/plan.lua's tile_name for fwd and dq,
-- bwd_tile_name for dkdv); else why. It need not be in any space.
function M.tile_name_ok(kind, name)
  if type(name) ~= "string" then return false, "must be a tile name (a string)" end
  if #name > MAX_TILE then return false, string.format("is longer than %d characters", MAX_TILE) end
  local nums, rest
  if kind == "bwd_dkdv" then
    local bn, bm, w, s, x, r = name:match("^bn(%d+)_bm(%d+)_w(%d+)_s(%d+)_x(%d+)(.*)$")
    nums, rest = { bn, bm, w, s, x }, r
  else
    local bm, bn, w, s, r = name:match("^bm(%d+)_bn(%d+)_w(%d+)_s(%d+)(.*)$")
    nums, rest = { bm, bn, w, s }, r
  end
  -- "_wgo": a forward or dQ wgmma tile with overlap (gen/plan.lua).
  local ok = rest == "" or rest == "_wg" or (rest == "_wgo" and kind ~= "bwd_dkdv")
  for i = 1, (kind == "bwd_dkdv" and 5 or 4) do ok = ok and tile_number(nums[i]) end
  if not ok then
    return false, kind == "bwd_dkdv" and "is not a dK/dV tile name like \"bn64_bm32_w4_s2_x1\""
                  or string.format("is not a %s tile name like \"bm64_bn64_w4_s2\"", kind)
  end
  return true
end

-- The key of table t not in `known` (a set) that shows least (deterministic for a message,
-- found in one pass: a sort of a million keys takes half a minute), shown; or nil.
local function unknown_key(t, known)
  local least
  for k in next, t do
    if not known[k] then
      local s = show(k)
      if least == nil or s < least then least = s end
    end
  end
  return least
end

-- Whether t is a plain list: exactly the keys 1..n.
local function is_list(t)
  local n = 0
  for _ in next, t do n = n + 1 end
  for i = 1, n do
    if rawget(t, i) == nil then return false end
  end
  return true, n
end

local function printable(s)
  return #s <= MAX_TEXT and not s:find("[%c]")
end

local ENTRY_KEYS <const> = { target = true, kind = true, head_dim = true, dtype = true,
                             causal = true, dilated = true, rows = true, wgmma = true,
                             candidates = true, ranking = true, measured = true }
local RANK_KEYS <const> = { tile = true, us = true }
local MEASURED_KEYS <const> = { device = true, date = true, rda = true, n = true, batch = true }
local MEASURED_ORDER <const> = { "device", "date", "rda", "n", "batch" }

local function field_error(field, value, what)
  return string.format("%s = %s: %s", field, show(value), what)
end

-- A valid calendar-shaped date "YYYY-MM-DD" (month 01..12, day 01..31).
-- A calendar date: the day within its month (Gregorian leap years).
local function date_ok(s)
  local y, m, d = s:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)$")
  if not y then return false end
  y, m, d = tonumber(y), tonumber(m), tonumber(d)
  if m < 1 or m > 12 or d < 1 then return false end
  local leap = (y % 4 == 0 and y % 100 ~= 0) or y % 400 == 0
  local days = { 31, leap and 29 or 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }
  return d <= days[m]
end

local function finite_positive(x)
  return type(x) == "number" and x > 0 and x < math.huge -- false for NaN too
end

-- The measured table of an entry (optional fields, each typed); nil or why.
local function check_measured(m)
  if type(m) ~= "table" then
    return field_error("measured", m, "must be a table { device, date, rda, n, batch }")
  end
  local extra = unknown_key(m, MEASURED_KEYS)
  if extra then
    return string.format("measured: unknown key %s (known: device, date, rda, n, batch)", extra)
  end
  for _, k in ipairs { "device", "rda" } do
    local v = m[k]
    if v ~= nil and (type(v) ~= "string" or not printable(v)) then
      return field_error("measured." .. k, v, string.format("must be a string of printable "
                                                           .. "characters, at most %d", MAX_TEXT))
    end
  end
  if m.date ~= nil and (type(m.date) ~= "string" or not date_ok(m.date)) then
    return field_error("measured.date", m.date, "must be a date \"YYYY-MM-DD\"")
  end
  for _, k in ipairs { "n", "batch" } do
    if m[k] ~= nil and not positive_int(m[k]) then
      return field_error("measured." .. k, m[k], "must be a positive integer")
    end
  end
  return nil
end

-- What is wrong with entry e (nil when nothing), without the "entry i: " prefix.
local function check_entry(e)
  if type(e) ~= "table" then return "must be a table, not " .. show(e) end
  local extra = unknown_key(e, ENTRY_KEYS)
  if extra then
    return string.format("unknown key %s (known: target, kind, head_dim, dtype, causal, "
                         .. "dilated, rows, wgmma, candidates, ranking, measured)", extra)
  end
  local t = e.target
  if type(t) ~= "string"
     or not (t:match("^sm_[1-9]%d?%d?$") or t:match("^emu%-sm_[1-9]%d?%d?$")) then
    return field_error("target", t, "must be \"sm_<arch>\" or \"emu-sm_<arch>\"")
  end
  if not KIND_ORDER[e.kind] then
    return field_error("kind", e.kind, "must be \"fwd\", \"bwd_dkdv\" or \"bwd_dq\"")
  end
  if not positive_int(e.head_dim) then
    return field_error("head_dim", e.head_dim, "must be a positive integer")
  end
  if not DTYPES[e.dtype] then
    return field_error("dtype", e.dtype, "must be \"bf16\" or \"fp16\"")
  end
  if type(e.causal) ~= "boolean" then
    return field_error("causal", e.causal, "must be a boolean")
  end
  if type(e.dilated) ~= "boolean" then
    return field_error("dilated", e.dilated, "must be a boolean")
  end
  local r = e.rows
  if not (positive_int(r) and r >= MIN_ROWS and r & (r - 1) == 0) then
    return field_error("rows", r, "must be a power of two, at least 16")
  end
  if type(e.wgmma) ~= "boolean" then
    -- nil: most likely an entry from before rda recorded wgmma and candidates.
    return field_error("wgmma", e.wgmma, "must be a boolean (whether wgmma tiles were admitted)"
                                         .. (e.wgmma == nil and "; an entry of an older rda: "
                                             .. "remove the database and tune again" or ""))
  end
  if e.wgmma and t:match("%d+$") ~= tostring(WGMMA_ARCH) then
    return field_error("wgmma", e.wgmma, string.format("wgmma tiles are admitted only on "
                                                       .. "sm_%d, not %s", WGMMA_ARCH, t))
  end
  local cands = e.candidates
  if type(cands) ~= "table" then
    return field_error("candidates", cands, "must be the list of tile names the tuner tried")
  end
  local clist, nc = is_list(cands)
  if not clist then return "candidates: must be a list (keys 1..n only)" end
  if nc == 0 then return "candidates: must not be empty" end
  local tried = {}
  for i = 1, nc do
    local x, at = cands[i], string.format("candidates[%d]", i)
    local ok, why = M.tile_name_ok(e.kind, x)
    if not ok then return field_error(at, x, why) end
    if tried[x] then
      return field_error(at, x, string.format("repeats candidates[%d]", tried[x]))
    end
    -- A tile name ends in "_wg" (or "_wgo") exactly when it is a wgmma tile (gen/plan.lua).
    if not e.wgmma and (x:sub(-3) == "_wg" or x:sub(-4) == "_wgo") then
      return field_error(at, x, "is a wgmma tile, in an entry without wgmma (wgmma = false)")
    end
    tried[x] = i
  end
  local rk = e.ranking
  if type(rk) ~= "table" then return field_error("ranking", rk, "must be a list of tiles") end
  local list, n = is_list(rk)
  if not list then return "ranking: must be a list (keys 1..n only)" end
  if n == 0 then return "ranking: must not be empty" end
  local seen = {}
  for i = 1, n do
    local x, at = rk[i], string.format("ranking[%d]", i)
    if type(x) ~= "table" then
      return field_error(at, x, "must be a table { tile = <name>, us = <microseconds> }")
    end
    extra = unknown_key(x, RANK_KEYS)
    if extra then return string.format("%s: unknown key %s (known: tile, us)", at, extra) end
    local ok, why = M.tile_name_ok(e.kind, x.tile)
    if not ok then return field_error(at .. ".tile", x.tile, why) end
    if seen[x.tile] then
      return field_error(at .. ".tile", x.tile, string.format("repeats ranking[%d]", seen[x.tile]))
    end
    seen[x.tile] = i
    if not tried[x.tile] then
      return field_error(at .. ".tile", x.tile, "is not one of the entry's candidates")
    end
    if not finite_positive(x.us) then
      return field_error(at .. ".us", x.us, "must be a positive finite number of microseconds")
    end
    if i > 1 and x.us < rk[i - 1].us then
      return field_error(at .. ".us", x.us, string.format("is below ranking[%d].us = %s: the "
                                                          .. "ranking goes fastest first", i - 1,
                                                          show(rk[i - 1].us)))
    end
  end
  if e.measured ~= nil then return check_measured(e.measured) end
  return nil
end

-- Checks a database value `list` (what its chunk returned); `name` starts every message.
-- Returns the database { name, entries (the list), by_key (key line -> entry) }, or nil and
-- "<name>: entry <i>: <what is wrong>".
function M.check(list, name)
  assert(type(name) == "string", "check needs the database's name")
  if type(list) ~= "table" then
    return nil, string.format("%s: the tuning database must return a list of entries, not %s",
                              name, list == nil and "nothing" or show(list))
  end
  local ok, n = is_list(list)
  if not ok then
    return nil, name .. ": the tuning database must return a list of entries (keys 1..n only)"
  end
  local by_key, at = {}, {}
  for i = 1, n do
    local why = check_entry(list[i])
    if why then return nil, string.format("%s: entry %d: %s", name, i, why) end
    local line = M.key_line(list[i])
    if at[line] then
      return nil, string.format("%s: entry %d: the same key as entry %d (%s)", name, i, at[line],
                                line)
    end
    at[line], by_key[line] = i, list[i]
  end
  return { name = name, entries = list, by_key = by_key }
end

-- ---------------------------------------------------------------- loading

-- A user database: untrusted text, run in the sandbox (native.sandbox_run) with an environment
-- holding nothing callable, under the limits above and the generator's time limit (`seconds`,
-- for tests, lowers it). Returns the database, or nil and one line naming `name` in full.
function M.load_user(text, name, seconds)
  assert(type(text) == "string" and type(name) == "string", "load_user(text, name)")
  -- sandbox_run needs env.string: an empty one, so ("x"):rep(...) finds nothing either.
  -- Checked within the same time limit: 20,000 entries sharing one list of 200,000 tiles are
  -- little memory and hours of checks.
  local ok, v = native.sandbox_run(text, "@" .. name, { string = {} }, MAX_INSTRUCTIONS, MAX_BYTES,
                                   seconds, "the tuning database",
                                   function(list) return M.check(list, name) end)
  if not ok then
    v = tostring(v):gsub("\n.*", "") -- one line
    if v:sub(1, #name) ~= name then v = name .. ": " .. v end
    return nil, v
  end
  return v
end

local shipped_cache = { text = nil, db = nil }

-- The shipped database: trusted text (tuning/db.lua as librda serves it), loaded like the tile
-- spaces and checked like a user's; the parsed copy is kept per text, since every plan reads
-- it. `read` is native.source; a file it cannot serve is an empty database. Returns the
-- database, or nil and a message naming `home`/tuning/db.lua.
function M.shipped(read, home)
  assert(type(read) == "function" and type(home) == "string", "shipped(read, home)")
  local name = home .. "/tuning/db.lua"
  local text = read("tuning/db.lua")
  if not text then return { name = name, entries = {}, by_key = {} } end
  if shipped_cache.text == text then return shipped_cache.db end
  local chunk, err = load(text, "@" .. name, "t", {})
  if not chunk then return nil, err end
  local ok, list = pcall(chunk)
  if not ok then return nil, name .. ": " .. tostring(list) end
  local db, why = M.check(list, name)
  if not db then return nil, why end
  shipped_cache.text, shipped_cache.db = text, db
  return db
end

-- plan.build's tuning argument { dbs, target, force } for a plan on `profile`, from the
-- bridge's `tun` ({ user = <database text or nil>, user_name = <its name, or nil: "tuning
-- database">, force = { kind, branch, tile } or nil }, or nil): the user's database (sandboxed)
-- before the shipped one (M.shipped(read, home)). Returns it, or nil, a message and "config"
-- when a database does not load or check.
function M.for_plan(profile, tun, read, home)
  local shipped, why = M.shipped(read, home)
  if not shipped then return nil, why, "config" end
  local dbs = { shipped }
  if tun ~= nil then
    assert(type(tun) == "table", "tuning must be a table")
    assert(tun.force == nil or type(tun.force) == "table", "tuning force must be a table")
    if tun.user ~= nil then
      assert(type(tun.user) == "string", "tuning user must be the database's text")
      assert(tun.user_name == nil or type(tun.user_name) == "string",
             "tuning user_name must be a string")
      local user
      user, why = M.load_user(tun.user, tun.user_name or "tuning database")
      if not user then return nil, why, "config" end
      dbs = { user, shipped }
    end
  end
  return { dbs = dbs, target = M.target(profile), force = tun and tun.force }
end

-- The entries for a key line in the databases `dbs` (a list, first wins), in that order.
function M.entries(dbs, line)
  local out = {}
  for _, db in ipairs(dbs or {}) do
    local e = db.by_key[line]
    if e then out[#out + 1] = e end
  end
  return out
end

-- ---------------------------------------------------------------- writing

-- The header of every written database (and of the shipped tuning/db.lua).
M.HEADER = [[
-- rda tuning database: written by `rdagen tune` (gen/tuning.lua), read by every plan: the
-- user's ($RDA_TUNING_DB, else tuning.lua in the cache root) first, then the one shipped in
-- rda's tuning/db.lua. Entries come only from measurements by `rdagen tune` on their target
-- (a GPU for sm_<arch>, the CPU emulator for emu-sm_<arch>): never invented, never hand-edited.
-- A list of entries, one per key (target, kind, head_dim, dtype, causal, dilated, rows,
-- wgmma):
--   target      "sm_<arch>", or "emu-sm_<arch>" for the CPU emulator's plans
--   kind        "fwd", "bwd_dkdv" or "bwd_dq"
--   head_dim, dtype ("bf16" | "fp16"), causal, dilated (r > 1)
--   rows        the branch's grid rows ceil(w / r), rounded up to a power of two, at least 16
--   wgmma       whether the wgmma tiles were admitted (wgmma on, e.g. RDA_WGMMA=1, and an
--               sm_90 target; else false): a plan reads only the entry of its own wgmma state
--   candidates  { <gen/plan.lua tile name>, ... }: every tile the tuner tried, failed ones too
--   ranking     { { tile = <a candidate>, us = <median microseconds> }, ... }, fastest first
--   measured    { device, date ("YYYY-MM-DD"), rda (version), n, batch (the timed size) }
-- A plan skips an entry whose candidates miss a tile that fits and is allowed there now (the
-- space gained it after the tune); else it takes the first ranked tile that fits and is allowed.
]]

-- us exactly, as short as round-trips: integers as they are, floats by %.15g .. %.17g.
local function number_text(x)
  if math.type(x) == "integer" then return string.format("%d", x) end
  for digits = 15, 17 do
    local s = string.format("%." .. digits .. "g", x)
    if tonumber(s) == x then return s end
  end
  error("no exact text for " .. tostring(x))
end

local function quote(s)
  return string.format("%q", s)
end

-- The candidates line(s) of an entry: the quoted names, wrapped before column 100.
local function candidates_text(names)
  local lines, line, on_line = {}, "    candidates = {", 0
  for i, name in ipairs(names) do
    local item = " " .. quote(name) .. (i < #names and "," or " },")
    if on_line > 0 and #line + #item > 99 then
      lines[#lines + 1] = line
      line, on_line = "     ", 0
    end
    line, on_line = line .. item, on_line + 1
  end
  lines[#lines + 1] = line
  return table.concat(lines, "\n") .. "\n"
end

-- The text of a database holding `entries` (checked), sorted by key, deterministic.
function M.serialize(entries)
  local sorted = {}
  for i, e in ipairs(entries) do sorted[i] = e end
  table.sort(sorted, key_less)
  local out = { M.HEADER, "return {\n" }
  for _, e in ipairs(sorted) do
    out[#out + 1] = string.format("  { target = %s, kind = %s, head_dim = %d, dtype = %s, "
                                  .. "causal = %s,\n    dilated = %s, rows = %d, wgmma = %s,\n",
                                  quote(e.target), quote(e.kind), e.head_dim, quote(e.dtype),
                                  tostring(e.causal), tostring(e.dilated), e.rows,
                                  tostring(e.wgmma))
    out[#out + 1] = candidates_text(e.candidates)
    out[#out + 1] = "    ranking = {\n"
    for _, x in ipairs(e.ranking) do
      out[#out + 1] = string.format("      { tile = %s, us = %s },\n", quote(x.tile),
                                    number_text(x.us))
    end
    out[#out + 1] = "    },\n"
    if e.measured then
      local fields = {}
      for _, k in ipairs(MEASURED_ORDER) do
        local v = e.measured[k]
        if v ~= nil then
          fields[#fields + 1] = string.format("%s = %s", k, type(v) == "string" and quote(v)
                                                             or string.format("%d", v))
        end
      end
      out[#out + 1] = #fields == 0 and "    measured = {},\n"
                      or string.format("    measured = { %s },\n", table.concat(fields, ", "))
    end
    out[#out + 1] = "  },\n"
  end
  out[#out + 1] = "}\n"
  return table.concat(out)
end

-- The text of database `old` (checked) with new entries for `tasks` (plan.tune_tasks: each
-- with `fields`, its key table (wgmma included), and `candidates`) from `results` ({ { task =
-- <1-based>, ranking = { { tile, us }, ... } } }, any order) measured as `meta` ({ device,
-- date, rda, n, batch }): each new entry's candidates are its task's, all of them (a candidate
-- that failed is tried too, though not ranked); it replaces the entry of its key (the same
-- wgmma state: a tune without wgmma leaves the wgmma entry alone), the rest stay. Returns the
-- text, or nil and one line naming the bad result.
function M.merge(old, tasks, results, meta)
  assert(type(old) == "table" and type(tasks) == "table", "merge(old, tasks, results, meta)")
  if type(results) ~= "table" or not is_list(results) then
    return nil, "tuning results must be a list"
  end
  if meta ~= nil and type(meta) ~= "table" then return nil, "tuning meta must be a table" end
  local new, for_task = {}, {}
  for i, res in ipairs(results) do
    local at = string.format("result %d", i)
    if type(res) ~= "table" then return nil, at .. ": must be a table { task, ranking }" end
    local t = res.task
    if not (math.type(t) == "integer" and tasks[t]) then
      return nil, string.format("%s: task %s is not one of this config's %d tasks", at, show(t),
                                #tasks)
    end
    if for_task[t] then
      return nil, string.format("%s: task %d was already given by result %d", at, t, for_task[t])
    end
    for_task[t] = i
    local task, rk = tasks[t], res.ranking
    if type(rk) ~= "table" or not is_list(rk) or #rk == 0 then
      return nil, string.format("%s (%s): the ranking must be a non-empty list", at, task.key)
    end
    local allowed, ranking = {}, {}
    for _, c in ipairs(task.candidates) do allowed[c] = true end
    for j, x in ipairs(rk) do
      local where = string.format("%s (%s): ranking[%d]", at, task.key, j)
      if type(x) ~= "table" then return nil, where .. ": must be a table { tile, us }" end
      if not allowed[x.tile] then
        return nil, string.format("%s: tile %s is not a candidate of the task", where,
                                  show(x.tile))
      end
      if not finite_positive(x.us) then
        return nil, string.format("%s: us = %s is not a positive finite number", where,
                                  show(x.us))
      end
      ranking[j] = { tile = x.tile, us = x.us, at = j }
    end
    -- Fastest first; equal times keep the order given (table.sort is not stable).
    table.sort(ranking, function(a, b)
      if a.us ~= b.us then return a.us < b.us end
      return a.at < b.at
    end)
    for _, x in ipairs(ranking) do x.at = nil end
    local e = {}
    for k, v in pairs(task.fields) do e[k] = v end
    e.candidates = table.move(task.candidates, 1, #task.candidates, 1, {})
    e.ranking = ranking
    if meta then -- an empty string is an unknown field (C passes "" for NULL)
      e.measured = {}
      for _, k in ipairs(MEASURED_ORDER) do
        if meta[k] ~= "" then e.measured[k] = meta[k] end
      end
    end
    local why = check_entry(e) -- meta's fields, a tile ranked twice
    if why then return nil, string.format("%s (%s): %s", at, task.key, why) end
    new[M.key_line(e)] = e
  end
  local entries = {}
  for _, e in ipairs(old.entries) do
    if not new[M.key_line(e)] then entries[#entries + 1] = e end
  end
  for _, e in pairs(new) do entries[#entries + 1] = e end
  assert(M.check(entries, "the merged tuning database")) -- each entry passed; keys are unique
  return M.serialize(entries)
end

return M
