"""`rdagen run` against spec_ref.py, SPEC section 1's function written from its words alone.

  python3 check_spec.py --rdagen PATH --work DIR

For every case: fresh normal inputs rounded to the config's dtype (SPEC section 5), written as
<f4 .npy; `rdagen run --backend emu` forward and backward, on one device, on 3 ranks and (where
N is a multiple of 4) on 2 zigzag ranks; every output against the float64 oracle under section
5's tolerances, uncovered rows exactly O = 0 and LSE = -inf, nothing else NaN or Inf.
Before that, the oracle checks itself: its one-softmax form against section 1's per-branch
form, and its gradients against central differences. After it, each misreading of section 1 in
spec_ref.WRONG must fail on the tool's outputs of the case that tells it apart, or the
comparison could not have caught that mistake. Exit 0 when all holds; 1 with what failed."""
import argparse
import math
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_ref  # noqa: E402

TOL = {"bf16": {"O": 1e-2, "LSE": 2e-2, "dQ": 2e-2, "dK": 2e-2, "dV": 2e-2},
       "fp16": {"O": 3e-3, "LSE": 5e-3, "dQ": 5e-3, "dK": 5e-3, "dV": 5e-3}}
NAMES = ("O", "LSE", "dQ", "dK", "dV")


def case(name, H, Hkv, D, dtype, segs, dils, offsets, causal, B, N, scale=None, tells=()):
    return dict(name=name, H=H, Hkv=Hkv, D=D, dtype=dtype, segments=segs, dilations=dils,
                offsets=offsets, causal=causal, B=B, N=N, scale=scale, tells=tells)


# Small shapes, one head dim: the emulator compiles each kernel shape once. `tells`: the
# misreadings (spec_ref.WRONG keys) that the case's outputs must reject.
CASES = [
    case("mod_gqa_causal_partial_segment", 4, 2, 32, "bf16", [16, 32], [1, 3], "mod", True,
         2, 40, tells=("grid", "kv_head")),
    case("block_ceil_dilation_not_dividing", 4, 1, 32, "fp16", [24, 48], [3, 5], "block", False,
         1, 48, scale=-0.3, tells=("block",)),
    case("group_three_heads_two_branches", 3, 3, 32, "bf16", [12, 24], [2, 3], "group", True,
         1, 36, tells=("group",)),
    case("duplicate_branch_counts_twice", 2, 1, 32, "fp16", [16, 16], [1, 1], "mod", False,
         1, 32, tells=("keys",)),
    case("sequence_shorter_than_segments", 2, 2, 32, "bf16", [32, 64], [2, 4], "mod", True,
         1, 20),
    # heads 3 and 4 have offsets 3 and 4 >= every segment's length (3, the last 2): empty
    # grids, no row covered; head 2's offset 2 misses the short last segment only
    case("empty_grids_uncovered_rows", 5, 1, 32, "fp16", [3], [5], "mod", False, 1, 17),
    case("one_row", 2, 1, 32, "bf16", [8], [1], "mod", True, 1, 1),
]


