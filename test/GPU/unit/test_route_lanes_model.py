"""A model of route-map=lanes (lib/Conversion/MoEToGPU/RouteLanes.cpp: routeLanesMapOf, the lanes' runs, the
groups' top-2 keys merged over a group's lanes, the ranking of the groups by shuffles, the masks, then
emitListTopk's selection as test_topk_list_model.py models it), step for step on Python ints and f32 (numpy),
checked against moe.route's definition (MoERoutingOps.td: the topk_group best groups by their top-2 sum or max,
ties to the lower group, NaN first; the top k of the kept experts' choice values, ties to the lower index) on
adversarial rows: every pick and index equal. It checks the selection on given choice values (score + bias), so
the scoring's ulps (ex2.approx/rcp.approx in the kernel) do not enter; the GPU check compares the weights with
torch. A change to the kernel's algorithm changes this model in the same commit.
"""
import math
import os
import random
import struct
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_topk_list_model import GONE, list_select, ordered_key  # noqa: E402

WARP = 32
LANE_EXPERTS, LANE_MAX = 32, 128


def pow2(v):
    return 1 << (max(1, v) - 1).bit_length()


def key_to_float(key):
    """keyToFloat: the f32 of a descending key."""
    bits = key ^ 0x7FFFFFFF if key < 0 else key
    return np.float32(struct.unpack("<f", struct.pack("<i", bits))[0])


