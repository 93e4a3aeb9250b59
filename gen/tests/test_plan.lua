-- test_plan.lua — the planner: every variant fits every target, variants are deduplicated and
-- named deterministically, steps cover each head of each branch exactly once, small grids get
-- small tiles, and a plan that cannot fit says why.

local testing = require "gen.testing"
local plan = require "gen.plan"
local emit = require "gen.emit"
local hw = require "gen.hw"
local native = require "rda.native"

local T = testing.suite("test_plan")

local function config(over)
  local c = { heads = 16, kv_heads = 4, head_dim = 128, dtype = "bf16",
              segments = { 2048, 4096, 8192 }, dilations = { 1, 2, 4 }, offsets = "mod",
              causal = true, scale = 1 / math.sqrt(128) }
  for k, v in pairs(over or {}) do c[k] = v end
  return c
end

-- A matrix of configs across head dims, dtypes, causal, offsets and branch shapes.
local function matrix()
  local out = {}
  for _, d in ipairs { 32, 64, 96, 128, 256 } do
    for _, dtype in ipairs { "bf16", "fp16" } do
      for _, causal in ipairs { false, true } do
        for _, offsets in ipairs { "mod", "block", "group" } do
          out[#out + 1] = config { head_dim = d, dtype = dtype, causal = causal,
                                   offsets = offsets, segments = { 16, 64, 1000, 65536 },
                                   dilations = { 1, 3, 1, 16 } }
        end
      end
    end
  end
  return out
end

local function each_target(fn)
  for _, a in ipairs(hw.known()) do fn(assert(hw.builtin(a))) end
end

local function check_fits(space, p, wgmma)
  for _, c in ipairs(matrix()) do
    local pl = assert(plan.build(c, p, space, nil, nil, wgmma))
    for _, v in ipairs(pl.variants) do
      assert(v.smem_bytes <= p.smem_per_block,
             v.name .. " needs more shared memory than " .. p.name .. " has")
      assert(v.threads <= 1024 and v.threads <= p.max_threads_per_sm, v.name .. " threads")
      if v.kind == "fwd" then
        assert(v.smem_bytes == 2 * c.head_dim * (v.block_m + 2 * v.stages * v.block_n),
               v.name .. " smem formula")
        -- wgmma tiles: only when asked, on sm_90, where every d = 64 / 128 variant takes one.
        local want = wgmma and p.arch == 90 and (c.head_dim == 64 or c.head_dim == 128)
        assert((v.wgmma == true) == (want == true), v.name .. " wgmma on " .. p.name)
        assert((v.name:find("_wg", 1, true) ~= nil) == (want == true), v.name .. " name")
        assert(v.threads == 32 * v.warps and v.block_m == 16 * v.warps, v.name .. " shape")
      end
    end
  end
end

T.test("every variant fits every built-in target (stand-in space)", function()
  each_target(function(p) check_fits(plan.STAND_IN, p) end)
end)

T.test("every variant fits every built-in target (the space in use)", function()
  local space = assert(plan.load_space(native.home()))
  each_target(function(p) check_fits(space, p) end)
end)

T.test("the wgmma tiles serve sm_90 alone, and only when asked", function()
  local space = assert(plan.load_space(native.home(), native.source)) -- as gen/bridge.lua reads it
  each_target(function(p) check_fits(space, p, true) end)
end)

T.test("a space of wgmma tiles alone names why it cannot serve another target", function()
  local space = { [128] = { { block_m = 128, block_n = 128, warps = 8, stages = 2, wgmma = true } } }
  local c = config { segments = { 2048 }, dilations = { 1 } }
  assert(plan.build(c, hw.builtin(90), space, nil, nil, true), "sm_90 with wgmma on")
  local pl, why = plan.build(c, hw.builtin(90), space)
  assert(pl == nil, "wgmma off")
  testing.contains(why, "wgmma tiles")
  pl, why = plan.build(c, hw.builtin(80), space, nil, nil, true)
  assert(pl == nil, "sm_80")
  testing.contains(why, "wgmma tiles")
end)

