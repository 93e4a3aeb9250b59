-- rda tuning database: written by `rdagen tune` (gen/tuning.lua), read by every plan: the
-- user's ($RDA_TUNING_DB, else tuning.lua in the cache root) first, then the one shipped in
-- rda's tuning/db.lua. Entries come only from measurements by `rdagen tune` on their target
-- (a GPU for sm_<arch>, the CPU emulator for emu-sm_<arch>): never invented, never hand-edited.
-- A list of entries, one per key (target, kind, head_dim, dtype, causal, dilated, rows,
-- wgmma):
--   target      "sm_<arch>", or "emu-sm_<arch>" for the CPU emulator's plans
--   kind        "fwd", "bwd_dkdv" or "bwd_dq"
--   head_dim, dtype ("bf16" | "fp16"), causal, dilated (r > 1)
--   rows        the branch's grid rows ceil(w / r), rounded up to a power of two, at least 16
--   wgmma       whether the wgmma tiles were admitted (wgmma on, e.g. RDA_WGMMA=1, and an
--               sm_90 target; else false): a plan reads only the entry of its own wgmma state
--   candidates  { <gen/plan.lua tile name>, ... }: every tile the tuner tried, failed ones too
--   ranking     { { tile = <a candidate>, us = <median microseconds> }, ... }, fastest first
--   measured    { device, date ("YYYY-MM-DD"), rda (version), n, batch (the timed size) }
-- A plan skips an entry whose candidates miss a tile that fits and is allowed there now (the
-- space gained it after the tune); else it takes the first ranked tile that fits and is allowed.
return {
}
