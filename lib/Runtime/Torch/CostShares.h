//===- CostShares.h - Work dealt to threads in shares of equal cost -------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The CPU grouped GEMMs (ExpertOps.cpp) give each thread a share of the
// experts' work. Dealing whole experts leaves the threads as unequal as the
// routing: transformers' Mixtral at random weights routes 71, 92, 70, 72 rows
// to its first four experts and 215, 58, 295, 151 to the last four, so the
// thread that gets the second half does 1.4x the mean and the other waits.
// Here the work is a line of items (an expert each), each of some units (the
// columns of its output) that cost the same, plus a fixed cost per piece (the
// call, and the operand every piece of the item reads again); the line is cut
// into `parts` shares of near-equal cost, in item order, and an item is cut
// between neighbouring shares where that keeps each side at least `minUnits`
// units, at a multiple of `quantum`. A cut item's pieces read disjoint
// columns of its weight, so a cut costs one more call and one more read of
// the item's rows, not of its weight.
//
// The fused expert MLP (expert_mlp_cpu) cannot cut an expert: its backward
// adds every row into the expert's weight gradient. Its experts are dealt
// whole, the costliest first to the least loaded share (wholeItemShares).
//
// Header-only and free of torch: unittests/Runtime/CostSharesTest.cpp checks
// the shares (every unit dealt once, the balance, the cuts) on its own.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_TORCH_COSTSHARES_H
#define MOE_RUNTIME_TORCH_COSTSHARES_H

#include <algorithm>
#include <cstdint>
#include <vector>

namespace moe_torch {

/// One item of the line: `units` units of `unitCost` each, and `fixed` per
/// piece the item is dealt as.
struct CostItem {
  int64_t units = 0, unitCost = 0, fixed = 0;
  int64_t cost() const { return fixed + units * unitCost; }
};

/// Units [lo, hi) of item `item`.
struct Span {
  int64_t item, lo, hi;
  bool operator==(const Span &o) const {
    return item == o.item && lo == o.lo && hi == o.hi;
  }
};

/// `items` cut into `parts` shares of near-equal cost (the last may be empty
/// where there is less work than shares), each a list of spans in item order;
/// the shares, concatenated, are the items in order, every unit once.
/// Share p ends where the cumulative cost reaches (p + 1) / parts of the
/// total: an item that crosses that point is cut there (rounded to `quantum`
/// units) where both sides keep `minUnits`, else it goes whole to the share
/// that holds more of it.
inline std::vector<std::vector<Span>>
costShares(const std::vector<CostItem> &items, int64_t parts, int64_t quantum,
           int64_t minUnits) {
  parts = std::max<int64_t>(parts, 1);
  quantum = std::max<int64_t>(quantum, 1);
  minUnits = std::max<int64_t>(minUnits, 1);
  std::vector<std::vector<Span>> shares(parts);
  // Cumulative targets in long double: item costs are MACs, up to ~1e12 each.
  long double total = 0;
  for (const CostItem &it : items)
    total += static_cast<long double>(it.cost());
  long double done = 0; // the cost dealt to shares before `p` and to `p`
  int64_t p = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(items.size()); ++i) {
    const CostItem &it = items[i];
    int64_t lo = 0;
    while (lo < it.units) {
      int64_t rest = it.units - lo;
      long double cost = it.fixed + static_cast<long double>(rest) *
                                        static_cast<long double>(it.unitCost);
      long double room = total * (p + 1) / parts - done;
      if (p == parts - 1 || cost <= room) {
        shares[p].push_back({i, lo, it.units});
        done += cost;
        break;
      }
      // The units that fill the share, rounded to the quantum.
      long double fill =
          it.unitCost > 0 ? (room - it.fixed) / it.unitCost : 0.0L;
      int64_t take =
          fill <= 0 ? 0
                    : static_cast<int64_t>(fill / quantum + 0.5L) * quantum;
      if (take >= minUnits && rest - take >= minUnits) {
        shares[p].push_back({i, lo, lo + take});
        done += it.fixed + static_cast<long double>(take) * it.unitCost;
        lo += take;
        ++p;
      } else if (2 * room >= cost) { // most of the item is this share's
        shares[p].push_back({i, lo, it.units});
        done += cost;
        ++p;
        break;
      } else { // most of it is the next share's
        ++p;
      }
    }
  }
  return shares;
}

/// Items that cannot be cut (their pieces would add into the same output),
/// dealt whole to `parts` shares: the costliest first, each to the share with
/// the least cost so far (the lowest index on a tie), which keeps the largest
/// share within the costliest item of the mean (and within 4/3 of the best
/// whole-item dealing). Each share lists its items in index order. Returns
/// the item indices of each share; the shares' order and contents depend on
/// the costs alone.
inline std::vector<std::vector<int64_t>>
wholeItemShares(const std::vector<int64_t> &costs, int64_t parts) {
  parts = std::max<int64_t>(parts, 1);
  std::vector<int64_t> order(costs.size());
  for (int64_t i = 0; i < static_cast<int64_t>(order.size()); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return costs[a] > costs[b];
  });
  std::vector<std::vector<int64_t>> shares(parts);
  std::vector<int64_t> load(parts, 0);
  for (int64_t i : order) {
    int64_t p = std::min_element(load.begin(), load.end()) - load.begin();
    shares[p].push_back(i);
    load[p] += costs[i];
  }
  for (auto &share : shares)
    std::sort(share.begin(), share.end());
  return shares;
}

} // namespace moe_torch

#endif // MOE_RUNTIME_TORCH_COSTSHARES_H
