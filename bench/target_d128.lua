-- The issue-2 target: bf16, d = 128, one branch (8192, 1), non-causal (run with --n 65536).
return { heads = 16, head_dim = 128, dtype = "bf16", segments = { 8192 }, dilations = { 1 } }