T.test("one step per branch, each with a fwd kernel of the branch's specialization", function()
  local c = config { dilations = { 1, 2, 1 } }
  local pl = assert(plan.build(c, hw.builtin(90)))
  assert(#pl.steps == 3, "steps")
  for i, s in ipairs(pl.steps) do
    local v = pl.variants[s.kernel]
    assert(s.branch == i - 1, "branch index is 0-based and in order")
    assert(v.kind == "fwd" and v.head_dim == 128 and v.dtype == "bf16" and v.causal,
           "variant specialization")
    assert(v.dilated == (c.dilations[i] > 1), "dilated flag of branch " .. i)
  end
  assert(pl.variants[pl.init_kernel].name == "rda_init", "init kernel")
  assert(pl.variants[pl.cast_kernel].name == "rda_cast_bf16", "cast kernel")
end)

T.test("every plan has one ring pack and one ring add kernel, whatever the dtype", function()
  for _, dtype in ipairs { "bf16", "fp16" } do
    for _, bwd in ipairs { false, true } do
      local pl = assert(plan.build(config { dtype = dtype }, hw.builtin(80), nil,
                                   bwd and plan.BWD_STAND_IN or nil, bwd))
      local pk, ad = pl.variants[pl.ring_pack_kernel], pl.variants[pl.ring_add_kernel]
      assert(pk and pk.name == "rda_ring_pack" and pk.kind == "ring_pack", "ring pack kernel")
      assert(ad and ad.name == "rda_ring_add" and ad.kind == "ring_add", "ring add kernel")
      for _, v in ipairs { pk, ad } do
        assert(v.threads == emit.SMALL_THREADS and v.smem_bytes == 0 and v.block_m == 0
               and v.block_n == 0, v.name .. " launch shape")
      end
      assert(pl.ring_pack_kernel > pl.cast_kernel and pl.ring_add_kernel > pl.cast_kernel,
             "ring kernels come after cast")
      local n = 0
      for _, v in ipairs(pl.variants) do
        if v.kind == "ring_pack" or v.kind == "ring_add" then n = n + 1 end
      end
      assert(n == 2, "two ring kernels, got " .. n)
    end
  end
end)

T.test("variants are deduplicated by name", function()
  local pl = assert(plan.build(config { segments = { 4096, 8192, 16384 },
                                        dilations = { 2, 4, 8 } }, hw.builtin(90)))
  assert(#pl.variants == 6, "one fwd variant, its kv-table twin, init, cast, ring pack and "
                            .. "ring add, got " .. #pl.variants)
  assert(pl.steps[1].kernel == pl.steps[2].kernel and pl.steps[2].kernel == pl.steps[3].kernel,
         "steps share the variant")
  assert(pl.steps[1].ring_kernel == pl.steps[2].ring_kernel
         and pl.steps[2].ring_kernel == pl.steps[3].ring_kernel, "steps share the twin")
  local kt = pl.variants[pl.steps[1].ring_kernel]
  assert(kt.kv_table and kt.name == pl.variants[pl.steps[1].kernel].name .. "_kt", kt.name)
end)

T.test("only dilated branches of several offsets get a kv-table twin", function()
  local pl = assert(plan.build(config { segments = { 4096, 8192 }, dilations = { 1, 4 } },
                               hw.builtin(90)))
  assert(pl.steps[1].ring_kernel == nil, "r = 1: one class, no twin")
  assert(pl.steps[2].ring_kernel, "r = 4: a twin")
  pl = assert(plan.build(config { segments = { 4096, 8192 }, dilations = { 2, 4 },
                                  offsets = "group" }, hw.builtin(90)))
  assert(pl.steps[1].ring_kernel == nil and pl.steps[2].ring_kernel == nil,
         "group offsets: one class per branch, no twin")
  local names = {}
  for _, v in ipairs(pl.variants) do
    assert(not names[v.name], "duplicate " .. v.name)
    names[v.name] = true
  end
end)

T.test("names are deterministic", function()
  local a = assert(plan.build(config(), hw.builtin(80)))
  local b = assert(plan.build(config(), hw.builtin(80)))
  assert(#a.variants == #b.variants, "variant count")
  for i = 1, #a.variants do
    assert(a.variants[i].name == b.variants[i].name, "name " .. i)
    assert(a.variants[i].source == b.variants[i].source, "source " .. i)
  end
end)

T.test("group steps cover each head exactly once", function()
  for heads = 3, 19 do
    for k = 1, math.min(heads, 7) do
      local segs, dils = {}, {}
      for i = 1, k do segs[i], dils[i] = 64 * i, i end
      local pl = assert(plan.build(config { heads = heads, kv_heads = 1, offsets = "group",
                                            segments = segs, dilations = dils },
                                   hw.builtin(90)))
      local seen = {}
      for _, s in ipairs(pl.steps) do
        assert(s.nheads >= 1, "empty group")
        for h = s.head0, s.head0 + s.nheads - 1 do
          assert(not seen[h], string.format("head %d twice (H=%d, k=%d)", h, heads, k))
          seen[h] = s.branch
        end
      end
      for h = 0, heads - 1 do
        assert(seen[h], string.format("head %d uncovered (H=%d, k=%d)", h, heads, k))
      end
      -- contiguous, in branch order, the first H mod k groups one head larger
      for i, s in ipairs(pl.steps) do
        local want = heads // k + ((i - 1) < heads % k and 1 or 0)
        assert(s.nheads == want, string.format("group %d holds %d, want %d", i, s.nheads, want))
      end
    end
  end
end)

T.test("mod and block steps run every head", function()
  for _, offsets in ipairs { "mod", "block" } do
    local pl = assert(plan.build(config { offsets = offsets }, hw.builtin(90)))
    for _, s in ipairs(pl.steps) do
      assert(s.head0 == 0 and s.nheads == 16, offsets .. " step covers all heads")
    end
  end
end)

T.test("small grids pick small tiles", function()
  local p = hw.builtin(90)
  local pl = assert(plan.build(config { segments = { 64, 512, 8192 },
                                        dilations = { 1, 8, 1 } }, p))
  assert(pl.variants[pl.steps[1].kernel].block_m <= 64, "w = 64, r = 1: 64 grid rows")
  assert(pl.variants[pl.steps[2].kernel].block_m <= 64, "w = 512, r = 8: 64 grid rows")
  assert(pl.variants[pl.steps[3].kernel].block_m == 128, "w = 8192: the best (large) tile")
  local big = assert(plan.build(config { segments = { 130 }, dilations = { 2 } }, p))
  assert(big.variants[big.steps[1].kernel].block_m == 128, "ceil(130/2) = 65 rows > 64")
end)

T.test("head_dim 256 gets a smaller tile where shared memory is scarce", function()
  local c = config { head_dim = 256, segments = { 8192 }, dilations = { 1 } }
  local on90 = assert(plan.build(c, hw.builtin(90))).variants[1]
  local on86 = assert(plan.build(c, hw.builtin(86))).variants[1]
  assert(on90.smem_bytes > on86.smem_bytes, "sm_86 has less shared memory than sm_90")
  assert(on86.smem_bytes <= 101376, "fits sm_86")
end)

-- gen/hw.lua's spills: tiles ptxas spills on a target are passed over where another fits.
T.test("tiles ptxas spills on a target are passed over there, and only there", function()
  local space = assert(plan.load_space(native.home()))
  local function tiles(arch, over)
    local c = config(over)
    local pl = assert(plan.build(c, hw.builtin(arch), space))
    local out = {}
    for i, s in ipairs(pl.steps) do
      local v = pl.variants[s.kernel]
      out[i] = v.tile
      if s.ring_kernel then assert(pl.variants[s.ring_kernel].tile == v.tile, "twin's tile") end
    end
    return out
  end
  -- Branches: large dense, large dilated, small dense (64 rows), small dilated (64 rows).
  local shape = { segments = { 8192, 8192, 64, 128 }, dilations = { 1, 2, 1, 2 } }
  local function with(over)
    local c = {}
    for k, v in pairs(shape) do c[k] = v end
    for k, v in pairs(over) do c[k] = v end
    return c
  end
  for _, arch in ipairs { 100, 103, 120, 121 } do
    local t = tiles(arch, with { head_dim = 128 })
    assert(t[2] == "bm64_bn32_w4_s2" and t[4] == "bm64_bn32_w4_s2", "d128 dilated, sm_" .. arch)
    assert(t[1] == "bm128_bn64_w8_s2" and t[3] == "bm64_bn64_w4_s2", "d128 dense, sm_" .. arch)
    t = tiles(arch, with { head_dim = 128, causal = false })
    assert(t[2] == (arch < 120 and "bm64_bn32_w4_s2" or "bm128_bn64_w8_s2"),
           "d128 dilated full, sm_" .. arch)
    t = tiles(arch, with { head_dim = 64, causal = false })
    assert(t[2] == (arch < 120 and "bm128_bn128_w8_s2" or "bm64_bn64_w4_s2")
           and t[4] == "bm64_bn64_w4_s2", "d64 dilated full, sm_" .. arch)
    t = tiles(arch, with { head_dim = 64 })
    assert(t[2] == (arch < 120 and "bm64_bn64_w4_s2" or "bm128_bn128_w8_s2")
           and t[4] == "bm64_bn64_w4_s2", "d64 dilated causal, sm_" .. arch)
    t = tiles(arch, with { head_dim = 256 })
    assert(t[2] == (arch == 100 and "bm64_bn64_w4_s2" or "bm64_bn32_w4_s2"),
           "d256 dilated causal, sm_" .. arch)
  end
  for _, arch in ipairs { 86, 87, 89 } do
    local t = tiles(arch, with { head_dim = 128 })
    assert(t[1] == "bm128_bn64_w8_s2" and t[2] == "bm128_bn64_w8_s2", "large, sm_" .. arch)
    assert(t[3] == "bm64_bn32_w4_s2", "small dense causal, sm_" .. arch)
    assert(t[4] == "bm64_bn64_w4_s2", "small dilated, sm_" .. arch)
    assert(tiles(arch, with { head_dim = 128, causal = false })[3] == "bm64_bn64_w4_s2",
           "small dense full, sm_" .. arch)
  end
  -- sm_80 and sm_90 have no such tiles: the first that fits, small grids preferring 64 rows.
  for _, arch in ipairs { 80, 90 } do
    for _, d in ipairs { 64, 128 } do
      local t = tiles(arch, with { head_dim = d })
      assert(t[1] == t[2] and t[3] == t[4] and t[1]:find("^bm128_") and t[3]:find("^bm64_"),
             "d" .. d .. " on sm_" .. arch)
    end
  end
  local t = tiles(87, with { head_dim = 256 })
  assert(t[1] == "bm64_bn32_w4_s2" and t[2] == "bm64_bn64_w4_s2", "sm_87 d256")
  -- The backward: sm_103's dense d = 32 dK/dV, of the branches not causal only.
  local bspace = assert(plan.load_bwd_space(native.home()))
  for _, causal in ipairs { false, true } do
    local c = config(with { head_dim = 32, causal = causal })
    for _, arch in ipairs { 100, 103 } do
      local pl = assert(plan.build(c, hw.builtin(arch), space, bspace, true))
      for i, s in ipairs(pl.bwd_steps) do
        local want = (arch == 103 and not causal and i % 2 == 1) and "bn32_bm32_w2_s2_x1"
                     or "bn64_bm64_w4_s2_x1"
        assert(pl.variants[s.dkdv_kernel].tile == want, "d32 dK/dV, sm_" .. arch)
        assert(pl.variants[s.dkdv_atomic_kernel].tile == "bn64_bm64_w4_s2_x1", "atomic")
      end
    end
  end
  -- Where only such tiles fit, the plan still takes one.
  local only = { [128] = { { block_m = 64, block_n = 64, warps = 4, stages = 2 } } }
  local pl = assert(plan.build(config(with { head_dim = 128 }), hw.builtin(100), only))
  assert(pl.variants[pl.steps[2].kernel].tile == "bm64_bn64_w4_s2", "the spilling tile")
end)

T.test("a plan that cannot fit names why", function()
  local p = assert(hw.builtin(90))
  p.smem_per_block = 16384
  local pl, why = plan.build(config(), p)
  assert(pl == nil, "nothing fits 16 KiB")
  testing.contains(why, "head_dim = 128")
  testing.contains(why, "shared memory")
  testing.contains(why, "16384")
end)

T.test("choose_tile honours the thread limit", function()
  local p = assert(hw.builtin(90))
  p.max_threads_per_sm = 128
  local t = assert(plan.choose_tile(plan.STAND_IN, 128, 8192, 1, p))
  assert(t.warps * 32 <= 128, "a 4-warp tile")
end)

T.test("fwd_smem follows the documented formula", function()
  assert(plan.fwd_smem(128, { block_m = 128, block_n = 64, stages = 2 }) == 98304, "d128")
  assert(plan.fwd_smem(64, { block_m = 64, block_n = 64, stages = 3 }) == 2 * 64 * (64 + 384),
         "d64")
end)

T.test("check_space rejects malformed spaces", function()
  assert(plan.check_space(plan.STAND_IN), "the stand-in is well-formed")
  local _, why = plan.check_space { [64] = {} }
  testing.contains(why, "non-empty")
  _, why = plan.check_space { [64] = { { block_m = 128, block_n = 64, warps = 4, stages = 2 } } }
  testing.contains(why, "16 * warps")
  _, why = plan.check_space { [64] = { { block_m = 64, block_n = 40, warps = 4, stages = 2 } } }
  testing.contains(why, "multiple of 16")
  _, why = plan.check_space { [64] = { { block_m = 64, block_n = 64, warps = 4 } } }
  testing.contains(why, "stages")
  _, why = plan.check_space { [96] = { { block_m = 64, block_n = 64, warps = 4, stages = 2,
                                         wgmma = true } } }
  testing.contains(why, "wgmma tile needs")
  _, why = plan.check_space { [64] = { { block_m = 32, block_n = 64, warps = 2, stages = 2,
                                         wgmma = true } } }
  testing.contains(why, "wgmma tile needs")
  _, why = plan.check_space { [64] = { { block_m = 64, block_n = 32, warps = 4, stages = 2,
                                         wgmma = true } } }
  testing.contains(why, "wgmma tile needs")
  _, why = plan.check_space { [64] = { { block_m = 64, block_n = 64, warps = 4, stages = 2,
                                         wgmma = 1 } } }
  testing.contains(why, "boolean")
  -- overlap: a boolean, on wgmma tiles of at least 3 stages (a tile's V stays in use for one
  -- more step than the tiles loaded ahead).
  local function ov(over)
    local t = { block_m = 64, block_n = 64, warps = 4, stages = 3, wgmma = true, overlap = true }
    for k, v in pairs(over) do t[k] = v end
    return { [64] = { t } }
  end
  assert(plan.check_space(ov {}), "a good overlap tile")
  _, why = plan.check_space(ov { overlap = "yes" })
  testing.contains(why, "overlap must be a boolean")
  _, why = plan.check_space(ov { stages = 2 })
  testing.contains(why, "bm64_bn64_w4_s2_wgo: an overlap tile needs wgmma = true and stages >= 3")
  _, why = plan.check_space(ov { wgmma = false })
  testing.contains(why, "an overlap tile needs wgmma = true")
  assert(plan.check_space(ov { overlap = false, stages = 2 }), "overlap = false: a plain tile")
end)

T.test("load_space uses the stand-in when there is no tuning file", function()
  local space, origin = plan.load_space("/nonexistent-rda-home")
  assert(space == plan.STAND_IN and origin == "built-in stand-in", "stand-in")
end)

T.test("a space without the head_dim is an error, not a crash", function()
  local pl, why = plan.build(config(), hw.builtin(90), { [64] = plan.STAND_IN[64] })
  assert(pl == nil, "no tiles for 128")
  testing.contains(why, "head_dim = 128")
end)

T.test("build rejects configs that skipped validation", function()
  testing.contains(testing.raises(plan.build, config { dtype = "fp32" }, hw.builtin(90)), "dtype")
  testing.contains(testing.raises(plan.build, config { dilations = { 1 } }, hw.builtin(90)),
                   "equal length")
end)

-- Backward planning (plan.add_backward through build's fourth argument).

T.test("backward: every variant fits every target, one step per branch", function()
  local tuned, origin = plan.load_bwd_space(native.home(), native.source)
  assert(tuned and origin:find("tuning/bwd_space.lua", 1, true), "the tuning file is used")
  local stand_in, o2 = plan.load_bwd_space("/nonexistent-rda-home")
  assert(stand_in == plan.BWD_STAND_IN and o2 == "built-in stand-in", "stand-in without a file")
  for _, space in ipairs { plan.BWD_STAND_IN, tuned } do
    each_target(function(p)
      for _, c in ipairs(matrix()) do
        local pl = assert(plan.build(c, p, nil, space))
        assert(#pl.bwd_steps == #c.segments, "one backward step per branch")
        assert(pl.variants[pl.bwd_prep_kernel].kind == "bwd_prep", "prep kernel")
        for i, st in ipairs(pl.bwd_steps) do
          local dk, dq = pl.variants[st.dkdv_kernel], pl.variants[st.dq_kernel]
          assert(dk.kind == "bwd_dkdv" and dq.kind == "bwd_dq", "kinds")
          assert(dk.dilated == (c.dilations[i] > 1) and dq.dilated == dk.dilated, "dilated")
          assert(dk.block_n == 16 * dk.warps and dq.block_m == 16 * dq.warps, "16 rows per warp")
          assert(st.dsplit == dk.dsplit and c.head_dim % (16 * dk.dsplit) == 0, "dsplit")
          for _, v in ipairs { dk, dq } do
            assert(v.smem_bytes == plan.bwd_smem(v.kind:sub(5), c.head_dim, v), v.name .. " smem")
            assert(v.smem_bytes <= p.smem_per_block, v.name .. " fits " .. p.name)
            assert(v.threads == 32 * v.warps, v.name .. " threads")
          end
          local h0, nh = plan.branch_heads(c, i - 1)
          assert(st.branch == i - 1 and st.head0 == h0 and st.nheads == nh, "heads")
          -- The ring twins: exactly where the forward has one, the base's tile and smem.
          local fs = pl.steps[i]
          assert((st.dkdv_ring_kernel ~= nil) == (fs.ring_kernel ~= nil)
                 and (st.dq_ring_kernel ~= nil) == (fs.ring_kernel ~= nil), "twins as forward")
          for base, kt in pairs { [dk] = st.dkdv_ring_kernel, [dq] = st.dq_ring_kernel } do
            if kt then
              local t = pl.variants[kt]
              assert(t.kv_table and t.name == base.name .. "_kt", t.name)
              assert(t.kind == base.kind and t.smem_bytes == base.smem_bytes
                     and t.threads == base.threads and t.block_m == base.block_m
                     and t.block_n == base.block_n, t.name .. " tile")
            end
          end
        end
      end
    end)
  end
end)

T.test("backward: wgmma dK/dV and dq tiles serve sm_90 alone, and only when asked", function()
  local space = assert(plan.load_bwd_space(native.home(), native.source))
  each_target(function(p)
    for _, flag in ipairs { false, true } do
      for _, c in ipairs(matrix()) do
        local pl = assert(plan.build(c, p, nil, space, true, flag))
        local want = flag and p.arch == 90 and (c.head_dim == 64 or c.head_dim == 128)
        for _, v in ipairs(pl.variants) do
          if v.kind == "bwd_dq" or (v.kind == "bwd_dkdv" and not v.dq_atomic) then
            local steps = v.kind == "bwd_dq" and v.block_n or v.block_m
            assert((v.wgmma == true) == (want == true), v.name .. " wgmma on " .. p.name)
            assert((v.name:find("_wg", 1, true) ~= nil) == (want == true), v.name .. " name")
            if v.wgmma then
              assert((steps == 64 or steps == 128) and v.warps % 4 == 0, v.name)
              assert(v.kind == "bwd_dq" or v.dsplit == 1, v.name .. " dsplit")
              assert(v.smem_bytes == plan.bwd_smem(v.kind:sub(5), c.head_dim, v)
                     and v.smem_bytes <= p.smem_per_block, v.name .. " smem")
            end
          elseif v.kind == "bwd_dkdv" then
            -- The atomic dQ variant stays on mma.sync, with the space's first mma.sync tile.
            assert(not v.wgmma and not v.name:find("_wg", 1, true), v.name .. " atomic dK/dV")
          end
        end
        if want then
          local plain = assert(plan.build(c, p, nil, space, true, false))
          for i, st in ipairs(pl.bwd_steps) do
            local a = st.dkdv_atomic_kernel and pl.variants[st.dkdv_atomic_kernel]
            if a then
              local pa = plain.variants[plain.bwd_steps[i].dkdv_atomic_kernel]
              assert(a.block_n == pa.block_n and a.block_m == pa.block_m and a.warps == pa.warps
                     and a.threads == 32 * a.warps, a.name .. " tile as without wgmma")
            end
          end
        end
      end
    end
  end)
end)

T.test("backward: a forward-only build plans no backward kernel", function()
  local pl = assert(plan.build(config(), hw.builtin(90)))
  assert(pl.bwd_steps == nil and pl.bwd_prep_kernel == nil, "no backward fields")
  for _, v in ipairs(pl.variants) do assert(not v.kind:find("bwd"), v.name) end
end)

T.test("backward: ring twins only for dilated branches of several offsets", function()
  local pl = assert(plan.build(config { segments = { 4096, 8192 }, dilations = { 1, 4 } },
                               hw.builtin(90), nil, plan.BWD_STAND_IN))
  local st = pl.bwd_steps
  assert(st[1].dkdv_ring_kernel == nil and st[1].dq_ring_kernel == nil, "r = 1: no twin")
  assert(st[2].dkdv_ring_kernel and st[2].dq_ring_kernel, "r = 4: twins")
  assert(pl.variants[st[2].dkdv_ring_kernel].name == pl.variants[st[2].dkdv_kernel].name .. "_kt")
  assert(pl.variants[st[2].dq_ring_kernel].name == pl.variants[st[2].dq_kernel].name .. "_kt")
  pl = assert(plan.build(config { segments = { 4096, 8192 }, dilations = { 2, 4 },
                                  offsets = "group" }, hw.builtin(90), nil, plan.BWD_STAND_IN))
  for _, s in ipairs(pl.bwd_steps) do
    assert(s.dkdv_ring_kernel == nil and s.dq_ring_kernel == nil, "group offsets: no twin")
  end
end)

T.test("backward: variants are shared by branches of the same kind", function()
  local c = config { segments = { 64, 128, 256, 512 }, dilations = { 1, 1, 2, 4 } }
  local pl = assert(plan.build(c, hw.builtin(90), nil, plan.BWD_STAND_IN))
  local st = pl.bwd_steps
  assert(st[1].dkdv_kernel == st[2].dkdv_kernel and st[3].dq_kernel == st[4].dq_kernel, "shared")
  assert(st[1].dkdv_kernel ~= st[3].dkdv_kernel, "dense and dilated differ")
  assert(st[3].dkdv_ring_kernel == st[4].dkdv_ring_kernel
         and st[3].dq_ring_kernel == st[4].dq_ring_kernel, "twins shared")
end)

T.test("backward: atomic-dQ variants only when asked, and never with dsplit > 1", function()
  for _, d in ipairs { 64, 128, 256 } do
    local c = config { head_dim = d }
    local pl = assert(plan.build(c, hw.builtin(90), nil, plan.BWD_STAND_IN, true))
    for _, st in ipairs(pl.bwd_steps) do
      if st.dsplit > 1 then
        assert(st.dkdv_atomic_kernel == nil, "no atomic variant at dsplit > 1")
      else
        local a = pl.variants[st.dkdv_atomic_kernel]
        assert(a and a.kind == "bwd_dkdv" and a.dq_atomic and a.dsplit == 1, "atomic variant")
        assert(a.name:sub(-3) == "_qa", a.name)
        assert(a.smem_bytes == plan.bwd_smem("dkdv", d, a), "smem with the dS tile")
        assert(a.smem_bytes == pl.variants[st.dkdv_kernel].smem_bytes + 2 * a.block_n * a.block_m,
               "the dS^T staging tile")
      end
    end
    pl = assert(plan.build(c, hw.builtin(90), nil, plan.BWD_STAND_IN))
    for _, st in ipairs(pl.bwd_steps) do assert(st.dkdv_atomic_kernel == nil, "not asked") end
  end
end)

T.test("backward: wgmma-only dK/dV tiles leave the atomic mode without its variant", function()
  local space = {
    [64] = { dkdv = { { block_n = 64, block_m = 64, warps = 4, stages = 2, dsplit = 1,
                        wgmma = true } },
             dq = { { block_m = 64, block_n = 64, warps = 4, stages = 2 } } },
  }
  assert(plan.check_bwd_space(space))
  local pl = assert(plan.build(config { head_dim = 64 }, hw.builtin(90), nil, space, true, true))
  for _, st in ipairs(pl.bwd_steps) do
    assert(st.dkdv_atomic_kernel == nil, "no mma.sync tile: no atomic variant")
    assert(pl.variants[st.dkdv_kernel].wgmma, "the wgmma dK/dV still planned")
  end
  -- Without wgmma the same space has no dK/dV tile at all: one clear reason.
  local ok, why = plan.build(config { head_dim = 64 }, hw.builtin(90), nil, space, true, false)
  assert(not ok)
  testing.contains(why, "no backward dkdv tile for head_dim = 64")
end)

T.test("backward: smem follows the documented formulas", function()
  local dk = { block_n = 64, block_m = 32, stages = 2 }
  assert(plan.bwd_smem("dkdv", 128, dk) == 4 * 128 * 64 + 2 * (4 * 128 + 8) * 32, "dkdv")
  local dq = { block_m = 64, block_n = 32, stages = 2 }
  assert(plan.bwd_smem("dq", 128, dq) == 4 * 128 * 64 + 4 * 128 * 2 * 32, "dq")
end)

T.test("backward: a tile space that cannot fit names why", function()
  local c = config { head_dim = 256 }
  local pl = assert(plan.build(c, hw.builtin(90)))
  local p = assert(hw.builtin(90))
  p.smem_per_block = 16384
  local ok, why = plan.add_backward(pl, {}, c, p, plan.BWD_STAND_IN)
  assert(not ok, "nothing fits 16 KiB")
  testing.contains(why, "backward dkdv tile for head_dim = 256")
  testing.contains(why, "16384")
  ok, why = plan.add_backward(pl, {}, config { head_dim = 64 }, hw.builtin(90),
                              { [128] = plan.BWD_STAND_IN[128] })
  assert(not ok, "no entry for 64")
  testing.contains(why, "head_dim = 64")
end)

T.test("backward: check_bwd_space rejects malformed spaces", function()
  assert(plan.check_bwd_space(plan.BWD_STAND_IN), "the stand-in is well-formed")
  local good = { block_n = 32, block_m = 32, warps = 2, stages = 2, dsplit = 1 }
  local function with(over)
    local t = {}
    for k, v in pairs(good) do t[k] = v end
    for k, v in pairs(over) do t[k] = v end
    return { [64] = { dkdv = { t }, dq = { { block_m = 32, block_n = 32, warps = 2,
                                             stages = 2 } } } }
  end
  assert(plan.check_bwd_space(with {}), "good")
  local _, why = plan.check_bwd_space { [64] = { dkdv = {} } }
  testing.contains(why, "non-empty")
  _, why = plan.check_bwd_space(with { block_n = 64 })
  testing.contains(why, "16 * warps")
  _, why = plan.check_bwd_space(with { block_m = 24 })
  testing.contains(why, "multiple of 16")
  _, why = plan.check_bwd_space(with { dsplit = 3 })
  testing.contains(why, "dsplit")
  _, why = plan.check_bwd_space(with { stages = 1 })
  testing.contains(why, "stages")
  -- wgmma: dq tiles of head_dim and block_n 64 / 128 and whole warpgroups only.
  local function dq_with(d, over)
    local t = { block_m = 64, block_n = 64, warps = 4, stages = 2, wgmma = true }
    for k, v in pairs(over) do t[k] = v end
    return { [d] = { dkdv = { good }, dq = { t } } }
  end
  assert(plan.check_bwd_space(dq_with(64, {})), "a good wgmma dq tile")
  assert(plan.check_bwd_space(dq_with(128, { block_m = 128, block_n = 128, warps = 8 })), "d128")
  _, why = plan.check_bwd_space(dq_with(96, {}))
  testing.contains(why, "wgmma tile needs")
  _, why = plan.check_bwd_space(dq_with(64, { block_n = 32 }))
  testing.contains(why, "wgmma tile needs")
  _, why = plan.check_bwd_space(dq_with(64, { block_m = 32, warps = 2 }))
  testing.contains(why, "wgmma tile needs")
  _, why = plan.check_bwd_space(dq_with(64, { wgmma = 1 }))
  testing.contains(why, "wgmma must be a boolean")
  -- dK/dV: head_dim and block_m 64 / 128, whole warpgroups, dsplit 1.
  local wk = { block_n = 64, block_m = 64, warps = 4, wgmma = true }
  assert(plan.check_bwd_space(with(wk)), "a good wgmma dkdv tile")
  assert(plan.check_bwd_space(with { block_n = 128, block_m = 64, warps = 8, wgmma = true }),
         "two warpgroups")
  _, why = plan.check_bwd_space(with { wgmma = true })
  testing.contains(why, "wgmma tile needs head_dim 64 or 128, block_m 64, warps 4 or 8")
  for _, bad in ipairs { { block_n = 64, block_m = 32, warps = 4 },
                         { block_n = 128, block_m = 128, warps = 8 },
                         { block_n = 192, block_m = 64, warps = 12 },
                         { block_n = 64, block_m = 64, warps = 4, dsplit = 2 } } do
    bad.wgmma = true
    _, why = plan.check_bwd_space(with(bad))
    testing.contains(why, "wgmma tile needs")
  end
  local d96 = with(wk)
  d96[96], d96[64] = d96[64], nil
  _, why = plan.check_bwd_space(d96)
  testing.contains(why, "[96].dkdv[1]")
  -- overlap: dq wgmma tiles of at least 3 stages only.
  assert(plan.check_bwd_space(dq_with(64, { stages = 3, overlap = true })), "a dq overlap tile")
  _, why = plan.check_bwd_space(dq_with(64, { overlap = true }))
  testing.contains(why, "[64].dq[1] bm64_bn64_w4_s2_wgo: an overlap tile is a dq tile with wgmma "
                        .. "= true and stages >= 3")
  _, why = plan.check_bwd_space(dq_with(64, { stages = 3, overlap = true, wgmma = false }))
  testing.contains(why, "an overlap tile is a dq tile")
  _, why = plan.check_bwd_space(dq_with(64, { stages = 3, overlap = 1 }))
  testing.contains(why, "overlap must be a boolean")
  _, why = plan.check_bwd_space(with { block_n = 64, block_m = 64, warps = 4, stages = 3,
                                       wgmma = true, overlap = true })
  testing.contains(why, "[64].dkdv[1]")
  testing.contains(why, "an overlap tile is a dq tile")
end)

T.run()
