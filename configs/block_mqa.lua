-- torchscale layout ("block" offsets) with multi-query attention (one kv head), head_dim 256,
-- a dilation that does not divide its segment, and a custom scale. Computed values are fine:
-- a config is a Lua chunk run in a sandbox.
local base = 100
return {
  heads = 4, kv_heads = 1, head_dim = 256, dtype = "bf16",
  segments  = { base, 3 * base },
  dilations = { 1,    4        },
  offsets = "block",
  causal = true,
  scale = 0.05,
}
