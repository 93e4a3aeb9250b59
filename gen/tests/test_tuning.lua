-- test_tuning.lua — the tuning databases (gen/tuning.lua) and their use by the planner and the
-- bridge: keys and rows buckets, the checker (one line per bad field), the sandbox of a user's
-- database, lookup (rank order, fit, wgmma, target, user before shipped, per branch, stale
-- entries), forced tiles, the tuner's task list, and the merge (round trip, replace by key,
-- wgmma and non-wgmma entries side by side, deterministic).

local testing = require "gen.testing"
local tuning = require "gen.tuning"
local plan = require "gen.plan"
local bridge = require "gen.bridge"
local hw = require "gen.hw"
local native = require "rda.native"

local seed = os.time() ~ math.floor(os.clock() * 1e9)
math.randomseed(seed)
local T = testing.suite("test_tuning (seed " .. seed .. ")")

-- ---------------------------------------------------------------- fixtures

-- A forward space of our own (the shipped one changes with the kernels): names as plan.lua
-- writes them; BIG never fits sm_90's 227 KiB, W is a wgmma tile.
local W = { block_m = 128, block_n = 128, warps = 8, stages = 2, wgmma = true }
local A = { block_m = 128, block_n = 64, warps = 8, stages = 2 }
local B = { block_m = 64, block_n = 64, warps = 4, stages = 2 }
local C = { block_m = 64, block_n = 32, warps = 4, stages = 2 }
local BIG = { block_m = 128, block_n = 128, warps = 8, stages = 4 }
local FWD = { [128] = { W, A, B, C, BIG } }
local NAME = { W = "bm128_bn128_w8_s2_wg", A = "bm128_bn64_w8_s2", B = "bm64_bn64_w4_s2",
               C = "bm64_bn32_w4_s2", BIG = "bm128_bn128_w8_s4" }

-- A backward space: K1 (the default dK/dV), K2, KX2 (dsplit 2), KW (wgmma); Q1 (the default
-- dQ), Q2.
local K1 = { block_n = 64, block_m = 32, warps = 4, stages = 2, dsplit = 1 }
local K2 = { block_n = 32, block_m = 32, warps = 2, stages = 2, dsplit = 1 }
local KX2 = { block_n = 64, block_m = 32, warps = 4, stages = 2, dsplit = 2 }
local KW = { block_n = 64, block_m = 64, warps = 4, stages = 2, dsplit = 1, wgmma = true }
local Q1 = { block_m = 64, block_n = 32, warps = 4, stages = 2 }
local Q2 = { block_m = 32, block_n = 32, warps = 2, stages = 2 }
local BWD = { [128] = { dkdv = { KW, K1, K2, KX2 }, dq = { Q1, Q2 } } }
local BNAME = { K1 = "bn64_bm32_w4_s2_x1", K2 = "bn32_bm32_w2_s2_x1", KX2 = "bn64_bm32_w4_s2_x2",
                KW = "bn64_bm64_w4_s2_x1_wg", Q1 = "bm64_bn32_w4_s2", Q2 = "bm32_bn32_w2_s2" }

local function config(over)
  local c = { heads = 4, kv_heads = 4, head_dim = 128, dtype = "bf16", segments = { 2048 },
              dilations = { 1 }, offsets = "mod", causal = true, scale = 1 / math.sqrt(128) }
  for k, v in pairs(over or {}) do c[k] = v end
  return c
end

local H90 = assert(hw.builtin(90))

-- Every tile of the fixture spaces per kind, in space order.
local ALL = { fwd = { NAME.W, NAME.A, NAME.B, NAME.C, NAME.BIG },
              bwd_dkdv = { BNAME.KW, BNAME.K1, BNAME.K2, BNAME.KX2 },
              bwd_dq = { BNAME.Q1, BNAME.Q2 } }

