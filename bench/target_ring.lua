-- The issue-5 ring target (run with --n 262144 --ranks 8): bf16, d = 128, three LongNet branches,
-- the two long ones spanning ranks (each rank holds 32768 rows), so blocks move every pass.
return {
  heads = 16, head_dim = 128, dtype = "bf16",
  segments  = { 8192, 65536, 262144 },
  dilations = { 1,    8,     32     },
  causal = true,
}