def lanes_map(E, G, topk_group, k, vec, pad=None):
    """routeLanesMapOf: dict(width, per_lane, q, r, t, stride), or None (the warp kernel routes). ``pad``
    (padGroups; by default as the lowering passes it: past the warp kernel's 1024 experts): groups that neither
    split evenly over a power of two of lanes nor fit whole on one span q lanes of ceil(S / q) slots, the slots
    past a group's end empty (``stride``: a group's slots)."""
    pad = E > 1024 if pad is None else pad
    stride = E // G
    if G > 1:
        S = E // G
        # A group over q lanes where q divides S and the groups' lanes fit a warp, else whole groups a lane.
        q = next((q for q in (pow2(-(-S // LANE_EXPERTS)) >> i for i in range(6))
                  if q > 1 and S % q == 0 and q * pow2(G) <= WARP), 1)
        if q > 1:
            r, P, width = 1, S // q, q * pow2(G)
        else:
            r = max(1, LANE_EXPERTS // S)
            width = min(WARP, pow2(-(-G // r)))
            r = -(-G // width)
            P = r * S
        qp = min(pow2(-(-S // LANE_EXPERTS)), WARP // pow2(G))
        if pad and P > LANE_MAX and qp > 1:
            q, r, P = qp, 1, -(-S // qp)
            stride, width = q * P, q * pow2(G)
    else:
        q = r = 1
        width = max(8, pow2(-(-E // 40)))
        width = min(width, 1 << (max(1, E // vec).bit_length() - 1), WARP)
        P = -(-E // width)
        if E % vec == 0:
            P = -(-P // vec) * vec
    if P > LANE_MAX or width * P < E:
        return None
    lanes = min(width, -(-topk_group // r) * q) if G > 1 else width
    t = min(P, k, max(3, -(-k // lanes) + 3))
    return dict(width=width, per_lane=P, q=q, r=r, t=t, stride=stride)


def route_lanes(c, G, topk_group, k, top2, vec):
    """The kernel's picks [(key, index)] for one token's choice values c (f32), and its refills."""
    E = len(c)
    mp = lanes_map(E, G, topk_group, k, vec)
    W, P, q, r, t, stride = mp["width"], mp["per_lane"], mp["q"], mp["r"], mp["t"], mp["stride"]
    size = E // G

    def expert(v):                                       # position v of the lanes' layout -> its expert, or None
        if stride == size:
            return v if v < E else None
        g, o = divmod(v, stride)
        return g * size + o if o < size and g < G else None

    keys = [[ordered_key(float(c[expert(l * P + m)])) if expert(l * P + m) is not None else GONE
             for m in range(P)] for l in range(W)]
    if G > 1:
        S = stride
        H = W // q
        gkey = [[None] * r for _ in range(W)]
        for l in range(W):
            for i in range(r):
                t1 = t2 = GONE
                for m in range(i * S // q, min(P, (i + 1) * S // q)):
                    if top2:
                        t2 = max(t2, min(t1, keys[l][m]))
                    t1 = max(t1, keys[l][m])
                gkey[l][i] = [t1, t2]
        off = 1
        while off < q:                                   # butterflies over a group's q lanes
            nxt = [[list(v) for v in row] for row in gkey]
            for l in range(W):
                for i in range(r):
                    t1, t2 = gkey[l][i]
                    o1, o2 = gkey[l ^ off][i]
                    if top2:
                        nxt[l][i][1] = max(min(t1, o1), max(t2, o2))
                    nxt[l][i][0] = max(t1, o1)
            gkey, off = nxt, off * 2
        score = [[None] * r for _ in range(W)]
        for l in range(W):
            for i in range(r):
                t1, t2 = gkey[l][i]
                s = key_to_float(t1)
                if top2:
                    s = np.float32(s + key_to_float(t2))
                score[l][i] = ordered_key(float(s))
                if (l // q) * r + i >= G:                # a group past the last
                    score[l][i] = GONE
        for l in range(W):
            h = l // q
            before = [0] * r
            for i in range(r):
                for o in range(r):
                    if o != i and (score[l][o] > score[l][i] or (score[l][o] == score[l][i] and o < i)):
                        before[i] += 1
            for j in range(1, H):
                lower = (h ^ j) < h
                for o in range(r):
                    other = score[l ^ (j * q)][o]         # shuffleXor(groupKey[o], j * q)
                    for i in range(r):
                        if other > score[l][i] or (other == score[l][i] and lower):
                            before[i] += 1
            for m in range(P):
                if before[m * q // S] >= topk_group:
                    keys[l][m] = GONE
    picks, refills = list_select(keys, list(range(P)), [l * P for l in range(W)], k, t)
    for _, e in picks:                                   # the epilogue's shared-memory address of pick e
        assert e + e // P == (e // P) * (P + 1) + e % P
    return [(key, expert(v)) for key, v in picks], refills


def reference(c, G, topk_group, k, top2):
    """moe.route's selection on the choice values c."""
    E = len(c)
    S = E // G
    kept = set(range(E))
    if G > 1:
        scores = []
        for g in range(G):
            members = sorted(range(g * S, (g + 1) * S), key=lambda i: (-ordered_key(float(c[i])), i))
            s = np.float32(c[members[0]]) + np.float32(0.0)
            if top2:
                s = np.float32(key_to_float(ordered_key(float(c[members[0]])))
                               + key_to_float(ordered_key(float(c[members[1]]))))
            scores.append(ordered_key(float(s)))
        groups = sorted(range(G), key=lambda g: (-scores[g], g))[:topk_group]
        kept = {i for g in groups for i in range(g * S, (g + 1) * S)}
    order = sorted(kept, key=lambda i: (-ordered_key(float(c[i])), i))
    return [(ordered_key(float(c[i])), i) for i in order[:k]]


def rows(rng, E, G):
    f32 = lambda xs: np.array(xs, dtype=np.float32)
    sig = lambda x: 1.0 / (1.0 + math.exp(-x)) if x > -80 else 0.0
    bias = [rng.random() * 0.1 for _ in range(E)]
    yield f32([sig(rng.gauss(0, 1)) + b for b in bias])                   # DeepSeek-V3's sigmoid + bias
    yield f32([rng.gauss(0, 1) for _ in range(E)])
    yield f32([float(rng.randint(-2, 2)) for _ in range(E)])             # ties across lanes and groups
    yield f32([0.0] * E)                                                   # every value equal
    yield f32([-math.inf] * E)
    yield f32(sorted((rng.gauss(0, 1) for _ in range(E)), reverse=True))  # picks crowd the first lanes
    yield f32(sorted(rng.gauss(0, 1) for _ in range(E)))
    yield f32([rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0]) for _ in range(E)])
    yield f32([rng.gauss(0, 1) if rng.random() < 0.5 else -math.inf for _ in range(E)])
    one = [rng.gauss(0, 1) for _ in range(E)]
    g = rng.randrange(G)
    S = E // G
    for i in range(g * S, (g + 1) * S):
        one[i] = 9.0                                                       # one dominant group, all tied
    yield f32(one)
    nan = [rng.gauss(0, 1) for _ in range(E)]
    nan[rng.randrange(E)] = math.nan                                       # NaN: its group first, ranked first
    yield f32(nan)


# (E, n_group, topk_group, k, group_score top2): the models of MoERoutingOps.td and the shapes.
SHAPES = [(256, 8, 4, 8, True),       # DeepSeek-V3: one lane a group
          (384, 1, 1, 8, True),       # Kimi-K2
          (160, 1, 1, 8, True),       # GLM-4.5
          (160, 8, 3, 6, False),      # DeepSeek-V2: groups of 20
          (288, 1, 1, 32, True),
          (896, 1, 1, 16, True),
          (1024, 8, 4, 8, True),      # groups of 128 over 4 lanes
          (2048, 1, 1, 32, True),     # 64 experts a lane
          (2048, 64, 8, 8, True),     # two groups of 32 a lane
          (256, 4, 2, 8, True),       # groups of 64 over 2 lanes
          (512, 8, 4, 8, True),
          (64, 16, 4, 8, True),       # 8 groups of 4 a lane
          (192, 6, 3, 8, True),       # 6 groups on 8 lanes: two lanes past the last group
          (96, 3, 2, 4, False),
          (128, 1, 1, 8, True),
          (20, 1, 1, 4, True),        # gpt-oss-like
          (16, 1, 1, 1, True),
          (6, 1, 1, 6, True),
          (62, 2, 1, 5, True),
          (2048, 32, 4, 8, True),     # 32 groups of 64: a group a lane
          (4096, 64, 8, 16, True),    # 64 groups of 64: two a lane, 128 experts a lane
          (4096, 1, 1, 64, True),     # k = 64
          (3000, 1, 1, 64, False),
          (264, 8, 4, 8, True),       # groups of 33
          (1000, 10, 3, 8, True),     # groups of 100 over 2 lanes
          (100, 5, 4, 64, True),      # k = 64 of the 80 kept
          (2100, 3, 2, 8, True),      # groups of 700 over 8 lanes of 88 slots (704: 4 empty)
          (1026, 2, 1, 8, False),     # groups of 513 over 16 lanes of 33 (528)
          (1029, 7, 3, 16, True),     # groups of 147 over 4 lanes of 37 (148), a lane past the last group
          (3069, 3, 1, 64, True)]     # groups of 1023 over 8 lanes of 128 (1024), k = 64


@pytest.mark.parametrize("E,G,topk_group,k,top2", SHAPES)
@pytest.mark.parametrize("vec", [4, 8])
def test_picks_equal_the_definition(E, G, topk_group, k, top2, vec):
    rng = random.Random(E * 100 + G * 10 + vec)
    assert lanes_map(E, G, topk_group, k, vec) is not None
    for row in rows(rng, E, G):
        want = reference(row, G, topk_group, k, top2)
        got = route_lanes(row, G, topk_group, k, top2, vec)[0]
        assert got == want, (E, G, topk_group, k, top2, vec, list(row))


def test_mapping():
    m = lanes_map(256, 8, 4, 8, 4)                     # DeepSeek-V3: SGLang's 8 lanes, one group each
    assert (m["width"], m["per_lane"], m["q"], m["r"], m["t"]) == (8, 32, 1, 1, 5)
    assert lanes_map(384, 1, 1, 8, 4)["width"] == 16    # Kimi-K2: 24 a lane
    assert lanes_map(1024, 8, 4, 8, 4)["q"] == 4
    m = lanes_map(2048, 32, 4, 8, 4)                    # 32 groups of 64: a group a lane (2 lanes each: 64)
    assert (m["width"], m["per_lane"], m["q"], m["r"]) == (32, 64, 1, 1)
    m = lanes_map(4096, 64, 8, 16, 4)                   # 64 groups of 64: two a lane
    assert (m["width"], m["per_lane"], m["q"], m["r"]) == (32, 128, 1, 2)
    m = lanes_map(132, 2, 1, 4, 4)                      # groups of 66 over 2 lanes of 33
    assert (m["width"], m["per_lane"], m["q"]) == (4, 33, 2)
    assert lanes_map(264, 8, 4, 8, 4)["per_lane"] == 33  # groups of 33: whole on a lane
    assert lanes_map(4096, 1, 1, 64, 4)["per_lane"] == 128
    assert lanes_map(4095, 5, 2, 8, 4) is None          # groups of 819 over 4 lanes: 205 a lane
    m = lanes_map(2100, 3, 2, 8, 4)                     # groups of 700: over 8 lanes of 88 slots, 4 empty
    assert (m["width"], m["per_lane"], m["q"], m["stride"]) == (32, 88, 8, 704)
    assert lanes_map(2100, 3, 2, 8, 4, pad=False) is None
    assert lanes_map(1000, 8, 4, 8, 4)["stride"] == 125  # E <= 1024: no padding (the warp kernel takes the rest)
    assert lanes_map(4100, 1, 1, 8, 4) is None          # past 32 lanes of 128


def test_refills_on_deepseek_v3():
    """The refills a warp of 4 DeepSeek-V3 tokens makes (sass-budget-cases.mlir's outer-trips): sigmoid of
    Gaussian logits plus a bias in [0, 0.1)."""
    rng = random.Random(1)
    bias = [rng.random() * 0.1 for _ in range(256)]
    sig = lambda x: 1.0 / (1.0 + math.exp(-x))
    n = 400
    refills = sum(route_lanes(np.array([sig(rng.gauss(0, 1)) + b for b in bias], dtype=np.float32),
                              8, 4, 8, True, 4)[1] for _ in range(n))
    assert 4 * refills / n < 0.5, 4 * refills / n