-- An entry for the key of branch 0 of config() on sm_90 without wgmma, ranking `tiles`
-- (names) with rising times; `over` changes fields. Unless `over` gives them, its candidates
-- are every fixture tile of its kind (the wgmma ones only in a wgmma entry), then any ranked
-- name not among them: a tune that tried everything the fixture spaces hold.
local function entry(tiles, over)
  local e = { target = "sm_90", kind = "fwd", head_dim = 128, dtype = "bf16", causal = true,
              dilated = false, rows = 2048, wgmma = false, ranking = {} }
  for i, t in ipairs(tiles) do e.ranking[i] = { tile = t, us = 100 * i + math.random() } end
  for k, v in pairs(over or {}) do e[k] = v end
  if e.candidates == nil then
    local cands, has = {}, {}
    for _, name in ipairs(ALL[e.kind] or {}) do
      if e.wgmma or name:sub(-3) ~= "_wg" then cands[#cands + 1], has[name] = name, true end
    end
    for _, t in ipairs(tiles) do
      if not has[t] then cands[#cands + 1], has[t] = t, true end
    end
    e.candidates = cands
  end
  return e
end

local function db(entries, name)
  return assert(tuning.check(entries, name or "test.lua"))
end

-- plan.build's tuning argument: databases (lists of entries, first wins) on `target`.
local function tun(dbs, target, force)
  local t = { dbs = {}, target = target or "sm_90", force = force }
  for i, entries in ipairs(dbs) do t.dbs[i] = db(entries, "db" .. i) end
  return t
end

local function fwd_variant(pl, i) return pl.variants[pl.steps[i or 1].kernel] end

local function deep_equal(a, b)
  if type(a) ~= "table" or type(b) ~= "table" then return a == b end
  for k, v in pairs(a) do
    if not deep_equal(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

local function shuffle(list)
  for i = #list, 2, -1 do
    local j = math.random(i)
    list[i], list[j] = list[j], list[i]
  end
  return list
end

T.test("the fixture spaces are well-formed and name their tiles as expected", function()
  assert(plan.check_space(FWD) and plan.check_bwd_space(BWD))
  for k, c in pairs { W = W, A = A, B = B, C = C, BIG = BIG } do
    assert(plan.tile_name("fwd", c) == NAME[k], k)
  end
  for k, c in pairs { K1 = K1, K2 = K2, KX2 = KX2, KW = KW } do
    assert(plan.tile_name("bwd_dkdv", c) == BNAME[k], k)
  end
  assert(plan.tile_name("bwd_dq", Q1) == BNAME.Q1 and plan.tile_name("bwd_dq", Q2) == BNAME.Q2)
  assert(not plan.fits(128, BIG, H90), "BIG must not fit sm_90")
end)

-- ---------------------------------------------------------------- keys

T.test("rows: ceil(w / r) rounded up to a power of two, at least 16", function()
  local cases = { { 1, 1, 16 }, { 16, 1, 16 }, { 17, 1, 32 }, { 2048, 1, 2048 },
                  { 2049, 1, 4096 }, { 4096, 2, 2048 }, { 4097, 2, 4096 }, { 33, 2, 32 },
                  { 32, 2, 16 }, { 1000000000, 1, 1 << 30 }, { 1000000000, 7, 1 << 28 },
                  { math.maxinteger, 1, 1 << 62 }, { math.maxinteger, 2, 1 << 62 },
                  { math.maxinteger, 3, 1 << 62 }, { 1 << 62, 2, 1 << 61 },
                  { (1 << 62) + 1, 2, 1 << 62 } }
  for _, c in ipairs(cases) do
    local got = tuning.rows(c[1], c[2])
    assert(got == c[3], string.format("rows(%d, %d) = %d, want %d", c[1], c[2], got, c[3]))
  end
  -- Against the definition, on random shapes up to 2^40.
  for _ = 1, 2000 do
    local w, r = math.random(1, 1 << 40), math.random(1, 1 << math.random(0, 20))
    local g = (w + r - 1) // r
    local p = tuning.rows(w, r)
    assert(math.type(p) == "integer" and p & (p - 1) == 0 and p >= 16 and p >= g
           and (p == 16 or p // 2 < g), string.format("rows(%d, %d) = %d", w, r, p))
  end
  testing.contains(testing.raises(tuning.rows, 0, 1), "positive integers")
  testing.contains(testing.raises(tuning.rows, 16.0, 1), "positive integers")
end)

T.test("target: sm_XX, emu-sm_XX for the emulator's profile", function()
  assert(tuning.target(H90) == "sm_90", "nil emulated is a GPU")
  local p = assert(hw.builtin(80))
  p.emulated = false
  assert(tuning.target(p) == "sm_80")
  p.emulated = true
  assert(tuning.target(p) == "emu-sm_80")
  p.emulated = 1
  testing.contains(testing.raises(tuning.target, p), "emulated must be a boolean")
end)

T.test("key lines name every field of the key, the wgmma state last", function()
  assert(tuning.key_line(tuning.key("sm_90", "fwd", 128, "bf16", true, false, 2048, false))
         == "sm_90 fwd d128 bf16 causal dense rows2048 mma")
  assert(tuning.key_line(tuning.key("sm_90", "fwd", 128, "bf16", true, false, 2048, true))
         == "sm_90 fwd d128 bf16 causal dense rows2048 wgmma")
  assert(tuning.key_line(tuning.key("emu-sm_90", "bwd_dq", 64, "fp16", false, true, 16, false))
         == "emu-sm_90 bwd_dq d64 fp16 noncausal dilated rows16 mma")
  local c = config { segments = { 2048, 8193 }, dilations = { 1, 4 } }
  local k = plan.tuning_key(c, 1, "bwd_dkdv", "sm_80")
  assert(tuning.key_line(k) == "sm_80 bwd_dkdv d128 bf16 causal dilated rows4096 mma",
         tuning.key_line(k))
  assert(k.wgmma == false, "no wgmma state given: false")
  k = plan.tuning_key(c, 0, "fwd", "sm_90", true)
  assert(k.wgmma == true and tuning.key_line(k):sub(-6) == " wgmma", tuning.key_line(k))
  -- The longest key the checker admits fits rda_tune_task.key (160 bytes with its NUL).
  local long = tuning.key_line(tuning.key("emu-sm_999", "bwd_dkdv", math.maxinteger, "bf16",
                                          false, true, 1 << 62, true))
  assert(#long < 160, long)
  -- Admitted: wgmma on and sm_90 (GPU or emulator), a boolean always.
  local h80, emu = assert(hw.builtin(80)), assert(hw.builtin(90))
  emu.emulated = true
  assert(tuning.wgmma_admitted(H90, true) == true and tuning.wgmma_admitted(emu, true) == true)
  for _, x in ipairs { { H90, false }, { H90, nil }, { h80, true }, { h80, nil } } do
    assert(tuning.wgmma_admitted(x[1], x[2]) == false, tostring(x[2]))
  end
end)

-- ---------------------------------------------------------------- checking

T.test("check: a good database passes, and indexes its entries by key", function()
  local list = { entry { NAME.A, NAME.B },
                 entry({ BNAME.K1 }, { kind = "bwd_dkdv", measured = {
                   device = "NVIDIA H100 80GB HBM3", date = "2026-11-23", rda = "0.1.0",
                   n = 32768, batch = 1 } }),
                 entry({ NAME.C }, { target = "emu-sm_90", rows = 1 << 62, measured = {} }) }
  list[4] = entry({ NAME.W, NAME.A }, { wgmma = true })
  list[5] = entry({ NAME.W }, { target = "emu-sm_90", wgmma = true })
  list[6] = entry({ NAME.C }, { candidates = { "bm16_bn16_w1_s2", NAME.C } }) -- not in a space
  list[6].rows = 16
  local d = db(list)
  assert(d.entries == list and d.by_key["sm_90 fwd d128 bf16 causal dense rows2048 mma"] == list[1])
  assert(d.by_key["sm_90 bwd_dkdv d128 bf16 causal dense rows2048 mma"] == list[2])
  assert(d.by_key["sm_90 fwd d128 bf16 causal dense rows2048 wgmma"] == list[4])
  local e = assert(tuning.check({}, "empty.lua"))
  assert(#e.entries == 0 and next(e.by_key) == nil)
end)

T.test("check: each malformed field is one line naming the entry, field and value", function()
  local rk = function(...) return { ... } end
  local cases = {
    { { target = "sm90" }, "target = \"sm90\"" },
    { { target = 90 }, "target = 90" },
    { { target = "emu_sm_90" }, "target" },
    { { kind = "bwd" }, "kind = \"bwd\"" },
    { { head_dim = 0 }, "head_dim = 0" },
    { { head_dim = 128.0 }, "head_dim = 128.0" },
    { { dtype = "fp32" }, "dtype = \"fp32\"" },
    { { causal = "yes" }, "causal = \"yes\"" },
    { { dilated = 1 }, "dilated = 1" },
    { { rows = 100 }, "rows = 100: must be a power of two" },
    { { rows = 8 }, "rows = 8" },
    { { rows = 2048.0 }, "rows = 2048.0" },
    { { ranking = {} }, "ranking: must not be empty" },
    { { ranking = "A" }, "ranking = \"A\"" },
    { { ranking = { [2] = { tile = NAME.A, us = 1 } } }, "ranking: must be a list" },
    { { ranking = rk({ tile = "bm128_bn64", us = 1 }) }, "ranking[1].tile = \"bm128_bn64\"" },
    { { ranking = rk({ tile = NAME.A .. "_xx", us = 1 }) }, "ranking[1].tile" },
    { { ranking = rk({ tile = "bm0128_bn64_w8_s2", us = 1 }) }, "ranking[1].tile" },
    { { ranking = rk({ tile = BNAME.K1, us = 1 }) }, "is not a fwd tile name" },
    { { kind = "bwd_dkdv", ranking = rk({ tile = NAME.A, us = 1 }) }, "not a dK/dV tile name" },
    { { ranking = rk({ tile = string.rep("1", 60), us = 1 }) }, "longer than 47" },
    { { ranking = rk({ tile = 5, us = 1 }) }, "ranking[1].tile = 5" },
    { { ranking = rk({ tile = NAME.A, us = 0 }) }, "ranking[1].us = 0" },
    { { ranking = rk({ tile = NAME.A, us = -1.5 }) }, "ranking[1].us = -1.5" },
    { { ranking = rk({ tile = NAME.A, us = 0 / 0 }) }, "ranking[1].us = nan:" },
    { { ranking = rk({ tile = NAME.A, us = math.huge }) }, "ranking[1].us = inf" },
    { { ranking = rk({ tile = NAME.A, us = "1" }) }, "ranking[1].us = \"1\"" },
    { { ranking = rk({ tile = NAME.A }) }, "ranking[1].us = nil" },
    { { ranking = rk({ tile = NAME.A, us = 2 }, { tile = NAME.B, us = 1 }) },
      "ranking[2].us = 1: is below ranking[1].us = 2" },
    { { ranking = rk({ tile = NAME.A, us = 1 }, { tile = NAME.A, us = 1 }) },
      "ranking[2].tile = \"bm128_bn64_w8_s2\": repeats ranking[1]" },
    { { ranking = rk({ tile = NAME.A, us = 1, time = 3 }) }, "ranking[1]: unknown key \"time\"" },
    { { ranking = rk("A") }, "ranking[1] = \"A\"" },
    { { raking = {} }, "unknown key \"raking\"" },
    { { [1] = true }, "unknown key 1" },
    { { measured = "today" }, "measured = \"today\"" },
    { { measured = { devcie = "x" } }, "measured: unknown key \"devcie\"" },
    { { measured = { date = "2026-13-01" } }, "measured.date = \"2026-13-01\"" },
    { { measured = { date = "23.11.2026" } }, "measured.date" },
    { { measured = { date = "2026-02-29" } }, "measured.date = \"2026-02-29\"" }, -- not a leap year
    { { measured = { date = "2026-04-31" } }, "measured.date = \"2026-04-31\"" },
    { { measured = { n = 0 } }, "measured.n = 0" },
    { { measured = { batch = 1.5 } }, "measured.batch = 1.5" },
    { { measured = { device = 5 } }, "measured.device = 5" },
    { { measured = { rda = "0.1\n2" } }, "measured.rda = \"0.1\\n2\"" },
    { { measured = { device = string.rep("x", 201) } }, "measured.device" },
    { { wgmma = 1 }, "wgmma = 1: must be a boolean" },
    { { wgmma = "false" }, "wgmma = \"false\": must be a boolean" },
    { { wgmma = true, target = "sm_80" }, "wgmma = true: wgmma tiles are admitted only on sm_90, "
      .. "not sm_80" },
    { { wgmma = true, target = "emu-sm_86" }, "only on sm_90, not emu-sm_86" },
    { { candidates = {} }, "candidates: must not be empty" },
    { { candidates = NAME.A }, "candidates = \"bm128_bn64_w8_s2\": must be the list" },
    { { candidates = { [2] = NAME.A } }, "candidates: must be a list (keys 1..n only)" },
    { { candidates = { NAME.A, x = NAME.B } }, "candidates: must be a list" },
    { { candidates = { NAME.A, NAME.B, NAME.A } },
      "candidates[3] = \"bm128_bn64_w8_s2\": repeats candidates[1]" },
    { { candidates = { NAME.A, "bm128_bn64" } }, "candidates[2] = \"bm128_bn64\": is not a fwd" },
    { { candidates = { NAME.A, 7 } }, "candidates[2] = 7: must be a tile name" },
    { { candidates = { NAME.A, BNAME.K1 } }, "candidates[2] = \"bn64_bm32_w4_s2_x1\"" },
    { { candidates = { NAME.A, NAME.W } },
      "candidates[2] = \"bm128_bn128_w8_s2_wg\": is a wgmma tile, in an entry without wgmma" },
    { { candidates = { NAME.A, "bm128_bn128_w8_s3_wgo" } },
      "candidates[2] = \"bm128_bn128_w8_s3_wgo\": is a wgmma tile, in an entry without wgmma" },
    { { kind = "bwd_dkdv", candidates = { BNAME.K1, "bn64_bm64_w4_s3_x1_wgo" } },
      "candidates[2] = \"bn64_bm64_w4_s3_x1_wgo\": is not a dK/dV tile name" },
    { { candidates = { NAME.A, "bm128_bn128_w8_s3_wgx" } }, "is not a fwd tile name" },
    { { candidates = { NAME.B, NAME.C } },
      "ranking[1].tile = \"bm128_bn64_w8_s2\": is not one of the entry's candidates" },
    { { wgmma = "nil" }, "wgmma = nil: must be a boolean (whether wgmma tiles were admitted); "
      .. "an entry of an older rda: remove the database and tune again" },
    { { candidates = "nil" }, "candidates = nil: must be the list of tile names the tuner tried" },
  }
  for _, c in ipairs(cases) do
    local bad = entry { NAME.A }
    for k, v in pairs(c[1]) do bad[k] = v end
    for k, v in pairs(c[1]) do
      if v == "nil" then bad[k] = nil end -- a missing field
    end
    local d, why = tuning.check({ entry({ NAME.A }, { rows = 16 }), bad }, "bad.lua")
    assert(d == nil, "accepted: " .. c[2])
    testing.contains(why, "bad.lua: entry 2: ")
    testing.contains(why, c[2])
    assert(not why:find("\n"), "one line: " .. why)
  end
end)

T.test("check: an overlapped wgmma tile (\"_wgo\", forward or dQ) ranks in a wgmma entry", function()
  local e = entry({ "bm128_bn128_w8_s3_wgo", NAME.W }, { wgmma = true })
  assert(tuning.check({ e }, "wgo.lua"), "a _wgo tile in a wgmma entry")
  assert(tuning.tile_name_ok("fwd", "bm64_bn128_w4_s3_wgo"))
  assert(tuning.tile_name_ok("bwd_dq", "bm128_bn64_w8_s3_wgo"))
  assert(not tuning.tile_name_ok("bwd_dkdv", "bn64_bm64_w4_s3_x1_wgo"), "no dK/dV overlap tiles")
end)

T.test("check: a repeated key names both entries; the list itself is checked", function()
  local list = { entry { NAME.A }, entry({ NAME.A }, { rows = 4096 }), entry { NAME.B } }
  local d, why = tuning.check(list, "dup.lua")
  assert(not d)
  testing.contains(why, "dup.lua: entry 3: the same key as entry 1 "
                        .. "(sm_90 fwd d128 bf16 causal dense rows2048 mma)")
  -- The same fields but another target, kind, dilation or wgmma state is another key.
  assert(tuning.check({ entry { NAME.A }, entry({ NAME.A }, { target = "emu-sm_90" }),
                        entry({ NAME.A }, { kind = "bwd_dq" }),
                        entry({ NAME.A }, { dilated = true }),
                        entry({ NAME.A }, { wgmma = true }) }, "ok.lua"))
  _, why = tuning.check({ entry({ NAME.W }, { wgmma = true }), entry { NAME.A },
                          entry({ NAME.A }, { wgmma = true }) }, "dup.lua")
  testing.contains(why, "dup.lua: entry 3: the same key as entry 1 "
                        .. "(sm_90 fwd d128 bf16 causal dense rows2048 wgmma)")
  _, why = tuning.check(nil, "x.lua")
  testing.contains(why, "x.lua: the tuning database must return a list of entries, not nothing")
  _, why = tuning.check({ entry { NAME.A }, x = 1 }, "x.lua")
  testing.contains(why, "keys 1..n only")
  _, why = tuning.check({ 5 }, "x.lua")
  testing.contains(why, "x.lua: entry 1: must be a table, not 5")
end)

-- ---------------------------------------------------------------- the sandbox

T.test("sandbox: a user database that loops, allocates or reaches out fails cleanly", function()
  local cases = {
    { "while true do end", "u.lua:1: the tuning database exceeds the instruction limit" },
    { "local s = 'x' for i = 1, 40 do s = s .. s end return {}",
      "u.lua:1: the tuning database exceeds the memory limit" },
    { "local t = {} for i = 1, 1e7 do t[i] = { i, i, i, i } end return t", "limit" },
    { "os.exit(1)", "global 'os'" },
    { "return { io.open('/etc/passwd') }", "global 'io'" },
    { "return require('os')", "global 'require'" },
    { "return { ('x'):rep(10) }", "rep" },
    { "return {", "u.lua:1:" },
    { "local x = {} .. 1", "u.lua:1: attempt to concatenate" },
    { "", "u.lua: the tuning database must return a list of entries, not nothing" },
    { "\27Lua\x54\0 not really", "binary" },
  }
  for _, c in ipairs(cases) do
    local d, why = tuning.load_user(c[1], "u.lua")
    assert(d == nil, "accepted: " .. c[2])
    testing.contains(why, c[2])
    assert(why:sub(1, 5) == "u.lua", why)
    assert(not why:find("\n"), "one line: " .. why)
  end
  -- Comparing two 1 MiB strings is one instruction: the clock bounds a loop of them.
  local slow = "local a = '" .. string.rep("x", 1 << 20) .. "'\nlocal b, c = a .. 'y', a .. 'y'\n"
         .. "local n = 0 for i = 1, 1000000 do if b == c then n = n + 1 end end return {}"
  local t0 = os.clock()
  local _, why = tuning.load_user(slow, "u.lua", 0.2)
  testing.contains(why, "u.lua:3: the tuning database exceeds the time limit (0.2 s)")
  assert(os.clock() - t0 < 5, "the limit took too long to trip")
  -- The checks run under the same clock: 2,000 entries that share one list of 20,000 tiles
  -- are little memory for the chunk, and a minute of checks without it.
  local shared = "local c = {} for i = 1, 20000 do c[i] = 'bm' .. i .. '_bn64_w4_s2' end\n"
                 .. "local l = {} for h = 1, 2000 do l[h] = { target = 'sm_90', kind = 'fwd', "
                 .. "head_dim = 1000 + h, dtype = 'bf16', causal = true, dilated = false, "
                 .. "rows = 16, wgmma = false, candidates = c, ranking = { { tile = c[1], "
                 .. "us = 1.0 } } } end\nreturn l"
  t0 = os.clock()
  _, why = tuning.load_user(shared, "u.lua", 0.2)
  assert(why == "u.lua: the tuning database exceeds the time limit (0.2 s)", why)
  assert(os.clock() - t0 < 5, "the limit took too long to trip")
  -- One unknown key among 200,000 is named without sorting them all (that took seconds).
  t0 = os.clock()
  _, why = tuning.load_user("local e = {} for i = 1, 200000 do e[i + 0.5] = true end\n"
                            .. "return { e }", "u.lua", 2)
  testing.contains(why, "u.lua: entry 1: unknown key 1.5 (known: target")
  assert(os.clock() - t0 < 2, "the unknown key took too long to find")
  -- A name longer than Lua's chunk names (about 60 characters) is given in full.
  local long = string.rep("/folder_with_a_long_name", 4) .. "/u.lua"
  _, why = tuning.load_user("return {", long)
  assert(why:sub(1, #long + 3) == long .. ":1:", why)
  -- The state is clean afterwards: a good database still loads, with all its entries.
  local text = tuning.serialize { entry { NAME.B, NAME.A } }
  local d = assert(tuning.load_user(text, "u.lua"))
  assert(#d.entries == 1 and d.entries[1].ranking[1].tile == NAME.B)
  assert(string.rep("ab", 2) == "abab", "the generator's string library is back")
end)

-- ---------------------------------------------------------------- lookup

T.test("lookup: the first ranked tile, tuned, with the name and source of that tile", function()
  local c = config()
  local base = assert(plan.build(c, H90, FWD))
  local v0 = fwd_variant(base)
  assert(v0.tile == NAME.A and v0.tuned == nil, "default: the first fitting tile, not tuned")
  local pl = assert(plan.build(c, H90, FWD, nil, nil, nil, tun { { entry { NAME.B, NAME.A } } }))
  local v = fwd_variant(pl)
  assert(v.tile == NAME.B and v.tuned == true, v.tile)
  -- The same variant as a plan whose space lists B first: tuned changes nothing else.
  local ref = fwd_variant(assert(plan.build(c, H90, { [128] = { B, A } })))
  assert(ref.tuned == nil and ref.tile == NAME.B)
  assert(v.name == ref.name and v.source == ref.source and v.smem_bytes == ref.smem_bytes
         and v.threads == ref.threads and v.block_m == ref.block_m and v.block_n == ref.block_n)
  assert(v.name ~= v0.name, "another tile, another variant")
  -- Random rankings of the fitting tiles: the plan takes the first.
  for _ = 1, 20 do
    local order = shuffle { NAME.A, NAME.B, NAME.C }
    v = fwd_variant(assert(plan.build(c, H90, FWD, nil, nil, nil, tun { { entry(order) } })))
    assert(v.tile == order[1] and v.tuned, table.concat(order, " ") .. " -> " .. v.tile)
  end
end)

T.test("lookup: ranked tiles that do not fit or are not allowed are skipped", function()
  local c = config()
  local function tile_of(entries, p, wgmma, target)
    local v = fwd_variant(assert(plan.build(c, p or H90, FWD, nil, nil, wgmma,
                                            tun({ entries }, target))))
    return v.tile, v.tuned
  end
  assert(tile_of { entry { NAME.BIG, NAME.C, NAME.B } } == NAME.C, "BIG does not fit sm_90")
  assert(tile_of({ entry({ NAME.W, NAME.C }, { wgmma = true }) }, H90, true) == NAME.W,
         "wgmma on, sm_90")
  -- A smaller sm_90 part (a custom profile): W no longer fits, the wgmma entry's next tile.
  local small = assert(hw.builtin(90))
  small.smem_per_block = plan.fwd_smem(128, W) - 1
  assert(tile_of({ entry({ NAME.W, NAME.C }, { wgmma = true }) }, small, true) == NAME.C)
  -- wgmma on but sm_80: wgmma is not admitted there, so the plan reads the entry without it.
  local h80 = assert(hw.builtin(80))
  assert(tile_of({ entry({ NAME.C }, { target = "sm_80" }) }, h80, true, "sm_80") == NAME.C,
         "wgmma on, but sm_80")
  -- No usable tile at all (or names no longer in the space): the default rule, not tuned.
  local t, tuned = tile_of { entry { NAME.BIG, "bm16_bn16_w1_s2" } }
  assert(t == NAME.A and tuned == nil, t)
  t, tuned = tile_of({ entry({ NAME.W, NAME.BIG }, { wgmma = true }) }, small, true)
  assert(t == NAME.A and tuned == nil, t)
  -- A space without the head_dim is still the planner's error.
  local pl, why = plan.build(config { head_dim = 64 }, H90, FWD, nil, nil, nil,
                             tun { { entry({ NAME.A }, { head_dim = 64 }) } })
  assert(not pl)
  testing.contains(why, "no candidates for head_dim = 64")
end)

T.test("lookup: an entry steers only its own key", function()
  local c = config()
  local function tile_of(entries, target)
    return fwd_variant(assert(plan.build(c, H90, FWD, nil, nil, nil, tun({ entries }, target))))
               .tile
  end
  assert(tile_of { entry({ NAME.B }, { target = "emu-sm_90" }) } == NAME.A, "emu for a GPU")
  assert(tile_of({ entry({ NAME.B }, { target = "emu-sm_90" }) }, "emu-sm_90") == NAME.B)
  assert(tile_of({ entry { NAME.C } }, "emu-sm_90") == NAME.A, "a GPU's for the emulator")
  for _, over in ipairs { { rows = 4096 }, { rows = 1024 }, { dtype = "fp16" }, { causal = false },
                          { dilated = true }, { head_dim = 64 }, { kind = "bwd_dq" },
                          { target = "sm_80" }, { wgmma = true } } do
    assert(tile_of { entry({ NAME.B }, over) } == NAME.A, next(over))
  end
  -- A small grid (64 rows) prefers block_m <= 64 by default; an entry overrides that.
  local small = config { segments = { 64 } }
  local v = fwd_variant(assert(plan.build(small, H90, FWD)))
  assert(v.tile == NAME.B, v.tile)
  v = fwd_variant(assert(plan.build(small, H90, FWD, nil, nil, nil,
                                    tun { { entry({ NAME.A }, { rows = 64 }) } })))
  assert(v.tile == NAME.A and v.tuned, v.tile)
end)

T.test("lookup: the user's entry beats the shipped one, which serves where it cannot", function()
  local c = config()
  local function tile_of(dbs)
    return fwd_variant(assert(plan.build(c, H90, FWD, nil, nil, nil, tun(dbs)))).tile
  end
  local user, shipped = { entry { NAME.B } }, { entry { NAME.C } }
  assert(tile_of { user, shipped } == NAME.B, "user first")
  assert(tile_of { shipped } == NAME.C, "shipped alone")
  assert(tile_of { { entry { NAME.BIG } }, shipped } == NAME.C, "user's entry has nothing usable")
  assert(tile_of { { entry({ NAME.B }, { rows = 16 }) }, shipped } == NAME.C, "user's other key")
end)

T.test("lookup: each forward branch takes its own key's tile", function()
  -- rows 2048 dense, rows 2048 dilated (ring twin: mod offsets, 4 heads), rows 256 dense.
  local c = config { segments = { 2048, 8192, 256 }, dilations = { 1, 4, 1 } }
  local t = tun { { entry { NAME.B }, entry({ NAME.C }, { dilated = true }) } }
  local pl = assert(plan.build(c, H90, FWD, nil, nil, nil, t))
  local v1, v2, v3 = fwd_variant(pl, 1), fwd_variant(pl, 2), fwd_variant(pl, 3)
  assert(v1.tile == NAME.B and v1.tuned and not v1.dilated, v1.name)
  assert(v2.tile == NAME.C and v2.tuned and v2.dilated, v2.name)
  assert(v3.tile == NAME.A and v3.tuned == nil, v3.name)
  local kt = pl.variants[pl.steps[2].ring_kernel]
  assert(kt.kv_table and kt.tile == NAME.C and kt.tuned and kt.name == v2.name .. "_kt", kt.name)
  -- A shared variant counts as tuned when any branch took it from tuning.
  c = config { segments = { 256, 2048 }, dilations = { 1, 1 } }
  pl = assert(plan.build(c, H90, FWD, nil, nil, nil, tun { { entry { NAME.A } } }))
  assert(pl.steps[1].kernel == pl.steps[2].kernel and fwd_variant(pl).tuned == true)
end)

T.test("lookup: each backward branch takes its own dK/dV and dQ tiles, and its dsplit", function()
  local c = config { segments = { 2048, 256 }, dilations = { 1, 1 } }
  local entries = {
    entry({ BNAME.KX2, BNAME.K1 }, { kind = "bwd_dkdv" }),
    entry({ BNAME.K2 }, { kind = "bwd_dkdv", rows = 256 }),
    entry({ BNAME.Q2 }, { kind = "bwd_dq" }),
  }
  local pl = assert(plan.build(c, H90, FWD, BWD, true, nil, tun { entries }))
  local s1, s2 = pl.bwd_steps[1], pl.bwd_steps[2]
  local dk1, dk2 = pl.variants[s1.dkdv_kernel], pl.variants[s2.dkdv_kernel]
  local dq1, dq2 = pl.variants[s1.dq_kernel], pl.variants[s2.dq_kernel]
  assert(dk1.tile == BNAME.KX2 and dk1.tuned and dk1.dsplit == 2 and s1.dsplit == 2, dk1.name)
  assert(dk2.tile == BNAME.K2 and dk2.tuned and dk2.dsplit == 1 and s2.dsplit == 1, dk2.name)
  assert(dq1.tile == BNAME.Q2 and dq1.tuned, dq1.name)
  assert(dq2.tile == BNAME.Q1 and dq2.tuned == nil, "no entry for rows 256: the default")
  -- Each kernel is the one a single-branch plan whose space lists that tile first makes.
  local function alone(w, dk, dq)
    local p = assert(plan.build(config { segments = { w } }, H90, FWD,
                                { [128] = { dkdv = { dk }, dq = { dq } } }, true))
    return p.variants[p.bwd_steps[1].dkdv_kernel], p.variants[p.bwd_steps[1].dq_kernel]
  end
  for _, x in ipairs { { dk1, dq1, alone(2048, KX2, Q2) }, { dk2, dq2, alone(256, K2, Q1) } } do
    local rdk, rdq = select(3, table.unpack(x))
    for i, ref in ipairs { rdk, rdq } do
      local v = x[i]
      assert(v.name == ref.name and v.source == ref.source and v.smem_bytes == ref.smem_bytes
             and v.threads == ref.threads, v.name .. " vs " .. ref.name)
    end
  end
  -- The atomic dK/dV is not tuned: the space's first mma.sync tile that fits, per step where
  -- its dsplit is 1.
  for _, s in ipairs { s1, s2 } do
    local a = pl.variants[s.dkdv_atomic_kernel]
    assert(a and a.dq_atomic and a.tile == BNAME.K1 and a.tuned == nil, a and a.name)
  end
  -- Without the entries: the first fitting tile for both branches, as before.
  local plain = assert(plan.build(c, H90, FWD, BWD, true))
  for _, s in ipairs(plain.bwd_steps) do
    assert(plain.variants[s.dkdv_kernel].tile == BNAME.K1 and s.dsplit == 1)
    assert(plain.variants[s.dq_kernel].tile == BNAME.Q1)
  end
  -- A wgmma dK/dV entry steers only plans with wgmma on; one without, only plans without.
  local function dkdv_of(entries, wgmma)
    local p = assert(plan.build(config(), H90, FWD, BWD, false, wgmma, tun { entries }))
    local v = p.variants[p.bwd_steps[1].dkdv_kernel]
    return v.tile, v.tuned
  end
  local wk = entry({ BNAME.K2, BNAME.KW }, { kind = "bwd_dkdv", wgmma = true })
  local mk = entry({ BNAME.KX2 }, { kind = "bwd_dkdv" })
  local t, tuned = dkdv_of({ wk }, false)
  assert(t == BNAME.K1 and tuned == nil, "the wgmma entry, for a plan without: " .. t)
  assert(dkdv_of({ wk }, true) == BNAME.K2)
  t, tuned = dkdv_of({ mk }, true)
  assert(t == BNAME.KW and tuned == nil, "the entry without wgmma, for a plan with: " .. t)
  assert(dkdv_of({ mk, wk }, false) == BNAME.KX2 and dkdv_of({ mk, wk }, true) == BNAME.K2)
end)

T.test("lookup: the backward's ring twins carry their base's tile", function()
  local c = config { segments = { 2048, 8192 }, dilations = { 1, 4 } }
  local pl = assert(plan.build(c, H90, FWD, BWD, false, nil,
                               tun { { entry({ BNAME.K2 },
                                             { kind = "bwd_dkdv", dilated = true }) } }))
  local s = pl.bwd_steps[2]
  local base, kt = pl.variants[s.dkdv_kernel], pl.variants[s.dkdv_ring_kernel]
  assert(base.tile == BNAME.K2 and kt.tile == BNAME.K2 and kt.tuned and kt.kv_table)
  local q = pl.variants[s.dq_ring_kernel]
  assert(q.tile == BNAME.Q1 and q.tuned == nil)
  assert(pl.variants[pl.bwd_steps[1].dkdv_kernel].tile == BNAME.K1, "dense branch: default")
end)

-- ---------------------------------------------------------------- force

T.test("force: the forced tile serves its kind and branch, over the databases", function()
  local c = config { segments = { 2048, 4096 }, dilations = { 1, 1 } }
  local t = tun({ { entry { NAME.B } } }, "sm_90", { kind = "fwd", branch = 0, tile = NAME.C })
  local pl = assert(plan.build(c, H90, FWD, nil, nil, nil, t))
  assert(fwd_variant(pl, 1).tile == NAME.C and fwd_variant(pl, 1).tuned)
  assert(fwd_variant(pl, 2).tile == NAME.A and fwd_variant(pl, 2).tuned == nil, "branch 1 free")
  t.force = { kind = "fwd", branch = 1, tile = NAME.C }
  pl = assert(plan.build(c, H90, FWD, nil, nil, nil, t))
  assert(fwd_variant(pl, 1).tile == NAME.B, "branch 0: its entry")
  assert(fwd_variant(pl, 2).tile == NAME.C)
  t = tun({}, "sm_90", { kind = "bwd_dkdv", branch = 1, tile = BNAME.KX2 })
  pl = assert(plan.build(c, H90, FWD, BWD, true, nil, t))
  assert(pl.bwd_steps[1].dsplit == 1 and pl.bwd_steps[2].dsplit == 2)
  local v = pl.variants[pl.bwd_steps[2].dkdv_kernel]
  assert(v.tile == BNAME.KX2 and v.tuned and v.dsplit == 2)
  -- The atomic variant keeps its own (untuned, dsplit 1) tile whatever the step's tile is.
  local a = pl.variants[pl.bwd_steps[2].dkdv_atomic_kernel]
  assert(a.tile == BNAME.K1 and a.dsplit == 1 and a.tuned == nil, a.name)
  t = tun({}, "sm_90", { kind = "fwd", branch = 0, tile = NAME.W })
  pl = assert(plan.build(config(), H90, FWD, nil, nil, true, t))
  assert(fwd_variant(pl).tile == NAME.W and fwd_variant(pl).wgmma)
end)

T.test("force: a tile that is not a candidate is one clear line", function()
  local c = config()
  local cases = {
    { { kind = "fwd", branch = 0, tile = NAME.BIG },
      "bm128_bn128_w8_s4 is not a candidate for fwd branch 0 here: ", "shared memory" },
    { { kind = "fwd", branch = 0, tile = NAME.W }, "for fwd branch 0 here: a wgmma tile" },
    { { kind = "fwd", branch = 0, tile = "bm16_bn16_w1_s2" },
      "no such tile for head_dim = 128" },
    { { kind = "bwd_dq", branch = 0, tile = NAME.A }, "bm128_bn64_w8_s2 is not a candidate "
      .. "for bwd_dq branch 0 here: the tile space has no such tile" },
    { { kind = "bwd_dkdv", branch = 0, tile = BNAME.KW }, "a wgmma tile" },
    { { kind = "fwd", branch = 1, tile = NAME.A },
      "forced branch 1: the config has branches 0 to 0" },
    { { kind = "bwd", branch = 0, tile = NAME.A }, "forced kind bwd" },
    { { kind = "fwd", branch = 0 }, "forced tile must be a tile name" },
  }
  for _, x in ipairs(cases) do
    local pl, why = plan.build(c, H90, FWD, BWD, false, false, tun({}, "sm_90", x[1]))
    assert(pl == nil, "accepted " .. x[2])
    for i = 2, #x do testing.contains(why, x[i]) end
    assert(not why:find("\n"))
  end
  local pl, why = plan.build(c, H90, FWD, nil, nil, nil,
                             tun({}, "sm_90", { kind = "bwd_dq", branch = 0, tile = BNAME.Q1 }))
  assert(not pl)
  testing.contains(why, "forced kind bwd_dq: this plan has no backward")
  local p = assert(hw.builtin(90))
  p.max_threads_per_sm = 64
  local two_warps = { [128] = { { block_m = 32, block_n = 32, warps = 2, stages = 2 } } }
  pl, why = plan.build(c, p, two_warps, BWD, false, false,
                       tun({}, "sm_90", { kind = "bwd_dq", branch = 0, tile = BNAME.Q1 }))
  assert(not pl)
  testing.contains(why, "bm64_bn32_w4_s2 is not a candidate for bwd_dq branch 0 here: it needs "
                        .. "128 threads")
end)

-- ---------------------------------------------------------------- tasks

T.test("tune_tasks: one task per distinct key, in kind then branch order", function()
  -- Branches 0 and 1 share a key (dense, rows 2048), 2 is dilated rows 2048, 3 dense rows 64.
  local c = config { segments = { 2048, 1500, 4096, 64 }, dilations = { 1, 1, 2, 1 } }
  local t = tun { { entry { NAME.C }, entry({ BNAME.K2 }, { kind = "bwd_dkdv", rows = 64 }) } }
  t.force = { kind = "fwd", branch = 0, tile = NAME.B } -- ignored by the tasks
  local tasks = assert(plan.tune_tasks(c, H90, FWD, BWD, false, t))
  local want = {
    { "fwd", 0, "sm_90 fwd d128 bf16 causal dense rows2048 mma", NAME.C },
    { "fwd", 2, "sm_90 fwd d128 bf16 causal dilated rows2048 mma", NAME.A },
    { "fwd", 3, "sm_90 fwd d128 bf16 causal dense rows64 mma", NAME.B },
    { "bwd_dkdv", 0, "sm_90 bwd_dkdv d128 bf16 causal dense rows2048 mma", BNAME.K1 },
    { "bwd_dkdv", 2, "sm_90 bwd_dkdv d128 bf16 causal dilated rows2048 mma", BNAME.K1 },
    { "bwd_dkdv", 3, "sm_90 bwd_dkdv d128 bf16 causal dense rows64 mma", BNAME.K2 },
    { "bwd_dq", 0, "sm_90 bwd_dq d128 bf16 causal dense rows2048 mma", BNAME.Q1 },
    { "bwd_dq", 2, "sm_90 bwd_dq d128 bf16 causal dilated rows2048 mma", BNAME.Q1 },
    { "bwd_dq", 3, "sm_90 bwd_dq d128 bf16 causal dense rows64 mma", BNAME.Q1 },
  }
  assert(#tasks == #want, "tasks: " .. #tasks)
  for i, w in ipairs(want) do
    local k = tasks[i]
    assert(k.kind == w[1] and k.branch == w[2] and k.key == w[3] and k.chosen == w[4],
           string.format("task %d: %s %d %s %s", i, k.kind, k.branch, k.key, k.chosen))
    assert(#k.key < 160 and tuning.key_line(k.fields) == k.key and k.fields.wgmma == false)
  end
  -- Candidates: every fitting, allowed tile, in the space's order.
  assert(deep_equal(tasks[1].candidates, { NAME.A, NAME.B, NAME.C }), "fwd, wgmma off")
  assert(deep_equal(tasks[4].candidates, { BNAME.K1, BNAME.K2, BNAME.KX2 }), "dkdv")
  assert(deep_equal(tasks[7].candidates, { BNAME.Q1, BNAME.Q2 }), "dq")
  -- wgmma on, sm_90: the wgmma tiles are candidates, and the key says so; the entries above
  -- (without wgmma) choose nothing here.
  tasks = assert(plan.tune_tasks(c, H90, FWD, BWD, true, t))
  assert(#tasks == 9 and deep_equal(tasks[1].candidates, { NAME.W, NAME.A, NAME.B, NAME.C }))
  assert(tasks[1].chosen == NAME.W and tasks[1].fields.wgmma == true)
  assert(tasks[1].key == "sm_90 fwd d128 bf16 causal dense rows2048 wgmma", tasks[1].key)
  assert(deep_equal(tasks[4].candidates, { BNAME.KW, BNAME.K1, BNAME.K2, BNAME.KX2 }))
  assert(tasks[6].chosen == BNAME.KW, "the rows64 dK/dV entry has no wgmma: " .. tasks[6].chosen)
  -- wgmma on, but sm_80: not admitted, so the key is the one without it.
  local h80 = assert(hw.builtin(80))
  tasks = assert(plan.tune_tasks(c, h80, FWD, nil, true))
  assert(tasks[1].key == "sm_80 fwd d128 bf16 causal dense rows2048 mma", tasks[1].key)
  assert(tasks[1].fields.wgmma == false and tasks[1].candidates[1] == NAME.A)
  local emu = assert(hw.builtin(90))
  emu.emulated = true
  tasks = assert(plan.tune_tasks(c, emu, FWD))
  assert(tasks[1].key == "emu-sm_90 fwd d128 bf16 causal dense rows2048 mma", tasks[1].key)
end)

T.test("tune_tasks: the chosen tile is what the plan takes, stale entries skipped", function()
  -- The tiles a tune tries on H90 with the fixture spaces, per kind and wgmma state.
  local usable = { [false] = { fwd = { NAME.A, NAME.B, NAME.C },
                               bwd_dkdv = { BNAME.K1, BNAME.K2, BNAME.KX2 },
                               bwd_dq = { BNAME.Q1, BNAME.Q2 } },
                   [true] = { fwd = { NAME.W, NAME.A, NAME.B, NAME.C },
                              bwd_dkdv = { BNAME.KW, BNAME.K1, BNAME.K2, BNAME.KX2 },
                              bwd_dq = { BNAME.Q1, BNAME.Q2 } } }
  for _ = 1, 12 do
    local n = math.random(1, 4)
    local segs, dils = {}, {}
    for i = 1, n do segs[i], dils[i] = math.random(1, 1 << 16), math.random(1, 8) end
    local c = config { segments = segs, dilations = dils }
    -- Entries for both wgmma states; some stale (a candidate of now missing), some with a
    -- candidate that no longer exists.
    local entries, keys = {}, {}
    for b = 0, n - 1 do
      for _, kind in ipairs(tuning.KINDS) do
        for _, wg in ipairs { false, true } do
          local k = plan.tuning_key(c, b, kind, "sm_90", wg)
          local line = tuning.key_line(k)
          if not keys[line] and math.random() < 0.7 then
            local names = shuffle { table.unpack(usable[wg][kind]) }
            local stale = math.random() < 0.3
            if stale then table.remove(names, math.random(#names)) end
            if math.random() < 0.3 then
              names[#names + 1] = kind == "bwd_dkdv" and "bn16_bm16_w1_s2_x1" or "bm16_bn16_w1_s2"
            end
            k.candidates, k.ranking = names, {}
            for i, name in ipairs(shuffle { table.unpack(names) }) do
              k.ranking[i] = { tile = name, us = i }
            end
            keys[line] = { entry = k, stale = stale }
            entries[#entries + 1] = k
          end
        end
      end
    end
    for _, wgmma in ipairs { false, true } do
      local t = tun { entries }
      local pl = assert(plan.build(c, H90, FWD, BWD, false, wgmma, t))
      local plain = assert(plan.build(c, H90, FWD, BWD, false, wgmma))
      local tasks = assert(plan.tune_tasks(c, H90, FWD, BWD, wgmma, t))
      local by_key = {}
      for _, k in ipairs(tasks) do by_key[k.key] = k end
      for b = 0, n - 1 do
        local function picks(p)
          local st = p.bwd_steps[b + 1]
          return { fwd = fwd_variant(p, b + 1), bwd_dkdv = p.variants[st.dkdv_kernel],
                   bwd_dq = p.variants[st.dq_kernel] }
        end
        local got, default = picks(pl), picks(plain)
        for kind, v in pairs(got) do
          local line = tuning.key_line(plan.tuning_key(c, b, kind, "sm_90", wgmma))
          local k = assert(by_key[line], line)
          assert(k.chosen == v.tile, string.format("%s: task %s, plan %s", k.key, k.chosen, v.tile))
          assert(k.branch <= b, "a task names the first branch of its key")
          -- The model: a fresh entry's first ranked tile that exists (all of its candidates
          -- fit H90), else the plan without databases.
          local x, want, tuned = keys[line], default[kind].tile, nil
          if x and not x.stale then
            for _, r in ipairs(x.entry.ranking) do
              if r.tile:sub(1, 4) ~= "bm16" and r.tile:sub(1, 4) ~= "bn16" then
                want, tuned = r.tile, true
                break
              end
            end
          end
          -- (A variant shared with a tuned branch is tuned too: only a tuned pick is certain.)
          assert(v.tile == want and (v.tuned == true or not tuned),
                 string.format("%s (%s): plan %s, want %s", line, x and (x.stale and "stale"
                               or "fresh") or "none", v.tile, want))
          -- The task says whether its tile came from an entry (what RDA_PLAN_AUTOTUNE skips).
          assert((k.tuned == true) == (tuned == true) and (k.tuned == true or k.tuned == nil),
                 string.format("%s: task tuned %s, model %s", line, tostring(k.tuned),
                               tostring(tuned)))
        end
      end
    end
  end
end)

T.test("tune_tasks: more than 16 candidates, or none that fits, is an error", function()
  local many = {}
  for i = 1, 17 do many[i] = { block_m = 64, block_n = 16, warps = 4, stages = i } end
  local tasks, why = plan.tune_tasks(config(), H90, { [128] = many })
  assert(not tasks)
  testing.contains(why, "17 candidate tiles, more than the 16")
  local small = assert(hw.builtin(90))
  small.smem_per_block = 4096
  tasks, why = plan.tune_tasks(config(), small, FWD)
  assert(not tasks)
  testing.contains(why, "no forward tile for head_dim = 128 fits")
end)

-- ---------------------------------------------------------------- merge and the bridge

local META = { device = "CPU emulator", date = "2026-11-23", rda = "0.1.0", n = 4096, batch = 2 }

-- Random results for every task: each candidate with a random time, in random order.
local function random_results(tasks)
  local results = {}
  for i, k in ipairs(tasks) do
    local rk = {}
    for j, name in ipairs(shuffle { table.unpack(k.candidates) }) do
      rk[j] = { tile = name, us = math.random() * 10 ^ math.random(-3, 6) }
    end
    results[#results + 1] = { task = i, ranking = rk }
  end
  return shuffle(results)
end

T.test("tune_merge: the text loads back to the measured rankings, fastest first", function()
  local c = config { segments = { 2048, 4096, 512 }, dilations = { 1, 2, 1 } }
  local tasks = assert(bridge.tune_tasks(c, H90, true, false, nil))
  assert(#tasks == 9, "three keys, three kinds")
  local results = random_results(tasks)
  local text = assert(bridge.tune_merge(nil, nil, c, H90, true, false, results, META))
  local d = assert(tuning.load_user(text, "merged.lua"))
  assert(#d.entries == #tasks)
  for _, res in ipairs(results) do
    local e = assert(d.by_key[tasks[res.task].key], tasks[res.task].key)
    assert(deep_equal(e.measured, META), "measured")
    assert(e.wgmma == false and deep_equal(e.candidates, tasks[res.task].candidates),
           "the task's candidates, all of them, in order")
    assert(#e.ranking == #res.ranking)
    local times = {}
    for _, x in ipairs(res.ranking) do times[x.tile] = x.us end
    for i, x in ipairs(e.ranking) do
      assert(times[x.tile] == x.us, string.format("%s: %.17g read back as %.17g", x.tile,
                                                  times[x.tile], x.us))
      assert(i == 1 or e.ranking[i - 1].us <= x.us, "fastest first")
    end
  end
  -- Deterministic: the same measurements give the same text, and merging them again changes
  -- nothing; the text is what serialize writes for what it holds.
  assert(bridge.tune_merge(nil, nil, c, H90, true, false, shuffle(results), META) == text)
  assert(bridge.tune_merge(text, "merged.lua", c, H90, true, false, results, META) == text)
  assert(tuning.serialize(d.entries) == text)
  -- Every plan now takes the ranking's first tile.
  local pl = assert(bridge.plan(c, H90, true, false, false, { user = text, user_name = "m.lua" }))
  for b = 1, 3 do
    local key = tuning.key_line(plan.tuning_key(c, b - 1, "fwd", "sm_90"))
    local v = pl.variants[pl.steps[b].kernel]
    assert(v.tile == d.by_key[key].ranking[1].tile and v.tuned, key)
    key = tuning.key_line(plan.tuning_key(c, b - 1, "bwd_dq", "sm_90"))
    v = pl.variants[pl.bwd_steps[b].dq_kernel]
    assert(v.tile == d.by_key[key].ranking[1].tile and v.tuned, key)
  end
end)

T.test("tune_merge: replaces the entries of its keys and keeps the others", function()
  local c = config()
  local tasks = assert(bridge.tune_tasks(c, H90, false, false))
  assert(#tasks == 1)
  local cands = tasks[1].candidates
  local other = entry({ NAME.A }, { target = "sm_80", measured = { device = "A100", n = 8 } })
  local stale = entry { cands[1] }
  local old = tuning.serialize { stale, other }
  local rk = {}
  for i, name in ipairs(cands) do rk[i] = { tile = name, us = 1000 - i } end -- reversed
  local text = assert(bridge.tune_merge(old, "old.lua", c, H90, false, false,
                                        { { task = 1, ranking = rk } }, META))
  local d = assert(tuning.load_user(text, "new.lua"))
  assert(#d.entries == 2, "one replaced, one kept")
  assert(deep_equal(d.by_key[tuning.key_line(other)], other), "the other entry, unchanged")
  local e = d.by_key[tasks[1].key]
  assert(e.ranking[1].tile == cands[#cands] and e.ranking[#cands].tile == cands[1], "re-ranked")
  assert(deep_equal(e.candidates, cands))
  assert(d.entries[1].target == "sm_80", "sorted by key: sm_80 before sm_90")
  -- Equal times keep the order given; candidates that were not ranked (they failed) are still
  -- the entry's candidates.
  text = assert(bridge.tune_merge(nil, nil, c, H90, false, false,
                                  { { task = 1, ranking = { { tile = cands[2], us = 5 },
                                                            { tile = cands[1], us = 5 } } } },
                                  META))
  e = assert(tuning.load_user(text, "x")).by_key[tasks[1].key]
  assert(e.ranking[1].tile == cands[2] and e.ranking[2].tile == cands[1] and #e.ranking == 2)
  assert(#cands > 2 and deep_equal(e.candidates, cands), "failed candidates are kept")
end)

T.test("tune_merge: bad results are one line each; a bad old database is a config error", function()
  local c = config()
  local tasks = assert(bridge.tune_tasks(c, H90, false, false))
  local good = tasks[1].candidates[1]
  local cases = {
    { { { task = 0, ranking = { { tile = good, us = 1 } } } }, "result 1: task 0 is not one of" },
    { { { task = 2, ranking = { { tile = good, us = 1 } } } }, "task 2 is not one of this "
      .. "config's 1 tasks" },
    { { { task = "1", ranking = { { tile = good, us = 1 } } } }, "task \"1\"" },
    { { { task = 1, ranking = { { tile = "bm16_bn16_w1_s2", us = 1 } } } },
      "tile \"bm16_bn16_w1_s2\" is not a candidate of the task" },
    { { { task = 1, ranking = {} } }, "the ranking must be a non-empty list" },
    { { { task = 1, ranking = { { tile = good, us = 0 } } } }, "us = 0 is not a positive" },
    { { { task = 1, ranking = { { tile = good, us = -3 } } } }, "us = -3" },
    { { { task = 1, ranking = { { tile = good, us = 0 / 0 } } } }, "is not a positive finite" },
    { { { task = 1, ranking = { { tile = good, us = math.huge } } } }, "us = inf" },
    { { { task = 1, ranking = { { tile = good, us = "5" } } } }, "us = \"5\"" },
    { { { task = 1, ranking = { { tile = good, us = 1 }, { tile = good, us = 2 } } } },
      "repeats ranking[1]" },
    { { { task = 1, ranking = { { tile = good, us = 1 } } },
        { task = 1, ranking = { { tile = good, us = 1 } } } },
      "result 2: task 1 was already given by result 1" },
    { { 5 }, "result 1: must be a table" },
  }
  for _, x in ipairs(cases) do
    local n = select("#", bridge.tune_merge(nil, nil, c, H90, false, false, x[1], META))
    local text, why = bridge.tune_merge(nil, nil, c, H90, false, false, x[1], META)
    assert(text == nil and n == 2, "accepted: " .. x[2])
    testing.contains(why, x[2])
    assert(not why:find("\n"), why)
  end
  local ok = { { task = 1, ranking = { { tile = good, us = 1 } } } }
  local bad_meta = { device = "x", date = "2026-02-30T", n = 1, batch = 1 }
  local text, why = bridge.tune_merge(nil, nil, c, H90, false, false, ok, bad_meta)
  assert(not text)
  testing.contains(why, "measured.date")
  local class
  text, why, class = bridge.tune_merge("return { 1 }", "old.lua", c, H90, false, false, ok, META)
  assert(text == nil and class == "config")
  testing.contains(why, "old.lua: entry 1: must be a table")
  text, why, class = bridge.tune_merge("while true do end", "old.lua", c, H90, false, false, ok,
                                       META)
  assert(text == nil and class == "config")
  testing.contains(why, "old.lua")
  -- Empty strings in meta (C's NULL) are unknown fields; without meta, no measured table.
  text = assert(bridge.tune_merge(nil, nil, c, H90, false, false, ok,
                                  { device = "", date = "", rda = "0.1.0", n = 8, batch = 1 }))
  assert(deep_equal(assert(tuning.load_user(text, "x")).entries[1].measured,
                    { rda = "0.1.0", n = 8, batch = 1 }))
  text = assert(bridge.tune_merge(nil, nil, c, H90, false, false, ok))
  assert(assert(tuning.load_user(text, "x")).entries[1].measured == nil)
end)

-- ---------------------------------------------------------------- what an entry tried

-- A merged database (tuning.load_user of tuning.merge's text) for `tasks` (plan.tune_tasks),
-- each ranking its candidates in the order `order(candidates)` gives, into `old` (a database
-- or nil).
local function merged(tasks, order, old)
  local results = {}
  for i, k in ipairs(tasks) do
    local rk = {}
    for j, name in ipairs(order(k.candidates)) do rk[j] = { tile = name, us = 10 * j } end
    results[i] = { task = i, ranking = rk }
  end
  local text = assert(tuning.merge(old or { entries = {} }, tasks, results, META))
  return assert(tuning.load_user(text, "merged.lua")), text
end

local function reversed(list)
  local out = {}
  for i = #list, 1, -1 do out[#out + 1] = list[i] end
  return out
end

T.test("wgmma: a tune without wgmma neither steers a wgmma plan nor replaces its entry", function()
  local c = config()
  local function pick(d, wgmma)
    local v = fwd_variant(assert(plan.build(c, H90, FWD, nil, nil, wgmma,
                                            { dbs = { d }, target = "sm_90" })))
    return v.tile, v.tuned
  end
  local before = pick(assert(tuning.check({}, "none")), true)
  assert(before == NAME.W, "untuned, a wgmma plan takes the wgmma tile: " .. before)
  -- Tune without wgmma (RDA_WGMMA unset): the key says so; the candidates are the mma.sync
  -- tiles; the ranking puts C first.
  local tasks = assert(plan.tune_tasks(c, H90, FWD, nil, false, nil))
  assert(tasks[1].key == "sm_90 fwd d128 bf16 causal dense rows2048 mma")
  local d1, text1 = merged(tasks, reversed)
  local e1 = d1.entries[1]
  assert(#d1.entries == 1 and e1.wgmma == false and e1.ranking[1].tile == NAME.C)
  assert(deep_equal(e1.candidates, { NAME.A, NAME.B, NAME.C }))
  testing.contains(text1, "rows = 2048, wgmma = false,")
  -- The reviewer's case: a wgmma plan still takes the wgmma tile, untuned.
  local t, tuned = pick(d1, true)
  assert(t == NAME.W and tuned == nil, "a wgmma plan after a tune without wgmma: " .. t)
  t, tuned = pick(d1, false)
  assert(t == NAME.C and tuned, "the plan without wgmma follows the tune: " .. t)
  -- The same through tune_tasks: what it says plans take.
  local now = assert(plan.tune_tasks(c, H90, FWD, nil, true, { dbs = { d1 }, target = "sm_90" }))
  assert(now[1].chosen == NAME.W and now[1].key:sub(-6) == " wgmma")
  -- Tune with wgmma on: its own entry, beside the first; B ranked first.
  local wtasks = assert(plan.tune_tasks(c, H90, FWD, nil, true, nil))
  assert(deep_equal(wtasks[1].candidates, { NAME.W, NAME.A, NAME.B, NAME.C }))
  local d2 = merged(wtasks, function(cands)
    return { cands[3], cands[1], cands[4], cands[2] } -- B, W, C, A
  end, d1)
  assert(#d2.entries == 2, "both entries")
  assert(deep_equal(d2.entries[1], e1), "the entry without wgmma, unchanged (and sorted first)")
  local e2 = d2.entries[2]
  assert(e2.wgmma == true and e2.ranking[1].tile == NAME.B and #e2.candidates == 4)
  t, tuned = pick(d2, true)
  assert(t == NAME.B and tuned, "the wgmma entry steers the wgmma plan: " .. t)
  t, tuned = pick(d2, false)
  assert(t == NAME.C and tuned, "the other entry steers the plan without wgmma: " .. t)
  -- A second tune without wgmma replaces only its own entry.
  local d3 = merged(tasks, function(cands) return cands end, d2)
  assert(#d3.entries == 2 and deep_equal(d3.entries[2], e2), "the wgmma entry survives")
  assert(d3.entries[1].ranking[1].tile == NAME.A)
  assert(pick(d3, false) == NAME.A and pick(d3, true) == NAME.B)
end)

T.test("wgmma: the same through the bridge, on the shipped spaces", function()
  local c = config()
  local plain = fwd_variant(assert(bridge.plan(c, H90, false, false, true)))
  assert(plain.tile:sub(-3) == "_wg", "the shipped d128 space leads with wgmma tiles")
  local tasks = assert(bridge.tune_tasks(c, H90, false, false))
  local results = { { task = 1, ranking = {} } }
  for j, name in ipairs(reversed(tasks[1].candidates)) do
    results[1].ranking[j] = { tile = name, us = j }
  end
  local text = assert(bridge.tune_merge(nil, nil, c, H90, false, false, results, META))
  local user = { user = text, user_name = "u.lua" }
  local v = fwd_variant(assert(bridge.plan(c, H90, false, false, true, user)))
  assert(v.tile == plain.tile and v.tuned == nil, "wgmma plan after an mma tune: " .. v.tile)
  v = fwd_variant(assert(bridge.plan(c, H90, false, false, false, user)))
  assert(v.tile == results[1].ranking[1].tile and v.tuned, v.tile)
  -- Now with wgmma: a second entry; each plan reads its own.
  local wtasks = assert(bridge.tune_tasks(c, H90, false, true, user))
  assert(wtasks[1].chosen == plain.tile and wtasks[1].key:sub(-6) == " wgmma")
  local wc = wtasks[1].candidates
  local wresults = { { task = 1, ranking = { { tile = wc[#wc], us = 1 },
                                             { tile = wc[1], us = 2 } } } }
  local text2 = assert(bridge.tune_merge(text, "u.lua", c, H90, false, true, wresults, META))
  local d = assert(tuning.load_user(text2, "u.lua"))
  assert(#d.entries == 2 and not d.entries[1].wgmma and d.entries[2].wgmma)
  assert(deep_equal(d.entries[2].candidates, wc), "every candidate tried, failed ones too")
  user.user = text2
  v = fwd_variant(assert(bridge.plan(c, H90, false, false, true, user)))
  assert(v.tile == wc[#wc] and v.tuned, v.tile)
  v = fwd_variant(assert(bridge.plan(c, H90, false, false, false, user)))
  assert(v.tile == results[1].ranking[1].tile and v.tuned, v.tile)
end)

T.test("stale: an entry that did not try a tile the space now has is skipped", function()
  local c = config()
  local function pick(space, dbs, wgmma)
    local t = { dbs = dbs, target = "sm_90" }
    local v = fwd_variant(assert(plan.build(c, H90, space, nil, nil, wgmma, t)))
    local tasks = assert(plan.tune_tasks(c, H90, space, nil, wgmma, t))
    assert(tasks[1].chosen == v.tile, "tune_tasks says what the plan takes")
    return v.tile, v.tuned
  end
  -- Tuned when the space held A and B only: B first.
  local old_space = { [128] = { A, B } }
  local d = merged(assert(plan.tune_tasks(c, H90, old_space)), reversed)
  assert(deep_equal(d.entries[1].candidates, { NAME.A, NAME.B }))
  local t, tuned = pick(old_space, { d })
  assert(t == NAME.B and tuned)
  -- The space gained C: the entry never measured it, so it is skipped: the default rule.
  t, tuned = pick({ [128] = { A, B, C } }, { d })
  assert(t == NAME.A and tuned == nil, "stale entry used: " .. t)
  t, tuned = pick({ [128] = { C, A, B } }, { d })
  assert(t == NAME.C and tuned == nil, t)
  -- ... and the next database's entry, when it tried everything, serves instead.
  local shipped = db { entry({ NAME.C, NAME.A }, { candidates = { NAME.C, NAME.B, NAME.A } }) }
  t, tuned = pick({ [128] = { A, B, C } }, { d, shipped })
  assert(t == NAME.C and tuned, t)
  -- Not stale: the new tile does not fit, is a wgmma tile with wgmma off, or a tile went away.
  assert(pick({ [128] = { A, B, BIG } }, { d }) == NAME.B, "BIG does not fit")
  assert(pick({ [128] = { W, A, B } }, { d }) == NAME.B, "W is not a candidate without wgmma")
  assert(pick({ [128] = { B } }, { d }) == NAME.B, "A removed")
  -- With wgmma on, W is a candidate: an entry of the wgmma state that did not try it is stale.
  local wd = db { entry({ NAME.B }, { wgmma = true, candidates = { NAME.A, NAME.B } }) }
  t, tuned = pick({ [128] = { A, B } }, { wd }, true)
  assert(t == NAME.B and tuned)
  t, tuned = pick({ [128] = { W, A, B } }, { wd }, true)
  assert(t == NAME.W and tuned == nil, t)
  -- The backward the same way: a dK/dV space that gained K2.
  local bc = config()
  local old_b = { [128] = { dkdv = { K1, KX2 }, dq = { Q1, Q2 } } }
  local bd = merged(assert(plan.tune_tasks(bc, H90, FWD, old_b)), reversed)
  local function dkdv(bspace)
    local p = assert(plan.build(bc, H90, FWD, bspace, false, false,
                                { dbs = { bd }, target = "sm_90" }))
    local v = p.variants[p.bwd_steps[1].dkdv_kernel]
    return v.tile, v.tuned
  end
  t, tuned = dkdv(old_b)
  assert(t == BNAME.KX2 and tuned, t)
  t, tuned = dkdv { [128] = { dkdv = { K1, KX2, K2 }, dq = { Q1, Q2 } } }
  assert(t == BNAME.K1 and tuned == nil, t)
  local p = assert(plan.build(bc, H90, FWD, { [128] = { dkdv = { K1, KX2, K2 }, dq = { Q1, Q2 } } },
                              false, false, { dbs = { bd }, target = "sm_90" }))
  local q = p.variants[p.bwd_steps[1].dq_kernel]
  assert(q.tile == BNAME.Q2 and q.tuned, "the dQ entry is still fresh: " .. q.tile)
end)

T.test("serialize: round-trips every field exactly, floats included", function()
  -- Up to 16 candidates with long names (the line wraps), a random few ranked.
  local function fill(e)
    e.candidates, e.ranking = {}, {}
    for j = 1, math.random(1, 16) do
      local wg = e.wgmma and j % 2 == 0 and "_wg" or ""
      e.candidates[j] = e.kind == "bwd_dkdv"
                        and string.format("bn%d_bm%d_w%d_s2_x1%s", 16 * j, 160 + 16 * j, 10 + j, wg)
                        or string.format("bm%d_bn%d_w%d_s2%s", 160 + 16 * j, 16 * j, 10 + j, wg)
    end
    shuffle(e.candidates)
    local us = 0
    for j = 1, math.random(1, #e.candidates) do
      us = us + (math.random() < 0.2 and 0 or math.random() * 10 ^ math.random(-6, 9))
      if us == 0 then us = 2 ^ -30 end
      e.ranking[j] = { tile = e.candidates[j], us = j == 3 and math.floor(us) + 1 or us }
      us = e.ranking[j].us
    end
    if math.random() < 0.7 then
      e.measured = { device = "NVIDIA \"H100\" \\ 80GB", date = "2026-01-31", rda = "0.1.0-rc1",
                     n = math.random(1, 1 << 40), batch = math.random(1, 64) }
      if math.random() < 0.3 then e.measured.rda = nil end
    end
    return e
  end
  -- Base entries without wgmma; those of an sm_90 target get a twin with wgmma.
  local entries, twins = {}, 0
  for i = 1, 24 do
    local e = fill(entry({}, {
      target = ({ "sm_80", "sm_90", "emu-sm_90", "emu-sm_86" })[math.random(4)],
      kind = tuning.KINDS[math.random(3)], head_dim = ({ 32, 64, 128 })[math.random(3)],
      dtype = math.random() < 0.5 and "bf16" or "fp16", causal = math.random() < 0.5,
      dilated = math.random() < 0.5, rows = 1 << (i + 3),
    }))
    if i == 1 then e.measured = {} end
    entries[#entries + 1] = e
    if e.target:sub(-5) == "sm_90" then
      local twin = {}
      for _, k in ipairs { "target", "kind", "head_dim", "dtype", "causal", "dilated", "rows" } do
        twin[k] = e[k]
      end
      twin.wgmma = true
      entries[#entries + 1] = fill(twin)
      twins = twins + 1
    end
  end
  assert(tuning.check(entries, "gen"))
  local text = tuning.serialize(entries)
  local d = assert(tuning.load_user(text, "rt.lua"))
  assert(#d.entries == #entries)
  for _, e in ipairs(entries) do
    assert(deep_equal(d.by_key[tuning.key_line(e)], e), tuning.key_line(e))
  end
  for i = 2, #d.entries do
    assert(tuning.serialize { d.entries[i - 1], d.entries[i] }
           == tuning.serialize { d.entries[i], d.entries[i - 1] }, "order-free")
  end
  assert(tuning.serialize(shuffle(d.entries)) == text, "deterministic")
  assert(text:sub(1, #tuning.HEADER) == tuning.HEADER)
  -- The candidates wrap before column 100 (measured's device may be long: it is not wrapped).
  for line in text:gmatch("[^\n]+") do
    assert(#line < 100 or line:find("^    measured = "), "a long line: " .. line)
  end
  testing.contains(text, ",\n      \"") -- some candidates line was wrapped
  -- Each entry and its twin of the other wgmma state are side by side, without wgmma first.
  local pairs_seen, sorted = 0, assert(tuning.load_user(text, "rt.lua")).entries -- file order
  for i = 2, #sorted do
    local a, b = sorted[i - 1], sorted[i]
    if tuning.key_line(a):gsub(" %a+$", "") == tuning.key_line(b):gsub(" %a+$", "") then
      assert(not a.wgmma and b.wgmma, tuning.key_line(a))
      pairs_seen = pairs_seen + 1
    end
  end
  assert(pairs_seen == twins, string.format("%d pairs, %d twins", pairs_seen, twins))
end)

T.test("bridge.plan: the user's database, its errors, the force, the emulator's target", function()
  local c = config()
  local tasks = assert(bridge.tune_tasks(c, H90, false, false))
  local cands = tasks[1].candidates
  assert(#cands >= 2, "the shipped space has at least two fitting d128 tiles on sm_90")
  local last = cands[#cands]
  local text = tuning.serialize { entry({ last }, { candidates = cands }) }
  local pl = assert(bridge.plan(c, H90, false, false, false, { user = text, user_name = "u.lua" }))
  assert(fwd_variant(pl).tile == last and fwd_variant(pl).tuned)
  local plain = assert(bridge.plan(c, H90, false, false, false))
  assert(fwd_variant(plain).tile == tasks[1].chosen and fwd_variant(plain).tuned == nil)
  -- tune_tasks sees the user's database too.
  local t2 = assert(bridge.tune_tasks(c, H90, false, false, { user = text, user_name = "u.lua" }))
  assert(t2[1].chosen == last)
  -- The emulator's plans ignore a GPU's entry.
  local emu = assert(hw.builtin(90))
  emu.emulated = true
  pl = assert(bridge.plan(c, emu, false, false, false, { user = text, user_name = "u.lua" }))
  assert(fwd_variant(pl).tile == tasks[1].chosen and fwd_variant(pl).tuned == nil)
  -- A bad database: three values, the last "config"; the message names the file.
  local n = select("#", bridge.plan(c, H90, false, false, false, { user = "return 5",
                                                                    user_name = "u.lua" }))
  local p, why, class = bridge.plan(c, H90, false, false, false, { user = "return 5",
                                                                   user_name = "u.lua" })
  assert(p == nil and n == 3 and class == "config")
  testing.contains(why, "u.lua: the tuning database must return a list of entries, not 5")
  p, why, class = bridge.plan(c, H90, false, false, false, { user = "return {" })
  assert(p == nil and class == "config")
  testing.contains(why, "tuning database:1:")
  -- A force: tuned; a bad one: two values.
  pl = assert(bridge.plan(c, H90, false, false, false,
                          { force = { kind = "fwd", branch = 0, tile = cands[2] } }))
  assert(fwd_variant(pl).tile == cands[2] and fwd_variant(pl).tuned)
  n = select("#", bridge.plan(c, H90, false, false, false,
                              { force = { kind = "fwd", branch = 0, tile = "bm16_bn16_w1_s2" } }))
  p, why = bridge.plan(c, H90, false, false, false,
                       { force = { kind = "fwd", branch = 0, tile = "bm16_bn16_w1_s2" } })
  assert(p == nil and n == 2)
  testing.contains(why, "bm16_bn16_w1_s2 is not a candidate for fwd branch 0 here")
  -- No tile fits: two values, as before.
  local tiny = assert(hw.builtin(90))
  tiny.smem_per_block = 1024
  n = select("#", bridge.plan(c, tiny, false, false, false))
  p, why = bridge.plan(c, tiny, false, false, false)
  assert(p == nil and n == 2)
  testing.contains(why, "no forward tile")
end)

T.test("for_plan: the user's database, then the shipped one; either bad: config", function()
  local shipped = tuning.serialize { entry { NAME.C }, entry({ NAME.C }, { rows = 4096 }) }
  local read = function(name)
    assert(name == "tuning/db.lua", name)
    return shipped
  end
  local user = tuning.serialize { entry { NAME.B } }
  local t = assert(tuning.for_plan(H90, { user = user, user_name = "u.lua" }, read, "/h"))
  assert(#t.dbs == 2 and t.dbs[1].name == "u.lua" and t.dbs[2].name == "/h/tuning/db.lua")
  assert(t.target == "sm_90" and t.force == nil)
  local function tile_of(tt, segs)
    return fwd_variant(assert(plan.build(config { segments = segs }, H90, FWD, nil, nil, nil,
                                         tt))).tile
  end
  assert(tile_of(t, { 2048 }) == NAME.B, "the user's entry")
  assert(tile_of(t, { 4096 }) == NAME.C, "the shipped entry where the user has none")
  t = assert(tuning.for_plan(H90, nil, read, "/h"))
  assert(#t.dbs == 1 and tile_of(t, { 2048 }) == NAME.C, "the shipped database alone")
  local force = { kind = "fwd", branch = 0, tile = NAME.A }
  t = assert(tuning.for_plan(H90, { force = force }, read, "/h"))
  assert(t.force == force and tile_of(t, { 2048 }) == NAME.A)
  local emu = assert(hw.builtin(90))
  emu.emulated = true
  t = assert(tuning.for_plan(emu, { user = user }, read, "/h"))
  assert(t.target == "emu-sm_90" and tile_of(t, { 2048 }) == NAME.A, "GPU entries: not for emu")
  local n = select("#", tuning.for_plan(H90, { user = "return { 1 }", user_name = "u.lua" }, read,
                                        "/h"))
  local bad, why, class = tuning.for_plan(H90, { user = "return { 1 }", user_name = "u.lua" },
                                          read, "/h")
  assert(bad == nil and n == 3 and class == "config")
  testing.contains(why, "u.lua: entry 1: must be a table")
  bad, why, class = tuning.for_plan(H90, nil, function() return "return { 1, 2 }" end, "/h")
  assert(bad == nil and class == "config")
  testing.contains(why, "/h/tuning/db.lua: entry 1")
end)

T.test("the shipped database loads, checks, is canonical, and holds no entries", function()
  local d = assert(tuning.shipped(native.source, native.home()))
  assert(#d.entries == 0, "tuning/db.lua gets entries only from `rdagen tune` measurements")
  local text = assert(native.source("tuning/db.lua"))
  assert(tuning.serialize(d.entries) == text, "tuning/db.lua is what the writer writes")
  assert(tuning.load_user(text, "tuning/db.lua"), "it loads as a user database too")
  assert(rawequal(tuning.shipped(native.source, native.home()), d), "parsed once per text")
  -- No file: an empty database; a bad one: its name, and what is wrong.
  local none = assert(tuning.shipped(function() return nil, "missing" end, "/h"))
  assert(#none.entries == 0)
  local bad, why = tuning.shipped(function() return "return { 1 }" end, "/h")
  assert(not bad)
  testing.contains(why, "/h/tuning/db.lua: entry 1: must be a table")
  bad, why = tuning.shipped(function() return "return {" end, "/h")
  assert(not bad)
  testing.contains(why, "/h/tuning/db.lua:1:")
  -- A good other text is parsed and kept in its place.
  local other = tuning.serialize { entry { NAME.A } }
  local o = assert(tuning.shipped(function() return other end, "/h"))
  assert(#o.entries == 1 and rawequal(tuning.shipped(function() return other end, "/h"), o))
end)

T.run()
