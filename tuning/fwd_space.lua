-- fwd_space.lua — forward-kernel tile candidates per head dim, best first. The planner
-- (gen/plan.lua) takes the first that fits the target's shared memory (2 * head_dim *
-- (block_m + 2 * stages * block_n) bytes) and that ptxas does not spill there (gen/hw.lua);
-- block_m = 16 * warps (one warp per 16 query rows).
-- wgmma = true marks a tile of the sm_90a warpgroup-MMA path (head_dim and block_n 64 or 128,
-- whole warpgroups): taken only on sm_90 with the path switched on (RDA_WGMMA=1), else skipped.
-- overlap = true (wgmma, stages >= 3) marks its pipelined twin: a warpgroup computes tile j's
-- softmax while the tensor cores run tile j-1's P V product (templates/rda_fwd.cuh). Listed
-- after the plain wgmma tiles until a GPU has timed them: `rdagen tune --wgmma` ranks both.
return {
  [32] = {
    { block_m = 128, block_n = 128, warps = 8, stages = 2 },
    { block_m = 64, block_n = 128, warps = 4, stages = 2 },
  },
  [64] = {
    { block_m = 128, block_n = 128, warps = 8, stages = 2, wgmma = true },
    { block_m = 64, block_n = 128, warps = 4, stages = 2, wgmma = true },
    { block_m = 128, block_n = 128, warps = 8, stages = 3, wgmma = true, overlap = true },
    { block_m = 64, block_n = 128, warps = 4, stages = 3, wgmma = true, overlap = true },
    { block_m = 128, block_n = 128, warps = 8, stages = 2 },
    { block_m = 64, block_n = 128, warps = 4, stages = 2 },
    { block_m = 64, block_n = 64, warps = 4, stages = 2 },
  },
  [96] = {
    { block_m = 128, block_n = 64, warps = 8, stages = 2 },
    { block_m = 64, block_n = 64, warps = 4, stages = 2 },
  },
  [128] = {
    { block_m = 128, block_n = 128, warps = 8, stages = 2, wgmma = true },
    { block_m = 64, block_n = 128, warps = 4, stages = 2, wgmma = true },
    { block_m = 128, block_n = 128, warps = 8, stages = 3, wgmma = true, overlap = true },
    { block_m = 64, block_n = 128, warps = 4, stages = 3, wgmma = true, overlap = true },
    { block_m = 128, block_n = 64, warps = 8, stages = 2 },
    { block_m = 64, block_n = 64, warps = 4, stages = 2 },
    { block_m = 64, block_n = 32, warps = 4, stages = 2 },
  },
  [256] = {
    { block_m = 128, block_n = 64, warps = 8, stages = 2 },
    { block_m = 64, block_n = 64, warps = 4, stages = 2 },
    { block_m = 64, block_n = 32, warps = 4, stages = 2 },
  },
}
