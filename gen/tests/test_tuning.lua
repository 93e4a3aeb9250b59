-- test_tuning.lua — the tuning databases (gen/tuning.lua) and their use by the planner and the
-- bridge: keys and rows buckets, the checker (one line per bad field), the sandbox of a user's
-- database, lookup (rank order, fit, wgmma, target, user before shipped, per branch), forced
-- tiles, the tuner's task list, and the merge (round trip, replace by key, deterministic).

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

-- An entry for the key of branch 0 of config() on sm_90, ranking `tiles` (names) with rising
-- times; `over` changes fields.
local function entry(tiles, over)
  local e = { target = "sm_90", kind = "fwd", head_dim = 128, dtype = "bf16", causal = true,
              dilated = false, rows = 2048, ranking = {} }
  for i, t in ipairs(tiles) do e.ranking[i] = { tile = t, us = 100 * i + math.random() } end
  for k, v in pairs(over or {}) do e[k] = v end
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

T.test("key lines name every field of the key", function()
  assert(tuning.key_line(tuning.key("sm_90", "fwd", 128, "bf16", true, false, 2048))
         == "sm_90 fwd d128 bf16 causal dense rows2048")
  assert(tuning.key_line(tuning.key("emu-sm_90", "bwd_dq", 64, "fp16", false, true, 16))
         == "emu-sm_90 bwd_dq d64 fp16 noncausal dilated rows16")
  local k = plan.tuning_key(config { segments = { 2048, 8193 }, dilations = { 1, 4 } }, 1,
                            "bwd_dkdv", "sm_80")
  assert(tuning.key_line(k) == "sm_80 bwd_dkdv d128 bf16 causal dilated rows4096",
         tuning.key_line(k))
end)

-- ---------------------------------------------------------------- checking

T.test("check: a good database passes, and indexes its entries by key", function()
  local list = { entry { NAME.A, NAME.B },
                 entry({ BNAME.K1 }, { kind = "bwd_dkdv", measured = {
                   device = "NVIDIA H100 80GB HBM3", date = "2026-11-23", rda = "0.1.0",
                   n = 32768, batch = 1 } }),
                 entry({ NAME.C }, { target = "emu-sm_90", rows = 1 << 62, measured = {} }) }
  local d = db(list)
  assert(d.entries == list and d.by_key["sm_90 fwd d128 bf16 causal dense rows2048"] == list[1])
  assert(d.by_key["sm_90 bwd_dkdv d128 bf16 causal dense rows2048"] == list[2])
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
    { { ranking = rk({ tile = NAME.A, us = 0 / 0 }) }, "ranking[1].us" },
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
    { { measured = { n = 0 } }, "measured.n = 0" },
    { { measured = { batch = 1.5 } }, "measured.batch = 1.5" },
    { { measured = { device = 5 } }, "measured.device = 5" },
    { { measured = { rda = "0.1\n2" } }, "measured.rda = \"0.1\\n2\"" },
    { { measured = { device = string.rep("x", 201) } }, "measured.device" },
  }
  for _, c in ipairs(cases) do
    local bad = entry { NAME.A }
    for k, v in pairs(c[1]) do bad[k] = v end
    local d, why = tuning.check({ entry({ NAME.A }, { rows = 16 }), bad }, "bad.lua")
    assert(d == nil, "accepted: " .. c[2])
    testing.contains(why, "bad.lua: entry 2: ")
    testing.contains(why, c[2])
    assert(not why:find("\n"), "one line: " .. why)
  end
end)

