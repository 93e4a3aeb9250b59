-- testing.lua — the tiny runner of the Lua unit tests under gen/tests/ (run through the
-- embedded interpreter by tests/test_gen.c): named cases, each run protected, one error at the
-- end listing every failure with its traceback.

local M = {}

-- A new suite: suite.test(name, fn) registers a case, suite.run() runs them all.
function M.suite(title)
  assert(type(title) == "string", "a suite needs a title")
  local cases = {}
  local s = {}
  function s.test(name, fn)
    assert(type(name) == "string" and type(fn) == "function", "test(name, fn)")
    cases[#cases + 1] = { name = name, fn = fn }
  end
  function s.run()
    local failed = {}
    for _, c in ipairs(cases) do
      local ok, err = xpcall(c.fn, debug.traceback)
      if not ok then failed[#failed + 1] = c.name .. ": " .. tostring(err) end
    end
    if #failed > 0 then
      error(string.format("%s: %d of %d failed: %s", title, #failed, #cases,
                          table.concat(failed, "\n")), 0)
    end
    return #cases
  end
  return s
end

-- Expects fn(...) to raise; returns the message.
function M.raises(fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected an error, got none")
  return tostring(err)
end

-- Asserts that s contains the plain text `part`.
function M.contains(s, part)
  assert(type(s) == "string", "expected a string, got " .. type(s))
  assert(s:find(part, 1, true), string.format("%q does not contain %q", s, part))
end

return M
