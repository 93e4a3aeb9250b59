-- bwd_space.lua — backward-kernel tile candidates per head dim, best first. The planner
-- (gen/plan.lua) takes the first of each list that fits the target's shared memory and that
-- ptxas does not spill there (gen/hw.lua).
-- dkdv: block_n = 16 * warps key rows per block, block_m query rows per step, `stages` Q/dO
--   tiles in flight, dsplit blocks per key tile (each accumulating head_dim / dsplit columns
--   of dK and dV, so d = 256 fits the registers); smem 4 d block_n + stages (4 d + 8) block_m,
--   the 8 block_m bytes of statistics rounded up to 1024 on wgmma tiles.
-- dq: block_m = 16 * warps query rows per block, block_n key rows per step, `stages` K/V
--   tiles in flight; smem 4 d block_m + 4 d stages block_n.
-- wgmma = true marks a tile of the sm_90a warpgroup-MMA path (head_dim and the step, block_m
--   of dkdv or block_n of dq, 64 or 128; whole warpgroups; dkdv: block_m 64, at most two
--   warpgroups, dsplit 1): taken only on
--   sm_90 with the path switched on (RDA_WGMMA=1), else skipped. dkdv's wgmma tiles keep a
--   warpgroup's 64 keys of dK and dV in registers (128 per thread at d = 128) beside S^T and
--   dP^T (block_m / 2 each), so they step 64 queries at a time: 128 spilled even at d = 64.
-- overlap = true (dq, wgmma, stages >= 3): a warpgroup computes key tile j's dS while the
--   tensor cores run tile j-1's dQ += dS K (templates/rda_bwd.cuh). Listed after the plain
--   wgmma tiles until a GPU has timed them: `rdagen tune --backward --wgmma` ranks both. (At
--   d = 64 the 64-row one spilled: its S and dP of 128 keys and the pending dS do not fit.)
return {
  [32] = {
    dkdv = { { block_n = 64, block_m = 64, warps = 4, stages = 2, dsplit = 1 },
             { block_n = 32, block_m = 32, warps = 2, stages = 2, dsplit = 1 } },
    dq = { { block_m = 64, block_n = 64, warps = 4, stages = 2 },
           { block_m = 32, block_n = 32, warps = 2, stages = 2 } },
  },
  [64] = {
    dkdv = { { block_n = 128, block_m = 64, warps = 8, stages = 2, dsplit = 1, wgmma = true },
             { block_n = 64, block_m = 64, warps = 4, stages = 2, dsplit = 1, wgmma = true },
             { block_n = 64, block_m = 64, warps = 4, stages = 2, dsplit = 1 },
             { block_n = 32, block_m = 32, warps = 2, stages = 2, dsplit = 1 } },
    dq = { { block_m = 128, block_n = 128, warps = 8, stages = 2, wgmma = true },
           { block_m = 64, block_n = 128, warps = 4, stages = 2, wgmma = true },
           { block_m = 128, block_n = 128, warps = 8, stages = 3, wgmma = true, overlap = true },
           { block_m = 64, block_n = 64, warps = 4, stages = 2 },
           { block_m = 32, block_n = 32, warps = 2, stages = 2 } },
  },
  [96] = {
    dkdv = { { block_n = 64, block_m = 32, warps = 4, stages = 2, dsplit = 1 },
             { block_n = 32, block_m = 32, warps = 2, stages = 2, dsplit = 1 } },
    dq = { { block_m = 64, block_n = 32, warps = 4, stages = 2 },
           { block_m = 32, block_n = 32, warps = 2, stages = 2 } },
  },
  [128] = {
    dkdv = { { block_n = 128, block_m = 64, warps = 8, stages = 2, dsplit = 1, wgmma = true },
             { block_n = 64, block_m = 64, warps = 4, stages = 2, dsplit = 1, wgmma = true },
             { block_n = 64, block_m = 32, warps = 4, stages = 2, dsplit = 1 },
             { block_n = 32, block_m = 32, warps = 2, stages = 2, dsplit = 1 } },
    dq = { { block_m = 128, block_n = 64, warps = 8, stages = 2, wgmma = true },
           { block_m = 64, block_n = 64, warps = 4, stages = 2, wgmma = true },
           { block_m = 128, block_n = 64, warps = 8, stages = 3, wgmma = true, overlap = true },
           { block_m = 64, block_n = 64, warps = 4, stages = 3, wgmma = true, overlap = true },
           { block_m = 64, block_n = 32, warps = 4, stages = 2 },
           { block_m = 32, block_n = 32, warps = 2, stages = 2 } },
  },
  [256] = {
    dkdv = { { block_n = 64, block_m = 16, warps = 4, stages = 2, dsplit = 2 },
             { block_n = 32, block_m = 16, warps = 2, stages = 2, dsplit = 2 } },
    dq = { { block_m = 64, block_n = 16, warps = 4, stages = 2 },
           { block_m = 32, block_n = 16, warps = 2, stages = 2 } },
  },
}
