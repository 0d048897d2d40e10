"""A model of topk-rounds=list (lib/Conversion/MoEToGPU/TopkRenorm.cpp's listMappingOf, RegisterTopk.cpp's
emitListTopk, lib/Kernels/TopK.cpp's insertIntoTopList and ranksAfterPick), step for step on Python ints, checked
against a sort in the dialect's order: the argument that the kernel's lists, rounds, pops and refills select the
right elements, runnable without a GPU. A change to the kernel's algorithm changes this model in the same commit.
"""
import math
import random
import struct

import pytest

GONE = -2**31          # emptyListKey: below every number's key
IMAX = 2**31 - 1       # NaN's key; (IMAX, -1) is "no pick yet"


def ordered_key(x):
    """orderedKey: monotone i32 of an f32, -0 == +0, NaN on top."""
    if math.isnan(x):
        return IMAX
    b = struct.unpack("<i", struct.pack("<f", x + 0.0))[0]
    return b ^ 0x7FFFFFFF if b < 0 else b


def mapping(K, k, vec):
    """listMappingOf: (lanes per token, elements per lane, list length)."""
    p = 1 << (K - 1).bit_length()
    width = max(p // 32, min(8, max(4, p // 16)))
    width = min(width, 1 << (max(1, K // vec).bit_length() - 1), 32)
    per_lane = -(-K // (width * vec)) * vec
    t = min(per_lane, k, max(3, -(-k // width) + 3))
    return width, per_lane, t


def insert(keys, pos, x, xp):
    """insertIntoTopList: slot j = max(key_j, min(x, key_j-1)), positions by the strict compares."""
    above = [x > kj for kj in keys]
    nk, npos = list(keys), list(pos)
    for j in range(len(keys) - 1, 0, -1):
        nk[j] = max(keys[j], min(x, keys[j - 1]))
        npos[j] = pos[j - 1] if above[j - 1] else (xp if above[j] else pos[j])
    nk[0], npos[0] = max(keys[0], x), (xp if above[0] else pos[0])
    keys[:], pos[:] = nk, npos


def ranks_after_pick(key, pos, prev_key, prev_pos):
    return key < prev_key or (key == prev_key and pos > prev_pos)


def list_topk(row, k, vec):
    """[(key, index)] of the k picks in round order, and the number of refills (the warp leaving the rounds)."""
    K = len(row)
    width, n, t = mapping(K, k, vec)
    offsets = [m // vec * width * vec + m % vec for m in range(n)]        # RegisterRow{width, vec}
    bases = [lane * vec for lane in range(width)]
    keys = [[ordered_key(row[o + b]) if o + b < K else GONE for o in offsets] for b in bases]
    return list_select(keys, offsets, bases, k, t)


def list_select(keys, offsets, bases, k, t):
    """emitListTopk on one group of lanes: lane l holds keys[l][m] (GONE: none) of the element of index
    offsets[m] + bases[l]; lists of t. [(key, index)] of the k picks in round order, and the refills."""
    width, n = len(keys), len(offsets)
    refill = t < min(k, n)
    lanes = [dict(keys=[GONE] * t, pos=[0] * t, more=False, need=False, last_key=IMAX, last_pos=-1)
             for _ in range(width)]

    def fill(lane, filtered):
        s, fk, fp = lanes[lane], [GONE] * t, [0] * t
        for m in range(n):
            x = keys[lane][m]
            if filtered and not ranks_after_pick(x, offsets[m], s["last_key"], s["last_pos"]):
                x = GONE
            insert(fk, fp, x, offsets[m])
        return fk, fp

    for lane, s in enumerate(lanes):                      # the first fill: every element
        s["keys"], s["pos"] = fill(lane, False)
        s["more"] = refill and s["keys"][t - 1] != GONE
    picks, refills, r = [], 0, 0
    while r < k:                                          # the outer loop
        while True:                                       # the rounds: a do-while
            heads = [(s["keys"][0], s["pos"][0] + bases[lane]) for lane, s in enumerate(lanes)]
            best = max(h[0] for h in heads)
            assert best != GONE, "a round found no element"
            winner = min(h[1] if h[0] == best else IMAX for h in heads)
            for lane, s in enumerate(lanes):
                won = heads[lane][1] == winner
                emptied = s["keys"][1] == GONE if t > 1 else True
                if won:
                    s["keys"] = s["keys"][1:] + [GONE]
                    s["pos"] = s["pos"][1:] + s["pos"][-1:]
                if refill:
                    s["need"] = won and emptied and s["more"]
                    s["last_key"], s["last_pos"] = best, winner - bases[lane]
            picks.append((best, winner))
            r += 1
            if not (r < k and not any(s["need"] for s in lanes)):   # vote.sync any
                break
        if r < k:                                         # stopped for a refill
            for lane, s in enumerate(lanes):
                if s["need"]:
                    s["keys"], s["pos"] = fill(lane, True)
                    s["more"] = s["keys"][t - 1] != GONE
                s["need"] = False
            refills += 1
    return picks, refills


def reference(row, k):
    order = sorted(range(len(row)), key=lambda i: (-ordered_key(row[i]), i))
    return [(ordered_key(row[i]), i) for i in order[:k]]


def rows(rng, K):
    yield [rng.gauss(0, 1) for _ in range(K)]
    yield [float(rng.randint(-3, 3)) for _ in range(K)]                        # ties across lanes
    yield [-math.inf] * K                                                       # a masked row
    yield sorted((rng.gauss(0, 1) for _ in range(K)), reverse=True)             # picks crowd one lane
    yield sorted(rng.gauss(0, 1) for _ in range(K))
    yield [rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0]) for _ in range(K)]
    yield [rng.gauss(0, 1) if rng.random() < 0.5 else -math.inf for _ in range(K)]


@pytest.mark.parametrize("K", [1, 3, 7, 12, 16, 17, 60, 62, 64, 100, 128, 160, 256, 288, 384, 896, 1024])
@pytest.mark.parametrize("vec", [4, 8])
def test_picks_equal_the_sort(K, vec):
    rng = random.Random(K * 10 + vec)
    for k in sorted({min(K, k) for k in (1, 2, 3, 8, 20, 32, rng.randint(1, 32))}):   # 1 <= k <= K (verifier)
        for row in rows(rng, K):
            assert list_topk(row, k, vec)[0] == reference(row, k), (K, k, vec, row)


def test_refills_are_rare_on_gaussian_rows():
    rng = random.Random(0)
    for K in (64, 128, 256):
        tokens = [list_topk([rng.gauss(0, 1) for _ in range(K)], 8, 4)[1] for _ in range(400)]
        assert sum(1 for f in tokens if f) / len(tokens) < 0.1, K
    # A row sorted descending puts the best picks in lane 0's first runs: its list runs out and refills.
    assert list_topk(sorted((rng.gauss(0, 1) for _ in range(128)), reverse=True), 8, 4)[1] >= 1
