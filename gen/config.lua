-- config.lua — SPEC §3: run an attention config chunk in a sandbox (runtime/gen.c bounds its
-- instructions, bytes and time) and validate every key, each failure one line naming the key,
-- the value and what is allowed. Nothing is planned from a config that failed here.

local native = require "rda.native"

local M = {}

local MAX_INSTRUCTIONS <const> = 10000000   -- a real config needs a few hundred
local MAX_BYTES <const> = 64 * 1024 * 1024  -- what the chunk may allocate while it runs
local MAX_BRANCHES <const> = native.max_branches -- RDA_MAX_BRANCHES of runtime/config.h
local MAX_HEADS <const> = 65535             -- heads of one launch go on gridDim.y
-- Segment lengths and dilation rates: far beyond any sequence, and small enough that the
-- index arithmetic on them (ceil(N / w), p + r, (m + 1) * w) stays inside int64.
local MAX_SIZE <const> = 1 << 40
local MAX_SIZE_TEXT <const> = "2^40 = 1099511627776"
-- The kernels fold the scale into fp32 constants, scale * log2(e) the largest of them: it must
-- stay a finite float. FLT_MAX is (2 - 2^-23) * 2^127.
local FLT_MAX <const> = (2 - 2^-23) * 2^127
local LOG2E <const> = 1.4426950408889634
-- FLT_MAX / log2(e) rounded down to 8 significant digits (2.3586574e38), for messages only: a
-- value the message shows as allowed really passes the check.
local SCALE_MAX <const> = math.floor(FLT_MAX / LOG2E / 1e31) * 1e31
local HEAD_DIMS <const> = { 32, 64, 96, 128, 256 }
local DTYPES <const> = { "bf16", "fp16" }
local OFFSETS <const> = { "mod", "block", "group" }
local KEYS <const> = { "heads", "kv_heads", "head_dim", "dtype", "segments", "dilations",
                       "offsets", "causal", "scale" }

-- Keys for what SPEC §1 leaves undefined: rejected as "not supported", never ignored.
local UNSUPPORTED <const> = {
  dropout = "dropout is not defined",
  dropout_p = "dropout is not defined",
  attention_dropout = "dropout is not defined",
  mask = "attention masks other than causal are not defined",
  attn_mask = "attention masks other than causal are not defined",
  attention_mask = "attention masks other than causal are not defined",
  key_padding_mask = "attention masks other than causal are not defined",
  padding_mask = "attention masks other than causal are not defined",
  window = "attention masks other than causal are not defined",
  sliding_window = "attention masks other than causal are not defined",
  cross_attention = "cross-attention (Lq ~= Lk) is not defined",
  kv_len = "cross-attention (Lq ~= Lk) is not defined",
  kv_seq_len = "cross-attention (Lq ~= Lk) is not defined",
  decoding = "decoding (Lq ~= Lk) is not defined",
}

