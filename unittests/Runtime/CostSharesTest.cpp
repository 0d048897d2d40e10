//===- CostSharesTest.cpp - Work dealt to threads in shares of equal cost -===//
//
// Part of the MoE-MLIR project.
//
// lib/Runtime/Torch/CostShares.h, which deals the CPU grouped GEMMs' experts
// (their output columns) over the threads: every unit dealt once and in
// order, the shares' costs equal where the items can be cut, cuts only at the
// quantum and never leaving a side under the minimum, whole items otherwise;
// and the fused expert MLP's whole experts (wholeItemShares): each once, the
// largest share within one item of the mean.
//
//===----------------------------------------------------------------------===//

#include "../../lib/Runtime/Torch/CostShares.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <cstdint>
#include <vector>

using moe_torch::CostItem;
using moe_torch::costShares;
using moe_torch::Span;

namespace {

using Shares = std::vector<std::vector<Span>>;

/// The shares, concatenated, cover every item's units once, in order.
void expectEveryUnitOnce(const std::vector<CostItem> &items,
                         const Shares &shares) {
  int64_t item = 0, next = 0;
  for (const auto &share : shares)
    for (const Span &s : share) {
      while (item < static_cast<int64_t>(items.size()) &&
             next == items[item].units) {
        ++item;
        next = 0;
      }
      ASSERT_LT(item, static_cast<int64_t>(items.size()));
      EXPECT_EQ(s.item, item);
      EXPECT_EQ(s.lo, next);
      EXPECT_GT(s.hi, s.lo);
      next = s.hi;
    }
  while (item < static_cast<int64_t>(items.size()) &&
         next == items[item].units) {
    ++item;
    next = 0;
  }
  EXPECT_EQ(item, static_cast<int64_t>(items.size()));
}

/// No item is cut: every span holds all of its item's units.
void expectWholeItems(const std::vector<CostItem> &items,
                      const Shares &shares) {
  for (const auto &share : shares)
    for (const Span &s : share) {
      EXPECT_EQ(s.lo, 0);
      EXPECT_EQ(s.hi, items[s.item].units);
    }
}

std::vector<double> costs(const std::vector<CostItem> &items,
                          const Shares &shares) {
  std::vector<double> c;
  for (const auto &share : shares) {
    double sum = 0;
    for (const Span &s : share)
      sum += items[s.item].fixed +
             double(s.hi - s.lo) * double(items[s.item].unitCost);
    c.push_back(sum);
  }
  return c;
}

/// A forward's items as ExpertOps.cpp builds them: N columns of n x K MACs
/// and a weight column each, the rows read again per piece.
std::vector<CostItem> forwardItems(const std::vector<int64_t> &rows,
                                   int64_t K, int64_t N) {
  std::vector<CostItem> items;
  for (int64_t n : rows)
    items.push_back({N, (n + 8) * K, n * K + (int64_t{1} << 16)});
  return items;
}

// Transformers' Mixtral (random weights, 4 x 128 tokens, k = 2) routes its
// first layer's rows like this: whole experts in two halves are 305 against
// 719 rows. Cut, the two shares cost the same to within one quantum.
TEST(CostShares, SkewedRoutingIsCutIntoEqualShares) {
  auto items = forwardItems({71, 92, 70, 72, 215, 58, 295, 151}, 512, 1024);
  Shares shares = costShares(items, 2, 16, 64);
  expectEveryUnitOnce(items, shares);
  auto c = costs(items, shares);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_LT(std::max(c[0], c[1]) / std::min(c[0], c[1]), 1.02);
  // Exactly one expert is cut, at a multiple of the quantum.
  ASSERT_FALSE(shares[0].empty());
  ASSERT_FALSE(shares[1].empty());
  EXPECT_EQ(shares[0].back().item, shares[1].front().item);
  EXPECT_EQ(shares[0].back().hi % 16, 0);
  EXPECT_GE(shares[0].back().hi - shares[0].back().lo, 64);
  EXPECT_GE(1024 - shares[1].front().lo, 64);
}

// One expert holds nearly every row (a collapsed router): it is cut, and each
// of four threads gets a quarter.
TEST(CostShares, OneHotExpertIsCutOverEveryShare) {
  auto items = forwardItems({0, 1000, 3, 0}, 256, 2048);
  items.erase(items.begin()); // ExpertOps deals the busy experts only
  items.pop_back();
  Shares shares = costShares(items, 4, 16, 64);
  expectEveryUnitOnce(items, shares);
  auto c = costs(items, shares);
  double lo = *std::min_element(c.begin(), c.end());
  double hi = *std::max_element(c.begin(), c.end());
  EXPECT_LT(hi / lo, 1.05);
}

// Items too narrow to cut (fewer than 2 x 64 columns) go whole, to the share
// that holds more of them, and the shares still split the work evenly.
TEST(CostShares, NarrowItemsGoWhole) {
  auto items = forwardItems({1, 1, 1, 1, 1, 1, 1, 1}, 256, 96);
  Shares shares = costShares(items, 2, 16, 64);
  expectEveryUnitOnce(items, shares);
  expectWholeItems(items, shares);
  EXPECT_EQ(shares[0].size(), 4u);
  EXPECT_EQ(shares[1].size(), 4u);
}

// A cut rounds to the quantum and keeps the minimum on both sides: a share
// boundary 10 columns into a 128-column item cannot cut it.
TEST(CostShares, CutsKeepTheMinimumOnBothSides) {
  std::vector<CostItem> items = {{100, 1, 0}, {128, 1, 0}, {60, 1, 0}};
  // Total 288, boundary at 144: 44 columns into the second item (< 64).
  Shares shares = costShares(items, 2, 16, 64);
  expectEveryUnitOnce(items, shares);
  for (const auto &share : shares)
    for (const Span &s : share)
      if (s.item == 1) {
        EXPECT_EQ(s.hi - s.lo, 128);
      }
}

TEST(CostShares, OneShareHoldsEverythingWhole) {
  auto items = forwardItems({5, 0, 300, 7}, 64, 512);
  Shares shares = costShares(items, 1, 16, 64);
  ASSERT_EQ(shares.size(), 1u);
  expectEveryUnitOnce(items, shares);
  EXPECT_EQ(shares[0].size(), 4u); // the idle item (0 rows) is 512 columns
}

TEST(CostShares, MoreSharesThanWorkLeavesSomeEmpty) {
  std::vector<CostItem> items = {{3, 10, 0}};
  Shares shares = costShares(items, 8, 16, 64);
  ASSERT_EQ(shares.size(), 8u);
  expectEveryUnitOnce(items, shares);
  int busy = 0;
  for (const auto &share : shares)
    busy += !share.empty();
  EXPECT_EQ(busy, 1);
}

TEST(CostShares, NoItemsOrNoUnits) {
  EXPECT_EQ(costShares({}, 2, 16, 64), Shares(2));
  std::vector<CostItem> empty = {{0, 5, 0}, {0, 1, 3}};
  Shares shares = costShares(empty, 2, 16, 64);
  expectEveryUnitOnce(empty, shares);
  EXPECT_TRUE(shares[0].empty() && shares[1].empty());
  // Zero or negative parts, quantum or minimum are taken as 1.
  std::vector<CostItem> one = {{4, 1, 0}};
  EXPECT_EQ(costShares(one, 0, 0, 0), (Shares{{Span{0, 0, 4}}}));
}

// Items of zero unit cost (no arithmetic, only the fixed part) never divide by
// zero and go whole.
TEST(CostShares, ZeroUnitCost) {
  std::vector<CostItem> items = {{256, 0, 10}, {256, 0, 10}, {256, 0, 10}};
  Shares shares = costShares(items, 2, 16, 64);
  expectEveryUnitOnce(items, shares);
  expectWholeItems(items, shares);
}

/// Each item in exactly one share, the shares in index order; returns the
/// shares' costs.
std::vector<int64_t>
expectEachItemOnce(const std::vector<int64_t> &costs,
                   const std::vector<std::vector<int64_t>> &shares) {
  std::vector<int> seen(costs.size(), 0);
  std::vector<int64_t> load;
  for (const auto &share : shares) {
    EXPECT_TRUE(std::is_sorted(share.begin(), share.end()));
    int64_t sum = 0;
    for (int64_t i : share) {
      EXPECT_GE(i, 0);
      EXPECT_LT(i, static_cast<int64_t>(costs.size()));
      ++seen[i];
      sum += costs[i];
    }
    load.push_back(sum);
  }
  for (int n : seen)
    EXPECT_EQ(n, 1);
  return load;
}

// The fused expert MLP's experts cannot be cut (the backward adds every row
// into the expert's weight gradient): dealt whole, the costliest first to the
// least loaded share. Mixtral's routing above: contiguous halves were 305
// rows against 719; whole-expert dealing gives 516 against 508.
TEST(WholeItemShares, SkewedRoutingIsBalanced) {
  std::vector<int64_t> rows = {71, 92, 70, 72, 215, 58, 295, 151};
  auto shares = moe_torch::wholeItemShares(rows, 2);
  ASSERT_EQ(shares.size(), 2u);
  std::vector<int64_t> load = expectEachItemOnce(rows, shares);
  EXPECT_EQ(std::max(load[0], load[1]), 516);
  EXPECT_EQ(std::min(load[0], load[1]), 508);
  // The costliest item first, on share 0; the next on share 1.
  EXPECT_TRUE(std::count(shares[0].begin(), shares[0].end(), 6) == 1);
  EXPECT_TRUE(std::count(shares[1].begin(), shares[1].end(), 4) == 1);
}

// The largest share stays within the costliest item of the mean, on many
// shapes (a bound of the greedy dealing), and the shares depend on the costs
// alone.
TEST(WholeItemShares, LargestShareWithinOneItemOfTheMean) {
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int64_t>(state >> 40);
  };
  for (int trial = 0; trial < 200; ++trial) {
    int64_t n = 1 + next() % 64, parts = 1 + next() % 8;
    std::vector<int64_t> costs(n);
    for (int64_t &c : costs)
      c = next() % 1000; // zeros included
    auto shares = moe_torch::wholeItemShares(costs, parts);
    ASSERT_EQ(static_cast<int64_t>(shares.size()), parts);
    std::vector<int64_t> load = expectEachItemOnce(costs, shares);
    int64_t total = 0, most = 0;
    for (int64_t c : costs) {
      total += c;
      most = std::max(most, c);
    }
    int64_t largest = *std::max_element(load.begin(), load.end());
    EXPECT_LE(largest * parts, total + most * parts) << "trial " << trial;
    EXPECT_EQ(moe_torch::wholeItemShares(costs, parts), shares);
  }
}

// Fewer items than shares: one item a share, the rest empty; no items, or
// zero or negative parts (taken as 1).
TEST(WholeItemShares, FewItemsAndDegenerateParts) {
  auto shares = moe_torch::wholeItemShares({5, 9}, 4);
  ASSERT_EQ(shares.size(), 4u);
  EXPECT_EQ(shares[0], std::vector<int64_t>{1});
  EXPECT_EQ(shares[1], std::vector<int64_t>{0});
  EXPECT_TRUE(shares[2].empty() && shares[3].empty());
  EXPECT_EQ(moe_torch::wholeItemShares({}, 2),
            std::vector<std::vector<int64_t>>(2));
  EXPECT_EQ(moe_torch::wholeItemShares({3, 1}, 0),
            (std::vector<std::vector<int64_t>>{{0, 1}}));
}

} // namespace