def bf16(x):
    """Round float32 to bfloat16 (nearest, ties to even), kept in float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def to_dtype(x, dtype):
    return bf16(x) if dtype == "bf16" else x.astype(np.float16).astype(np.float32)


def config_lua(c):
    scale = "" if c["scale"] is None else " scale = %r," % c["scale"]
    return ("return { heads = %d, kv_heads = %d, head_dim = %d, dtype = %r,\n"
            "  segments = { %s }, dilations = { %s }, offsets = %r, causal = %s,%s }\n" % (
                c["H"], c["Hkv"], c["D"], c["dtype"], ", ".join(map(str, c["segments"])),
                ", ".join(map(str, c["dilations"])), c["offsets"],
                "true" if c["causal"] else "false", scale))


def oracle_cfg(c):
    return dict(c, scale=c["scale"] if c["scale"] is not None else 1 / math.sqrt(c["D"]))


def compare(c, got, ref):
    """The section 5 failures of outputs `got` against `ref` (dicts by NAMES), as lines."""
    tol, bad = TOL[c["dtype"]], []
    covered = np.isfinite(ref["LSE"])  # [B, H, N]
    uncovered_rows = np.transpose(~covered, (0, 2, 1))  # [B, N, H]
    for k in NAMES:
        g, r = got[k], ref[k]
        if g.shape != r.shape:
            bad.append("%s: shape %s, expected %s" % (k, g.shape, r.shape))
            continue
        if k == "LSE":
            if not np.all(np.isneginf(g[~covered])):
                bad.append("LSE: an uncovered row is not exactly -inf")
            if not np.all(np.isfinite(g[covered])):
                bad.append("LSE: NaN or Inf in a covered row")
            err = np.abs(g[covered] - r[covered]).max() if covered.any() else 0.0
        else:
            if not np.all(np.isfinite(g)):
                bad.append("%s: NaN or Inf" % k)
                continue
            if k == "O" and not np.all(g[uncovered_rows] == 0):
                bad.append("O: an uncovered row is not exactly 0")
            norm = np.linalg.norm(r)
            err = np.linalg.norm(g - r) / norm if norm > 0 else np.linalg.norm(g)
        if not err <= tol[k]:
            bad.append("%s: error %.3g > tolerance %g" % (k, err, tol[k]))
    return bad


def run_case(c, seed, rdagen, work, env):
    """Runs the case on every layout; returns (failures, the one-device outputs, inputs)."""
    d = os.path.join(work, c["name"])
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "cfg.lua"), "w") as f:
        f.write(config_lua(c))
    rng = np.random.default_rng(seed)
    B, N, H, Hkv, D = c["B"], c["N"], c["H"], c["Hkv"], c["D"]
    x = {"q": (B, N, H, D), "k": (B, N, Hkv, D), "v": (B, N, Hkv, D), "do": (B, N, H, D)}
    x = {n: to_dtype(rng.standard_normal(shape).astype(np.float32), c["dtype"])
         for n, shape in x.items()}
    for n, a in x.items():
        np.save(os.path.join(d, n + ".npy"), a)
    f64 = {n: a.astype(np.float64) for n, a in x.items()}
    ref = dict(zip(NAMES, spec_ref.attention(f64["q"], f64["k"], f64["v"], oracle_cfg(c),
                                             dO=f64["do"])))
    layouts = [[]] + [["--ranks", "3"]] + ([["--ranks", "2", "--layout", "zigzag"]]
                                           if N % 4 == 0 else [])
    failures, single = [], None
    for extra in layouts:
        tag = "_".join(a.lstrip("-") for a in extra) or "one_device"
        out = {k: os.path.join(d, "%s_%s.npy" % (tag, k)) for k in NAMES}
        cmd = [rdagen, "run", os.path.join(d, "cfg.lua"), "--backend", "emu",
               "--o", out["O"], "--lse", out["LSE"], "--dq", out["dQ"], "--dk", out["dK"],
               "--dv", out["dV"]] + extra
        for n in ("q", "k", "v", "do"):
            cmd += ["--" + n, os.path.join(d, n + ".npy")]
        for path in out.values():  # an output rdagen failed to write must not be read stale
            if os.path.exists(path):
                os.unlink(path)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            failures.append("%s %s: rdagen exit %d: %s" % (c["name"], tag, p.returncode,
                                                          p.stderr.strip()))
            continue
        got = {k: np.load(out[k]).astype(np.float64) for k in NAMES}
        failures += ["%s %s: %s" % (c["name"], tag, why) for why in compare(c, got, ref)]
        if not extra:
            single = got
    return failures, single, f64


def self_check():
    """The oracle against itself: one-softmax form = per-branch form; gradients = central
    differences of sum(O * dO) + sum(LSE * dLSE) (covered rows). Returns failure lines."""
    rng = np.random.default_rng(1)
    failures = []
    for offsets, causal in (("mod", True), ("block", False), ("group", True)):
        cfg = dict(segments=[4, 6], dilations=[1, 2], offsets=offsets, causal=causal, scale=0.7)
        Q, dO = rng.standard_normal((1, 7, 2, 3)), rng.standard_normal((1, 7, 2, 3))
        K, V = rng.standard_normal((1, 7, 1, 3)), rng.standard_normal((1, 7, 1, 3))
        dLSE = rng.standard_normal((1, 2, 7))
        O, L, dQ, dK, dV = spec_ref.attention(Q, K, V, cfg, dO=dO, dLSE=dLSE)
        O2, L2 = spec_ref.branchwise(Q, K, V, cfg)
        covered = np.isfinite(L)
        if not (np.allclose(O, O2, atol=1e-12) and np.array_equal(covered, np.isfinite(L2))
                and np.allclose(L[covered], L2[covered], atol=1e-12)):
            failures.append("oracle %s: one softmax differs from the per-branch form" % offsets)

        def loss(qkv):
            o, lse = spec_ref.attention(*qkv, cfg)
            return (o * dO).sum() + (np.where(covered, lse, 0.0) * dLSE).sum()

        for which, (name, G) in enumerate((("dQ", dQ), ("dK", dK), ("dV", dV))):
            num = np.zeros_like(G)
            for idx in np.ndindex(G.shape):
                plus, minus = [Q.copy(), K.copy(), V.copy()], [Q.copy(), K.copy(), V.copy()]
                plus[which][idx] += 1e-6
                minus[which][idx] -= 1e-6
                num[idx] = (loss(plus) - loss(minus)) / 2e-6
            if np.abs(num - G).max() > 1e-6 * max(1.0, np.abs(G).max()):
                failures.append("oracle %s: %s differs from central differences" % (offsets, name))
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rdagen", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    env = dict(os.environ)
    seed = int(os.environ.get("RDA_TEST_SEED") or "0x5eed2026", 0)  # as the C tests take it
    failures = self_check()
    if failures:
        print("\n".join(failures))
        return 1
    print("oracle: one softmax = per-branch form; gradients = central differences")
    for n, c in enumerate(CASES):
        bad, single, f64 = run_case(c, seed + n, a.rdagen, a.work, env)
        failures += bad
        print("%-36s %s" % (c["name"], "ok" if not bad else "FAILED"))
        if single is None:
            continue
        for key in c["tells"]:
            reading = dict(spec_ref.SPEC, **{key: spec_ref.WRONG[key]})
            wrong = dict(zip(NAMES, spec_ref.attention(f64["q"], f64["k"], f64["v"],
                                                       oracle_cfg(c), dO=f64["do"],
                                                       reading=reading)))
            if not compare(c, single, wrong):
                failures.append("%s: the outputs also pass under the misreading %s = %s: "
                                "this check cannot tell them apart" % (c["name"], key,
                                                                       spec_ref.WRONG[key]))
            else:
                print("  rejects the misreading %s = %s" % (key, spec_ref.WRONG[key]))
    if failures:
        print("\nFAILED (RDA_TEST_SEED=%#x):\n%s" % (seed, "\n".join(failures)))
        return 1
    print("\nall %d cases match SPEC section 1 within section 5's tolerances" % len(CASES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