-- What the config sees: computing helpers only. Left out on purpose: io, os, require, load,
-- loadstring, dofile, loadfile, debug, collectgarbage, print, getmetatable, setmetatable,
-- rawset, pcall/xpcall (they would catch the limit errors), coroutine, string.dump, the
-- pattern functions (a pathological pattern runs in C, out of the instruction count's sight)
-- and table.move (moving 2^60 nils loops in C without allocating). string.rep is wrapped: an
-- empty string repeated 2^60 times would loop in C the same way; so are table.insert and
-- table.remove, whose shift of t[pos..#t] would too (#t of a sparse table can be 2^62).
-- table.sort is the generator's (native.sandbox_sort): the library's compares without a
-- comparator inside one C call that no hook interrupts, hours for a table of long equal
-- strings; this one keeps to the time limit.
local SAFE_GLOBALS <const> = { "assert", "error", "ipairs", "next", "pairs", "rawequal",
                               "rawget", "rawlen", "select", "tonumber", "tostring", "type",
                               "_VERSION" }
local SAFE_STRING <const> = { "byte", "char", "format", "len", "lower", "rep", "reverse", "sub",
                              "upper" }
local SAFE_TABLE <const> = { "concat", "insert", "pack", "remove", "sort", "unpack" }
local UNSAFE_MATH <const> = { random = true, randomseed = true } -- configs are deterministic

local function pick(from, names)
  local t = {}
  for _, k in ipairs(names) do t[k] = from[k] end
  return t
end

-- Names a config might reach for, answered with a clear error instead of "a nil value".
local FORBIDDEN <const> = { "io", "os", "require", "load", "loadstring", "dofile", "loadfile",
                            "debug", "collectgarbage", "print", "getmetatable", "setmetatable",
                            "rawset", "pcall", "xpcall", "coroutine", "package", "_G", "utf8" }

local function forbid(_, name)
  for _, f in ipairs(FORBIDDEN) do
    if name == f then
      error(name .. " is not available in a config: it runs in a sandbox without io, os, "
            .. "require, load, dofile, debug or metatables", 2)
    end
  end
  return nil
end

local string_rep <const> = string.rep
local REP_MAX <const> = 0x7fffffff -- the string library's largest result

-- string.rep with its arguments checked here, so its errors point at the config's line.
local function safe_rep(s, n, sep)
  if type(s) == "number" then s = tostring(s) end
  if type(sep) == "number" then sep = tostring(sep) end
  if type(s) ~= "string" then
    error("bad argument #1 to 'rep' (string expected, got " .. type(s) .. ")", 2)
  end
  if sep ~= nil and type(sep) ~= "string" then
    error("bad argument #3 to 'rep' (string expected, got " .. type(sep) .. ")", 2)
  end
  local count = math.type(n) and math.tointeger(n)
  if not count then error("bad argument #2 to 'rep' (an integer expected)", 2) end
  sep = sep or ""
  if count <= 0 or (s == "" and sep == "") then return "" end
  if (#s + #sep) * (count + 0.0) > REP_MAX then error("resulting string too large", 2) end
  return string_rep(s, count, sep)
end

local table_insert <const> = table.insert

-- table.insert(t, pos, v) and table.remove(t, pos) shift t[pos..#t] one place in one C loop:
-- with t = {1, 2, 3, 4, [5] = 1, [8] = 1, ..., [2^62] = 1}, #t is 2^62, a loop no hook sees that
-- allocates nothing. Here the shift runs in Lua, instructions the sandbox counts; an append or
-- a pop is the library's. The arguments are checked here, with the library's messages, raised
-- at the config's line (a call of the library from here would name this file and the local).
-- Positions convert as the library converts them (2.0 and "2" are 2).
local function position(v, fname)
  local i = math.tointeger(v)
  if i then return i end
  local why = tonumber(v) ~= nil and "number has no integer representation"
              or "number expected, got " .. type(v)
  error("bad argument #2 to '" .. fname .. "' (" .. why .. ")", 3)
end

local function check_table(fname, n, t)
  if type(t) ~= "table" then
    error("bad argument #1 to '" .. fname .. "' (table expected, got "
          .. (n == 0 and "no value" or type(t)) .. ")", 3)
  end
end

local function safe_insert(...)
  local n, t, pos, v = select("#", ...), ...
  check_table("insert", n, t)
  local e = #t + 1
  if n == 2 then return table_insert(t, pos) end -- an append
  if n ~= 3 then error("wrong number of arguments to 'insert'", 2) end
  local p = position(pos, "insert")
  if p < 1 or p > e then error("bad argument #2 to 'insert' (position out of bounds)", 2) end
  for i = e, p + 1, -1 do t[i] = t[i - 1] end
  t[p] = v
end

local function safe_remove(...)
  local n, t, pos = select("#", ...), ...
  check_table("remove", n, t)
  local size = #t
  local p = size
  if pos ~= nil then p = position(pos, "remove") end
  if p ~= size and (p < 1 or p > size + 1) then
    error("bad argument #2 to 'remove' (position out of bounds)", 2)
  end
  local v = t[p]
  for i = p, size - 1 do t[i] = t[i + 1] end
  t[math.max(p, size)] = nil
  return v
end

-- A fresh environment per run: a config may change its own copies, never the generator's.
-- The environment's metatable cannot be reached from inside (no getmetatable there).
function M.sandbox_env()
  local env = pick(_G, SAFE_GLOBALS)
  env.string = pick(string, SAFE_STRING)
  env.string.rep = safe_rep
  env.table = pick(table, SAFE_TABLE)
  env.table.sort = native.sandbox_sort
  env.table.insert, env.table.remove = safe_insert, safe_remove
  env.math = {}
  for k, v in pairs(math) do
    if not UNSAFE_MATH[k] then env.math[k] = v end
  end
  return setmetatable(env, { __index = forbid })
end

-- A short, one-line rendering of a value for messages.
local function show(v, nested)
  local t = type(v)
  if t == "string" then
    local s = string.format("%q", #v > 40 and v:sub(1, 40) .. "..." or v)
    return (s:gsub("\\\n", "\\n"))
  elseif t == "number" then
    if v ~= v then return "nan" end -- C's printf may say "-nan": the sign of a NaN means nothing
    if math.type(v) == "float" and v == math.floor(v) and v > -2^53 and v < 2^53 then
      return string.format("%.1f", v)
    end
    return tostring(v)
  elseif t == "boolean" or t == "nil" then
    return tostring(v)
  elseif t == "table" then
    if nested then return "{...}" end
    local parts, n = {}, rawlen(v)
    for i = 1, math.min(n, 8) do parts[i] = show(rawget(v, i), true) end
    if n > 8 then parts[#parts + 1] = "..." end
    if n == 0 and next(v) ~= nil then parts[1] = "..." end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return "a " .. t
end
M.show = show

local function one_of(list)
  local parts = {}
  for i, v in ipairs(list) do parts[i] = show(v) end
  return "must be one of " .. table.concat(parts, ", ")
end

local function contains(list, v)
  for _, x in ipairs(list) do
    if x == v then return true end
  end
  return false
end

-- The integer value of v when it is a number with an integral value that fits int64.
local function integer(v)
  return type(v) == "number" and math.tointeger(v) or nil
end

local function key_name(k)
  -- a long name is shown cut, with its "...", as long string values are
  return type(k) == "string" and #k <= 40 and k:match("^[%a_][%w_]*$") and k
      or "[" .. show(k) .. "]"
end

-- First offending key (deterministic: the least by name, found in one pass), or nil.
local function check_keys(t)
  local k, kname
  for key in pairs(t) do
    if not contains(KEYS, key) then
      local name = key_name(key)
      if kname == nil or name < kname then k, kname = key, name end
    end
  end
  if kname == nil then return nil end
  local shown = kname .. " = " .. show(t[k])
  if UNSUPPORTED[k] then
    return shown .. ": not supported: " .. UNSUPPORTED[k] .. " (SPEC §1)"
  end
  return shown .. ": unknown key: allowed keys are " .. table.concat(KEYS, ", ")
end

local function check_count(t, key, lo, hi, required)
  local v = t[key]
  if v == nil and not required then return nil end
  local i = integer(v)
  if i == nil or i < lo or i > hi then
    return nil, string.format("%s = %s: %s an integer from %d to %d", key, show(v),
                              v == nil and "required:" or "must be", lo, hi)
  end
  return i
end

-- A list of 1..MAX_BRANCHES integers from 1 to MAX_SIZE (segment lengths or dilation rates).
local function check_list(t, key, what)
  local v = t[key]
  local allowed = string.format("a list of 1 to %d %s (integers from 1 to %s)", MAX_BRANCHES,
                                what, MAX_SIZE_TEXT)
  if type(v) ~= "table" then
    return nil, string.format("%s = %s: %s %s", key, show(v),
                              v == nil and "required:" or "must be", allowed)
  end
  local n = rawlen(v)
  for k in pairs(v) do
    if integer(k) == nil or integer(k) < 1 or integer(k) > n then
      return nil, string.format("%s = %s: key %s is not a list index: must be %s", key, show(v),
                                key_name(k), allowed)
    end
  end
  if n < 1 or n > MAX_BRANCHES then
    return nil, string.format("%s = %s: has %d entries: must be %s", key, show(v), n, allowed)
  end
  local out = {}
  for i = 1, n do
    local x = integer(rawget(v, i))
    if x == nil or x < 1 then
      return nil, string.format("%s[%d] = %s: must be an integer >= 1", key, i,
                                show(rawget(v, i)))
    end
    if x > MAX_SIZE then
      return nil, string.format("%s[%d] = %s: must be at most %s", key, i, show(rawget(v, i)),
                                MAX_SIZE_TEXT)
    end
    out[i] = x
  end
  return out
end

local function check_choice(t, key, list, default)
  local v = t[key]
  if v == nil then return default end
  if not contains(list, v) then
    return nil, string.format("%s = %s: %s", key, show(v), one_of(list))
  end
  return v
end

-- Validates the table a config returned. Returns the resolved config or nil plus the message
-- (without the chunk name).
local function validate(t)
  local msg = check_keys(t)
  if msg then return nil, msg end
  local c = {}
  c.heads, msg = check_count(t, "heads", 1, MAX_HEADS, true)
  if msg then return nil, msg end
  c.kv_heads, msg = check_count(t, "kv_heads", 1, MAX_HEADS, false)
  if msg then return nil, msg end
  c.kv_heads = c.kv_heads or c.heads
  if c.kv_heads > c.heads then
    return nil, string.format("kv_heads = %d: must be at most heads = %d", c.kv_heads, c.heads)
  end
  if c.heads % c.kv_heads ~= 0 then
    return nil, string.format("kv_heads = %d: must divide heads = %d (heads %% kv_heads == 0)",
                              c.kv_heads, c.heads)
  end
  local d = t.head_dim
  if integer(d) == nil or not contains(HEAD_DIMS, integer(d)) then
    return nil, string.format("head_dim = %s: %s%s", show(d), d == nil and "required: " or "",
                              one_of(HEAD_DIMS))
  end
  c.head_dim = integer(d)
  if t.dtype == nil then
    return nil, "dtype = nil: required: " .. one_of(DTYPES)
  end
  c.dtype, msg = check_choice(t, "dtype", DTYPES)
  if msg then return nil, msg end
  c.segments, msg = check_list(t, "segments", "segment lengths")
  if msg then return nil, msg end
  c.dilations, msg = check_list(t, "dilations", "dilation rates")
  if msg then return nil, msg end
  if #c.dilations ~= #c.segments then
    return nil, string.format("dilations = %s: has %d entries but segments has %d: "
                              .. "must have one dilation rate per segment",
                              show(t.dilations), #c.dilations, #c.segments)
  end
  c.offsets, msg = check_choice(t, "offsets", OFFSETS, "mod")
  if msg then return nil, msg end
  if c.offsets == "group" and c.heads < #c.segments then
    return nil, string.format("offsets = \"group\": needs heads >= the number of branches "
                              .. "(heads = %d, %d branches)", c.heads, #c.segments)
  end
  if t.causal ~= nil and type(t.causal) ~= "boolean" then
    return nil, string.format("causal = %s: must be true or false", show(t.causal))
  end
  c.causal = t.causal == true
  -- Any sign (SPEC §1 puts none on τ; the kernels fold a negative one into the scores), but
  -- not 0: the C API spells the default as 0, so a file could not mean τ = 0 by it.
  local s = t.scale
  if s ~= nil then
    local allowed = string.format("must be a finite nonzero number with |scale| <= %.8g, or nil "
                                  .. "for 1/sqrt(head_dim)", SCALE_MAX)
    if type(s) ~= "number" or s ~= s or s == math.huge or s == -math.huge then
      return nil, string.format("scale = %s: %s", show(s), allowed)
    end
    if s == 0 then
      return nil, string.format("scale = %s: %s (0 is not allowed: leave scale out for the "
                                .. "default)", show(s), allowed)
    end
    if math.abs(s) * LOG2E > FLT_MAX then
      return nil, string.format("scale = %s: %s (scale * log2(e) must fit in fp32)", show(s),
                                allowed)
    end
  end
  c.scale = s and s + 0.0 or 1.0 / math.sqrt(c.head_dim)
  return c
end

-- Validates a config table; `where` (the chunk name) prefixes any message.
function M.validate(t, where)
  assert(type(where) == "string", "validate needs the config's name for its messages")
  if type(t) ~= "table" then
    return nil, string.format("%s: the config must return a table, not %s", where,
                              t == nil and "nothing" or show(t))
  end
  local c, msg = validate(t)
  if not c then return nil, where .. ": " .. msg end
  return c
end

-- Runs a config chunk (text only) in the sandbox and validates what it returns.
-- `where` names the chunk in messages, in full, e.g. "configs/default.lua". `limits` (for
-- tests) may lower { instructions, bytes, seconds }; seconds defaults to the generator's time
-- limit (RDA_GEN_SANDBOX_SECONDS of runtime/gen.h).
function M.load(text, where, limits)
  assert(type(text) == "string", "config text must be a string")
  assert(type(where) == "string", "config name must be a string")
  limits = limits or {}
  -- Validated within the same time limit: the checks' work grows with what the chunk returns.
  local ok, v = native.sandbox_run(text, "=" .. where, M.sandbox_env(),
                                   limits.instructions or MAX_INSTRUCTIONS,
                                   limits.bytes or MAX_BYTES, limits.seconds, "config",
                                   function(t) return M.validate(t, where) end)
  if not ok then return nil, v end
  return v
end

M.MAX_INSTRUCTIONS = MAX_INSTRUCTIONS
M.MAX_BYTES = MAX_BYTES
M.MAX_SIZE = MAX_SIZE

return M
