"""SPEC section 1 in float64, written from the spec's words alone (not from runtime/reference.c,
which the C tests use): a second, independent oracle for `rdagen run`.

`reading` picks how each easily misread sentence of section 1 is taken. SPEC is the spec's own
reading; check_spec.py also evaluates the wrong ones on the tool's outputs, to show that the
comparison can tell them apart (a check that no reading could fail would prove nothing)."""
import numpy as np

SPEC = {
    "keys": "multiset",     # "a key selected by two branches counts twice"
    "block": "ceil",        # block: offset = floor(h / ceil(H / r_i))
    "group": "branch",      # group: a head of group i has offset i mod r_i
    "grid": "segment",      # the grid "restarts at every segment"
    "kv_head": "divide",    # query head h reads key/value head h / (H / Hkv)
}
WRONG = {                   # one misreading of each, as earlier implementations made them
    "keys": "set",
    "block": "floor",
    "group": "head",
    "grid": "global",
    "kv_head": "modulo",
}


def head_branches(H, dilations, rule, reading):
    """Per query head h: the (branch i, offset j) pairs it uses."""
    k = len(dilations)
    if rule == "group":
        if H < k:
            raise ValueError("group offsets need at least as many heads as branches")
        sizes = [H // k + (1 if i < H % k else 0) for i in range(k)]
        group = [i for i, size in enumerate(sizes) for _ in range(size)]
        return [[(group[h], (group[h] if reading["group"] == "branch" else h)
                  % dilations[group[h]])] for h in range(H)]
    out = []
    for h in range(H):
        pairs = []
        for i, r in enumerate(dilations):
            if rule == "mod":
                j = h % r
            elif rule == "block":
                per = -(-H // r) if reading["block"] == "ceil" else max(1, H // r)
                j = h // per
            else:
                raise ValueError("unknown offset rule " + rule)
            pairs.append((i, j))
        out.append(pairs)
    return out


def grids(N, w_i, r, j, reading):
    """The branch's grids, one array of positions per segment [a, b)."""
    w = min(w_i, N)
    out = []
    for a in range(0, N, w):
        b = min(a + w, N)
        if reading["grid"] == "segment":
            first = a + j
        else:  # one dilation phase over the whole sequence
            first = a + (j - a) % r
        out.append(np.arange(first, b, r))
    return out


def pair_counts(N, pairs, cfg, reading):
    """C[p, q]: how many of the head's branches pair query p with key q."""
    C = np.zeros((N, N))
    for i, j in pairs:
        for g in grids(N, cfg["segments"][i], cfg["dilations"][i], j, reading):
            for p in g:
                keys = g[g <= p] if cfg["causal"] else g
                C[p, keys] += 1
    return np.minimum(C, 1) if reading["keys"] == "set" else C


def kv_head(h, H, Hkv, reading):
    return h // (H // Hkv) if reading["kv_head"] == "divide" else h % Hkv


def attention(Q, K, V, cfg, dO=None, dLSE=None, reading=SPEC):
    """O [B,N,H,D], LSE [B,H,N] and, with dO, dQ, dK, dV, for float64 inputs Q [B,N,H,D] and
    K, V [B,N,Hkv,D]. One softmax over the multiset union of the branches' keys, which is what
    the per-branch lse_i / o_i combined by log-sum-exp equal (branchwise() checks that)."""
    B, N, H, D = Q.shape
    Hkv = K.shape[2]
    tau = cfg["scale"]
    per_head = head_branches(H, cfg["dilations"], cfg["offsets"], reading)
    O = np.zeros((B, N, H, D))
    LSE = np.full((B, H, N), -np.inf)
    grads = [np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)] if dO is not None else None
    for h in range(H):
        C = pair_counts(N, per_head[h], cfg, reading)
        covered = C.sum(1) > 0
        hk = kv_head(h, H, Hkv, reading)
        for b in range(B):
            S = tau * Q[b, :, h] @ K[b, :, hk].T
            M = np.where(C > 0, S, -np.inf).max(1)
            M[~covered] = 0.0
            E = C * np.exp(np.where(C > 0, S, 0.0) - M[:, None])
            total = E.sum(1)
            LSE[b, h, covered] = M[covered] + np.log(total[covered])
            P = np.zeros_like(E)  # summed over the branches that pair p with q
            P[covered] = E[covered] / total[covered, None]
            O[b, :, h] = P @ V[b, :, hk]
            if dO is None:
                continue
            do = dO[b, :, h]
            Dp = (do * O[b, :, h]).sum(1)
            if dLSE is not None:
                Dp = Dp - np.where(covered, dLSE[b, h], 0.0)
            dS = P * (do @ V[b, :, hk].T - Dp[:, None])
            grads[0][b, :, h] += tau * dS @ K[b, :, hk]
            grads[1][b, :, hk] += tau * dS.T @ Q[b, :, h]
            grads[2][b, :, hk] += P.T @ do
    return (O, LSE) if dO is None else (O, LSE, *grads)


def branchwise(Q, K, V, cfg):
    """The forward exactly as section 1 writes it: per branch lse_i and o_i over each grid's
    keys, then LSE = logsumexp_i lse_i and O = sum_i exp(lse_i - LSE) o_i."""
    B, N, H, D = Q.shape
    Hkv = K.shape[2]
    tau = cfg["scale"]
    per_head = head_branches(H, cfg["dilations"], cfg["offsets"], SPEC)
    O = np.zeros((B, N, H, D))
    LSE = np.full((B, H, N), -np.inf)
    for b in range(B):
        for h in range(H):
            hk = kv_head(h, H, Hkv, SPEC)
            lses, outs = [], []
            for i, j in per_head[h]:
                lse_i, o_i = np.full(N, -np.inf), np.zeros((N, D))
                for g in grids(N, cfg["segments"][i], cfg["dilations"][i], j, SPEC):
                    for p in g:
                        keys = g[g <= p] if cfg["causal"] else g
                        s = tau * K[b, keys, hk] @ Q[b, p, h]
                        lse_i[p] = s.max() + np.log(np.exp(s - s.max()).sum())
                        o_i[p] = np.exp(s - lse_i[p]) @ V[b, keys, hk]
                lses.append(lse_i)
                outs.append(o_i)
            L = np.stack(lses)
            top = L.max(0)
            covered = np.isfinite(top)
            LSE[b, h, covered] = top[covered] + np.log(
                np.exp(L[:, covered] - top[covered]).sum(0))
            for lse_i, o_i in zip(lses, outs):
                weight = np.zeros(N)
                weight[covered] = np.exp(lse_i[covered] - LSE[b, h, covered])
                O[b, :, h] += weight[:, None] * o_i
    return O, LSE
