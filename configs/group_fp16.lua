-- fkodom / DarcStar layout: heads split into one contiguous group per branch ("group"
-- offsets), fp16, head_dim 96, not causal.
return {
  heads = 6, head_dim = 96, dtype = "fp16",
  segments  = { 128, 256, 512 },
  dilations = { 1,   2,   4   },
  offsets = "group",
}
