-- test_config.lua — config validation and the sandbox environment seen from Lua (the C side
-- of the same rules is tests/test_config.c).

local testing = require "gen.testing"
local config = require "gen.config"

local T = testing.suite("test_config")

local function valid(over)
  local c = { heads = 16, kv_heads = 4, head_dim = 128, dtype = "bf16",
              segments = { 2048, 4096, 8192 }, dilations = { 1, 2, 4 }, offsets = "mod",
              causal = true }
  for k, v in pairs(over or {}) do c[k] = v end
  return c
end

local function rejects(t, ...)
  local c, msg = config.validate(t, "x.lua")
  assert(c == nil, "accepted an invalid config")
  assert(not msg:find("\n"), "message is one line")
  for _, part in ipairs { ... } do testing.contains(msg, part) end
  return msg
end

T.test("the SPEC example validates with defaults resolved", function()
  local c = assert(config.validate(valid(), "x.lua"))
  assert(c.heads == 16 and c.kv_heads == 4 and c.head_dim == 128 and c.dtype == "bf16", "fields")
  assert(#c.segments == 3 and c.segments[3] == 8192 and c.dilations[2] == 2, "branches")
  assert(c.offsets == "mod" and c.causal == true, "flags")
  assert(math.abs(c.scale - 1 / math.sqrt(128)) < 1e-15, "default scale")
end)

T.test("kv_heads, offsets and causal have defaults", function()
  local t = valid()
  t.kv_heads, t.offsets, t.causal = nil, nil, nil
  local c = assert(config.validate(t, "x.lua"))
  assert(c.kv_heads == 16 and c.offsets == "mod" and c.causal == false, "defaults")
end)

T.test("the scale may be negative, and sizes reach 2^40", function()
  local c = assert(config.validate(valid { scale = -0.5 }, "x.lua"))
  assert(c.scale == -0.5 and math.type(c.scale) == "float", "negative scale kept")
  c = assert(config.validate(valid { scale = -2 }, "x.lua"))
  assert(c.scale == -2.0 and math.type(c.scale) == "float", "integer scale becomes a float")
  c = assert(config.validate(valid { segments = { 1 << 40, 8, 8 }, dilations = { 1, 1 << 40, 2 } },
                             "x.lua"))
  assert(c.segments[1] == config.MAX_SIZE and c.dilations[2] == 1 << 40, "the bound itself")
end)

T.test("integral floats are integers", function()
  local c = assert(config.validate(valid { heads = 16.0, segments = { 2048.0, 4096, 8192 } },
                                   "x.lua"))
  assert(math.type(c.heads) == "integer" and math.type(c.segments[1]) == "integer", "converted")
end)

T.test("rule messages name the key, the value and what is allowed", function()
  local msg = rejects(valid { head_dim = 80 })
  assert(msg == "x.lua: head_dim = 80: must be one of 32, 64, 96, 128, 256", msg)
  rejects(valid { heads = 2.5 }, "heads = 2.5", "integer")
  rejects(valid { kv_heads = 3 }, "kv_heads = 3", "divide")
  rejects(valid { dtype = "fp32" }, 'dtype = "fp32"', '"bf16", "fp16"')
  rejects(valid { segments = { 1, 2, 0 } }, "segments[3] = 0", ">= 1")
  rejects(valid { dilations = { 1, 2 } }, "dilations", "2 entries", "segments has 3")
  rejects(valid { offsets = "ring" }, 'offsets = "ring"', '"mod", "block", "group"')
  rejects(valid { causal = "yes" }, 'causal = "yes"', "true or false")
  rejects(valid { scale = 0 }, "scale = 0: must be a finite nonzero number", "leave scale out")
  rejects(valid { scale = 1e300 }, "scale = 1e+300", "|scale| <= 2.3586574e+38", "fit in fp32")
  rejects(valid { scale = -1e39 }, "scale = -1e+39", "|scale| <= 2.3586574e+38")
  rejects(valid { scale = 0/0 }, "scale = ", "finite nonzero")
  rejects(valid { segments = { 1, (1 << 40) + 1, 3 } },
          "segments[2] = 1099511627777: must be at most 2^40 = 1099511627776")
  rejects(valid { dilations = { 1, math.maxinteger, 3 } },
          "dilations[2] = 9223372036854775807: must be at most 2^40")
  rejects(valid { bogus = 1 }, "bogus = 1", "unknown key", "allowed keys")
  rejects(valid { dropout = 0.1 }, "dropout = 0.1", "not supported")
end)

-- Values a careless or hostile config might put anywhere.
local POOL <const> = { 0, -1, -0.5, 2.5e38, 1 << 41, 1, 2, 3, 4, 16, 32, 64, 80, 128, 256, 1.5,
                       2048.0, 1e300, 2^63, -2^63, 0/0, math.huge, -math.huge, "", "x", "bf16",
                       "fp16", "mod",
                       "group", "block", true, false, {}, { 1 }, { 1, 2, 3 }, { 0 }, { "8" },
                       { 1, nil, 3 }, { 1 << 41 }, { x = 1 }, print, coroutine.create(print) }
local FIELDS <const> = { "heads", "kv_heads", "head_dim", "dtype", "segments", "dilations",
                         "offsets", "causal", "scale", "dropout", "other", 1 }

T.test("validate never raises and either accepts a sound config or says one line", function()
  local seed = 12345
  local function rand(n) -- a small LCG: the same cases on every run
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed % n + 1
  end
  local accepted = 0
  for _ = 1, 3000 do
    local t = valid()
    for _ = 1, rand(3) do t[FIELDS[rand(#FIELDS)]] = POOL[rand(#POOL + 1)] end
    local ok, c, msg = pcall(config.validate, t, "x.lua")
    assert(ok, "validate raised: " .. tostring(c))
    if c then
      accepted = accepted + 1
      assert(c.heads >= 1 and c.kv_heads >= 1 and c.heads % c.kv_heads == 0, "heads")
      assert(#c.segments == #c.dilations and #c.segments >= 1 and #c.segments <= 16, "branches")
      for i = 1, #c.segments do
        assert(math.type(c.segments[i]) == "integer" and c.segments[i] >= 1
               and c.segments[i] <= config.MAX_SIZE, "segment")
        assert(math.type(c.dilations[i]) == "integer" and c.dilations[i] >= 1
               and c.dilations[i] <= config.MAX_SIZE, "dilation")
      end
      assert(c.scale ~= 0 and math.abs(c.scale) * 1.4426950408889634 <= (2 - 2^-23) * 2^127,
             "scale")
      assert(c.offsets ~= "group" or c.heads >= #c.segments, "group")
    else
      assert(type(msg) == "string" and msg:sub(1, 7) == "x.lua: " and not msg:find("\n"),
             "message: " .. tostring(msg))
    end
  end
  assert(accepted > 0 and accepted < 3000, "the mutations hit both outcomes")
end)

T.test("values are shown on one line and bounded", function()
  assert(config.show("a\nb") == '"a\\nb"', config.show("a\nb"))
  assert(config.show(2048.0) == "2048.0", "float")
  assert(config.show({ 1, 2 }) == "{1, 2}", "list")
  assert(#config.show(string.rep("x", 1000)) < 60, "long strings are cut")
  local long = {}
  for i = 1, 100 do long[i] = i end
  assert(#config.show(long) < 60, "long lists are cut")
  assert(config.show({ { 1 } }) == "{{...}}", "nesting is cut")
end)

T.test("the sandbox environment holds nothing unsafe", function()
  local env = config.sandbox_env()
  for _, name in ipairs { "io", "os", "require", "load", "loadstring", "dofile", "loadfile",
                          "debug", "collectgarbage", "print", "getmetatable", "setmetatable",
                          "rawset", "pcall", "xpcall", "coroutine", "package", "_G" } do
    assert(rawget(env, name) == nil, "sandbox exposes " .. name)
  end
  testing.contains(testing.raises(function() return env.os end), "os is not available")
  for _, name in ipairs { "dump", "find", "gsub", "gmatch", "match" } do
    assert(env.string[name] == nil, "sandbox exposes string." .. name)
  end
  assert(env.math.random == nil, "math.random is not deterministic")
  assert(env.string ~= string and env.table ~= table and env.math ~= math, "copies, not shared")
  assert(env.string.rep and env.table.concat and env.math.floor and env.pairs, "helpers")
end)

T.test("each run gets a fresh environment", function()
  local a, b = config.sandbox_env(), config.sandbox_env()
  assert(a ~= b and a.string ~= b.string, "fresh tables")
end)

T.test("load runs the chunk with its own limits", function()
  local _, msg = config.load("while true do end", "loop.lua", { instructions = 1000 })
  testing.contains(msg, "loop.lua:1: config exceeds the instruction limit")
  _, msg = config.load("return string.rep('x', 1 << 20)", "big.lua", { bytes = 1 << 16 })
  testing.contains(msg, "config exceeds the memory limit")
end)

T.test("load bounds the time of C calls the instruction count does not see", function()
  -- One instruction each, each a long call in C: only the clock stops them (about 20 s
  -- without it).
  local t0 = os.clock()
  local _, msg = config.load("local t = {} for i = 1, 100000 do t[i] = i end\n"
                             .. "for i = 1, 2000 do table.sort(t) end return {}", "sort.lua",
                             { seconds = 0.2 })
  testing.contains(msg, "sort.lua:2: config exceeds the time limit (0.2 s)")
  _, msg = config.load("local s = ('x'):rep(1 << 20)\nfor i = 1, 100000 do s:upper() end",
                       "upper.lua", { seconds = 0.2 })
  testing.contains(msg, "upper.lua:2: config exceeds the time limit (0.2 s)")
  assert(os.clock() - t0 < 5, "the limit took too long to trip")
  -- The default limit leaves real work alone.
  local c = assert(config.load("local t = {} for i = 1, 1000 do t[i] = -i end table.sort(t)"
                               .. " return { heads = 1, head_dim = 32, dtype = 'bf16',"
                               .. " segments = { -t[1] }, dilations = { 1 } }", "ok.lua"))
  assert(c.segments[1] == 1000, "sorted")
end)

T.test("the sandbox's table.sort orders as the library's does", function()
  local sort = config.sandbox_env().table.sort
  assert(sort ~= table.sort, "the sandbox has its own sort")
  local seed = os.time()
  math.randomseed(seed)
  local function check(a, comp, what)
    local want, got = {}, {}
    for i = 1, #a do want[i], got[i] = a[i], a[i] end
    table.sort(want, comp)
    sort(got, comp)
    for i = 1, #a do
      assert(got[i] == want[i], string.format("%s, n %d, seed %d: [%d] = %s, want %s", what, #a,
                                              seed, i, tostring(got[i]), tostring(want[i])))
    end
  end
  for _, n in ipairs { 0, 1, 2, 3, 5, 16, 17, 100, 1000, 4097 } do
    local nums, strs = {}, {}
    for i = 1, n do
      nums[i] = math.random(-n, n) + (math.random() < 0.3 and 0.5 or 0) -- repeats, floats
      strs[i] = string.rep(string.char(math.random(97, 100)), math.random(0, 3))
    end
    check(nums, nil, "numbers")
    check(nums, function(x, y) return x > y end, "numbers, descending")
    check(strs, nil, "strings")
  end
  testing.contains(testing.raises(sort, { 1, "x", 2 }), "attempt to compare")
  testing.contains(testing.raises(sort, 5), "table expected")
  testing.contains(testing.raises(sort, {}, 5), "function expected")
  -- Through a config, comparator included.
  local c = assert(config.load("local s = { 4096, 1024, 2048 }"
                               .. " table.sort(s, function(a, b) return a > b end)"
                               .. " return { heads = 3, head_dim = 32, dtype = 'bf16',"
                               .. " segments = s, dilations = { 1, 1, 1 } }", "sort.lua"))
  assert(c.segments[1] == 4096 and c.segments[2] == 2048 and c.segments[3] == 1024, "sorted")
end)

T.test("messages name a long chunk in full and always name it", function()
  local long = "/a/very/long/folder/name/that/goes/past/lua/idsize/of/sixty/characters/x.lua"
  assert(#long > 70)
  for _, c in ipairs {
    { "return {\n heads = = 1 }", long .. ":2: unexpected symbol near '='" },
    { "local t\nreturn t.x", long .. ":2: attempt to index a nil value" },
    { "\n\nwhile true do end", long .. ":3: config exceeds the instruction limit" },
    { "error('', 0)", long .. ": (empty message)" },
    { "error('')", long .. ":1: (empty message)" },
    { "error('plain', 0)", long .. ": plain" },
    { "return " .. string.rep("(", 300) .. "1" .. string.rep(")", 300), long .. ": " },
  } do
    local _, msg = config.load(c[1], long)
    assert(msg:sub(1, #c[2]) == c[2], string.format("%q does not start with %q", msg, c[2]))
  end
end)

T.test("the generator's string library survives a config", function()
  local c = assert(config.load("string.upper = nil return " ..
                               "{ heads = 1, head_dim = 32, dtype = 'bf16', " ..
                               "segments = { 8 }, dilations = { 1 } }", "s.lua"))
  assert(c.heads == 1, "loaded")
  assert(string.upper("a") == "A" and ("a"):upper() == "A", "string.upper is intact")
  assert(("abc"):find("b") == 2, "string methods point at the full library again")
  assert(string.dump == nil, "string.dump is gone from the generator")
end)

-- A sparse table whose border #t is 2^40 or 2^62 ({1, 2, 3, 4, [5] = 1} and every power of two
-- up to it, as one constructor): the library's insert/remove at position 1 would shift #t
-- slots in one C loop, hours to forever.
local function sparse(e, op)
  local parts = { "local t = {1, 2, 3, 4, [5] = 1" }
  for k = 3, e do parts[#parts + 1] = (", [%d] = 1"):format(1 << k) end
  return table.concat(parts) .. ("}\nassert(#t == 1 << %d, 'border ' .. #t)\n%s\nreturn {}")
    :format(e, op)
end

T.test("table.insert and table.remove shift in counted instructions", function()
  for _, e in ipairs { 40, 62 } do
    for _, op in ipairs { "table.insert(t, 1, 0)", "table.remove(t, 1)",
                          "table.insert(t, 2.0, 0)", "table.remove(t, '1')" } do
      local t0 = os.clock()
      local _, msg = config.load(sparse(e, op), "sparse.lua", { seconds = 30 })
      testing.contains(msg, "sparse.lua:3: config exceeds the instruction limit")
      assert(os.clock() - t0 < 10, op .. " took too long")
    end
  end
end)

T.test("table.insert and table.remove behave as the library's", function()
  local env = config.sandbox_env()
  local ins, rem = env.table.insert, env.table.remove
  local seed = os.time()
  math.randomseed(seed)
  for round = 1, 300 do
    local n = math.random(0, 12)
    local a, b = {}, {}
    for i = 1, n do a[i] = math.random(1000); b[i] = a[i] end
    for _ = 1, 6 do
      local pos = math.random(-1, n + 2)
      if math.random(4) == 1 then pos = pos + 0.0 end
      local r1, r2
      if math.random(2) == 1 then
        local v = math.random(1000)
        r1 = table.pack(pcall(table.insert, a, pos, v))
        r2 = table.pack(pcall(ins, b, pos, v))
      else
        r1 = table.pack(pcall(table.remove, a, pos))
        r2 = table.pack(pcall(rem, b, pos))
      end
      assert(r1.n == r2.n and r1[1] == r2[1], "seed " .. seed .. " round " .. round)
      if r1[1] then
        assert(r1[2] == r2[2], "result, seed " .. seed)
      else
        assert(r1[2]:match("%(.*%)$") == r2[2]:match("%(.*%)$"), r2[2])
      end
      assert(#a == #b, "length, seed " .. seed)
      for i = 0, #a + 1 do assert(rawequal(a[i], b[i]), "slot " .. i .. ", seed " .. seed) end
    end
  end
  -- Appends, pops and the library's errors, naming 'insert'/'remove' and the config's line.
  local c = assert(config.load("local t = {}\ntable.insert(t, 5)\ntable.insert(t, 1, 4)\n"
                               .. "table.insert(t, 3, 6)\nlocal x = table.remove(t)\n"
                               .. "return { heads = 1, head_dim = 32, dtype = 'bf16',"
                               .. " segments = { t[1] * 10 + t[2] + x * 100 }, dilations = { 1 } }",
                               "ok.lua"))
  assert(c.segments[1] == 645, "insert/remove results " .. c.segments[1])
  local _, msg = config.load("local t = {1, 2}\ntable.insert(t, 5, 1)", "pos.lua")
  testing.contains(msg, "pos.lua:2: bad argument #2 to 'insert' (position out of bounds)")
  _, msg = config.load("local t = {1, 2}\ntable.insert(t, 1, 2, 3)", "args.lua")
  testing.contains(msg, "args.lua:2: wrong number of arguments to 'insert'")
  _, msg = config.load("local t = {1, 2}\ntable.remove(t, 7)", "rem.lua")
  testing.contains(msg, "rem.lua:2: bad argument #2 to 'remove' (position out of bounds)")
  _, msg = config.load("table.insert(nil, 1, 2)", "nil.lua")
  testing.contains(msg, "nil.lua:1: bad argument #1 to 'insert' (table expected, got nil)")
end)

-- Two calls of string.upper on 40 MiB (some 60 ms each) in fewer than 10 instructions (the
-- hook's count): no count event comes; only call events (the calls, and the __close of the
-- library's string buffer each makes) see the limit pass, inside the chunk at one of its lines.
-- Without them the chunk would run to its end, caught only there, with no line.
T.test("the call hook stops a chunk between two long C calls", function()
  local native = require "rda.native"
  local big, nuls = ("x"):rep(40 << 20), ("\0"):rep(8 << 20)
  local function run(text, name, seconds)
    collectgarbage() -- no collector debt of the test's own garbage charged to the chunk
    return native.sandbox_run(text, name, { string = {}, up = string.upper, s = big, z = nuls },
                              1000, 1 << 28, seconds)
  end
  local ok, msg = run("up(s)\nup(s)", "=calls.lua", 0.04)
  assert(not ok, "accepted")
  assert(msg:match("^calls%.lua:[12]: config exceeds the time limit %(0%.04 s%)$"), msg)
  -- One long instruction (`<` of 8 MiB of NULs: 8M calls of strcoll, no call of a function)
  -- and the chunk returns: no hook event came, the clock is read once more, never accepting it.
  ok, msg = run("local x = z < z", "=once.lua", 0.02)
  assert(not ok, "an overrun chunk was accepted")
  assert(msg == "once.lua: config exceeds the time limit (0.02 s)", msg)
  assert(run("up(s) return 1", "=fast.lua", 5))
end)

-- `<` of two long strings of NULs calls strcoll once per NUL: 8 MiB of them take some 0.07 s a
-- compare, all in one instruction. The clock must be read often enough that the limit is
-- overshot by a few compares at most, in a loop and in table.sort.
T.test("long string compares overshoot the limit by little", function()
  local cases = {
    "local a = ('\\0'):rep(8 << 20)\nfor i = 1, 1000 do if a < a then error('x') end end",
    "local a = ('\\0'):rep(8 << 20)\nlocal t = {}\nfor i = 1, 200 do t[i] = a end\n"
      .. "table.sort(t)",
  }
  for _, text in ipairs(cases) do
    local t0 = os.clock()
    local _, msg = config.load(text, "lt.lua", { seconds = 0.3 })
    local took = os.clock() - t0
    testing.contains(msg, "config exceeds the time limit (0.3 s)")
    assert(took < 0.3 + 0.5, string.format("%.2f s for a limit of 0.3 s", took))
  end
end)

-- Checking what a chunk returned is work that grows with it (300,000 unknown keys: about
-- 0.4 s here), so it runs under the same clock: the limit bounds parse, run and checks
-- together, whichever of them uses the time up.
T.test("the checks of a config count against its time limit", function()
  local text = "local t = { heads = 8, head_dim = 64, dtype = 'bf16', segments = { 256 },\n"
               .. "dilations = { 1 } }\nfor i = 1, 300000 do t[i + 0.5] = 1 end\nreturn t"
  local t0 = os.clock()
  local c, msg = config.load(text, "keys.lua", { seconds = 0.25 })
  local took = os.clock() - t0
  assert(c == nil, "accepted")
  testing.contains(msg, "config exceeds the time limit (0.25 s)")
  assert(took < 0.25 + 0.5, string.format("%.2f s for a limit of 0.25 s", took))
  -- The same chunk with time enough: the least unknown key, named.
  c, msg = config.load(text, "keys.lua", { seconds = 60 })
  assert(c == nil, "accepted")
  testing.contains(msg, "keys.lua: [1.5] = 1: unknown key")
end)

-- As the stand-alone interpreter: a UTF-8 byte order mark and a first line starting with '#'
-- are skipped, and line numbers stay the file's.
T.test("a byte order mark and a #! line are skipped", function()
  local body = "return { heads = 2, head_dim = 32, dtype = 'bf16', segments = { 16 }, "
               .. "dilations = { 1 } }"
  for _, text in ipairs { "\xEF\xBB\xBF" .. body, "#!/usr/bin/env lua\n" .. body,
                          "\xEF\xBB\xBF#!/usr/bin/env lua\n" .. body, "#\n" .. body } do
    local c = assert(config.load(text, "ok.lua"))
    assert(c.heads == 2 and c.segments[1] == 16, "fields")
  end
  for _, bad in ipairs {
    { "#!/usr/bin/env lua\nreturn {\n", "bad.lua:3:" }, -- the file's line numbers
    { "#!/usr/bin/env lua", "x.lua: the config must return a table, not nothing" },
    { "\xEF\xBB\xBF#!x\n\27Lua", "x.lua:" },
    { "\xEF\xBB", "x.lua:1:" }, -- not a whole mark: Lua's own error
  } do
    local c, msg = config.load(bad[1], bad[2]:match("^[^:]+"))
    assert(c == nil, "accepted")
    testing.contains(msg, bad[2])
  end
end)

-- Lua's parser reports nesting past its C stack with no line; the message says what it means.
T.test("a config nested too deeply says so", function()
  local c, msg = config.load("return " .. ("{"):rep(300) .. ("}"):rep(300), "deep.lua")
  assert(c == nil, "accepted")
  assert(msg == "deep.lua: the config nests too deeply for Lua's parser (C stack overflow)", msg)
end)

T.run()
