-- The default example: three LongNet branches, GQA, causal.
return {
  heads = 8, kv_heads = 2, head_dim = 64, dtype = "bf16",
  segments  = { 256, 512, 1024 },
  dilations = { 1,   2,   4    },
  offsets = "mod",
  causal = true,
}
