-- The example of SPEC §3: LongNet branches with GQA (16 query heads over 4 kv heads), causal.
return {
  heads = 16, kv_heads = 4, head_dim = 128, dtype = "bf16",   -- kv_heads defaults to heads
  segments  = { 2048, 4096, 8192 },
  dilations = { 1,    2,    4    },
  offsets = "mod",          -- "mod" | "block" | "group"; default "mod"
  causal = true,            -- default false
  scale = nil,              -- default 1/sqrt(head_dim)
}