T.test("check: a repeated key names both entries; the list itself is checked", function()
  local list = { entry { NAME.A }, entry({ NAME.A }, { rows = 4096 }), entry { NAME.B } }
  local d, why = tuning.check(list, "dup.lua")
  assert(not d)
  testing.contains(why, "dup.lua: entry 3: the same key as entry 1 "
                        .. "(sm_90 fwd d128 bf16 causal dense rows2048)")
  -- The same fields but another target, kind or dilation is another key.
  assert(tuning.check({ entry { NAME.A }, entry({ NAME.A }, { target = "emu-sm_90" }),
                        entry({ NAME.A }, { kind = "bwd_dq" }),
                        entry({ NAME.A }, { dilated = true }) }, "ok.lua"))
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
  assert(tile_of { entry { NAME.W, NAME.C } } == NAME.C, "wgmma off")
  assert(tile_of({ entry { NAME.W, NAME.C } }, H90, true) == NAME.W, "wgmma on, sm_90")
  local h80 = assert(hw.builtin(80))
  assert(tile_of({ entry({ NAME.W, NAME.C }, { target = "sm_80" }) }, h80, true, "sm_80")
         == NAME.C, "wgmma on, but sm_80")
  -- No usable tile at all (or names no longer in the space): the default rule, not tuned.
  local t, tuned = tile_of { entry { NAME.BIG, NAME.W, "bm16_bn16_w1_s2" } }
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
                          { target = "sm_80" } } do
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
  -- wgmma dK/dV ranked first: only with wgmma on.
  local wk = { entry({ BNAME.KW, BNAME.K2 }, { kind = "bwd_dkdv" }) }
  pl = assert(plan.build(config(), H90, FWD, BWD, false, false, tun { wk }))
  assert(pl.variants[pl.bwd_steps[1].dkdv_kernel].tile == BNAME.K2)
  pl = assert(plan.build(config(), H90, FWD, BWD, false, true, tun { wk }))
  assert(pl.variants[pl.bwd_steps[1].dkdv_kernel].tile == BNAME.KW)
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
    { "fwd", 0, "sm_90 fwd d128 bf16 causal dense rows2048", NAME.C },
    { "fwd", 2, "sm_90 fwd d128 bf16 causal dilated rows2048", NAME.A },
    { "fwd", 3, "sm_90 fwd d128 bf16 causal dense rows64", NAME.B },
    { "bwd_dkdv", 0, "sm_90 bwd_dkdv d128 bf16 causal dense rows2048", BNAME.K1 },
    { "bwd_dkdv", 2, "sm_90 bwd_dkdv d128 bf16 causal dilated rows2048", BNAME.K1 },
    { "bwd_dkdv", 3, "sm_90 bwd_dkdv d128 bf16 causal dense rows64", BNAME.K2 },
    { "bwd_dq", 0, "sm_90 bwd_dq d128 bf16 causal dense rows2048", BNAME.Q1 },
    { "bwd_dq", 2, "sm_90 bwd_dq d128 bf16 causal dilated rows2048", BNAME.Q1 },
    { "bwd_dq", 3, "sm_90 bwd_dq d128 bf16 causal dense rows64", BNAME.Q1 },
  }
  assert(#tasks == #want, "tasks: " .. #tasks)
  for i, w in ipairs(want) do
    local k = tasks[i]
    assert(k.kind == w[1] and k.branch == w[2] and k.key == w[3] and k.chosen == w[4],
           string.format("task %d: %s %d %s %s", i, k.kind, k.branch, k.key, k.chosen))
    assert(#k.key < 160 and tuning.key_line(k.fields) == k.key)
  end
  -- Candidates: every fitting, allowed tile, in the space's order.
  assert(deep_equal(tasks[1].candidates, { NAME.A, NAME.B, NAME.C }), "fwd, wgmma off")
  assert(deep_equal(tasks[4].candidates, { BNAME.K1, BNAME.K2, BNAME.KX2 }), "dkdv")
  assert(deep_equal(tasks[7].candidates, { BNAME.Q1, BNAME.Q2 }), "dq")
  tasks = assert(plan.tune_tasks(c, H90, FWD, nil, true, nil))
  assert(#tasks == 3 and deep_equal(tasks[1].candidates, { NAME.W, NAME.A, NAME.B, NAME.C }))
  assert(tasks[1].chosen == NAME.W and tasks[1].key:sub(1, 6) == "sm_90 ")
  local emu = assert(hw.builtin(90))
  emu.emulated = true
  tasks = assert(plan.tune_tasks(c, emu, FWD))
  assert(tasks[1].key == "emu-sm_90 fwd d128 bf16 causal dense rows2048", tasks[1].key)
end)

T.test("tune_tasks: the chosen tile is what the plan takes", function()
  for _ = 1, 10 do
    local n = math.random(1, 4)
    local segs, dils = {}, {}
    for i = 1, n do segs[i], dils[i] = math.random(1, 1 << 16), math.random(1, 8) end
    local c = config { segments = segs, dilations = dils }
    local entries, keys = {}, {}
    for b = 0, n - 1 do
      for _, kind in ipairs(tuning.KINDS) do
        local k = plan.tuning_key(c, b, kind, "sm_90")
        local line = tuning.key_line(k)
        if not keys[line] and math.random() < 0.6 then
          keys[line] = true
          local names = kind == "fwd" and { NAME.A, NAME.B, NAME.C }
                        or kind == "bwd_dq" and { BNAME.Q1, BNAME.Q2 }
                        or { BNAME.K1, BNAME.K2, BNAME.KX2 }
          k.ranking = {}
          for i, name in ipairs(shuffle(names)) do k.ranking[i] = { tile = name, us = i } end
          entries[#entries + 1] = k
        end
      end
    end
    local t = tun { entries }
    local pl = assert(plan.build(c, H90, FWD, BWD, false, false, t))
    local tasks = assert(plan.tune_tasks(c, H90, FWD, BWD, false, t))
    local by_key = {}
    for _, k in ipairs(tasks) do by_key[k.key] = k end
    for b = 0, n - 1 do
      local st = pl.bwd_steps[b + 1]
      local picks = { fwd = fwd_variant(pl, b + 1), bwd_dkdv = pl.variants[st.dkdv_kernel],
                      bwd_dq = pl.variants[st.dq_kernel] }
      for kind, v in pairs(picks) do
        local k = assert(by_key[tuning.key_line(plan.tuning_key(c, b, kind, "sm_90"))])
        assert(k.chosen == v.tile, string.format("%s: task %s, plan %s", k.key, k.chosen, v.tile))
        assert(k.branch <= b, "a task names the first branch of its key")
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
  assert(d.entries[1].target == "sm_80", "sorted by key: sm_80 before sm_90")
  -- Equal times keep the order given.
  text = assert(bridge.tune_merge(nil, nil, c, H90, false, false,
                                  { { task = 1, ranking = { { tile = cands[2], us = 5 },
                                                            { tile = cands[1], us = 5 } } } },
                                  META))
  e = assert(tuning.load_user(text, "x")).by_key[tasks[1].key]
  assert(e.ranking[1].tile == cands[2] and e.ranking[2].tile == cands[1])
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

T.test("serialize: round-trips every field exactly, floats included", function()
  local entries = {}
  for i = 1, 30 do
    local e = entry({}, {
      target = ({ "sm_80", "sm_90", "emu-sm_90", "emu-sm_86" })[math.random(4)],
      kind = tuning.KINDS[math.random(3)], head_dim = ({ 32, 64, 128 })[math.random(3)],
      dtype = math.random() < 0.5 and "bf16" or "fp16", causal = math.random() < 0.5,
      dilated = math.random() < 0.5, rows = 1 << (i + 3),
    })
    local us = 0
    for j = 1, math.random(1, 16) do
      us = us + (math.random() < 0.2 and 0 or math.random() * 10 ^ math.random(-6, 9))
      if us == 0 then us = 2 ^ -30 end
      local name = e.kind == "bwd_dkdv" and string.format("bn%d_bm32_w4_s2_x1", 16 * j)
                   or string.format("bm64_bn%d_w4_s2%s", 16 * j, j % 2 == 0 and "_wg" or "")
      e.ranking[j] = { tile = name, us = j == 3 and math.floor(us) + 1 or us }
      us = e.ranking[j].us
    end
    if math.random() < 0.7 then
      e.measured = { device = "NVIDIA \"H100\" \\ 80GB", date = "2026-01-31", rda = "0.1.0-rc1",
                     n = math.random(1, 1 << 40), batch = math.random(1, 64) }
      if math.random() < 0.3 then e.measured.rda = nil end
    end
    if i == 1 then e.measured = {} end
    entries[i] = e
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
end)

T.test("bridge.plan: the user's database, its errors, the force, the emulator's target", function()
  local c = config()
  local tasks = assert(bridge.tune_tasks(c, H90, false, false))
  local cands = tasks[1].candidates
  assert(#cands >= 2, "the shipped space has at least two fitting d128 tiles on sm_90")
  local last = cands[#cands]
  local text = tuning.serialize { entry { last } }
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
