//===- ExpertOps.cpp - The CPU kernel of moe_mlir::expert_mlp -------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// torch.ops.moe_mlir.expert_mlp_cpu and expert_mlp_backward_cpu: the bodies of
// moe_mlir::expert_mlp and its backward (python/moe_mlir/experts.py) on f32 and
// f64 CPU tensors. The Python op's loop issues ~7 torch calls per expert with
// rows; at E = 256 that per-call overhead (~4 us each) was most of a whole
// model's prefill and decode, and each call's small GEMM ran on one core.
// Here the experts are spread over torch's threads (whole experts, the
// costliest first to the least loaded thread: forEachExpert), each
// expert's rows go through two BLAS GEMMs (sgemm_/dgemm_ of the BLAS torch
// links) in per-thread scratch that stays in cache, and the gate, the bias
// and the routing weight are plain loops over that scratch.
//
// The result is HF's eager sum in its order: each expert-sorted row's output
// lands in its own row of a [S, N] buffer, then every token sums its rows in
// increasing row (= expert) order from zero, the order of eager's index_add_
// over the experts: no atomics, the same bits whatever the thread count.
// The backward recomputes each expert's forward (nothing of size S x 2I is
// saved) and sums the input gradient the same way.
//
// The Python loop stays the op's reference and its path for other dtypes.
//
// grouped_mm_cpu and grouped_mm_backward_cpu: one GEMM per expert on its
// contiguous rows, out[a:b] = x[a:b] . w[e], the experts' output columns
// dealt over the threads in shares of equal cost (CostShares.h: an expert
// may be cut between two threads, so skewed routing idles none of them):
// the CPU kernel of moe_mlir::grouped_mm (offsets
// [E+1]) and of moe_mlir::grouped_mm_ends, which the moe backend puts in
// place of transformers' grouped_mm_fallback (offsets: the [E] ends; rows
// past the last end are zeros), whose Python loop runs the GEMMs one after
// the other on one core at the sizes of a decode or a short prefill.
//
//===----------------------------------------------------------------------===//

#include "CostShares.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

// at::parallel_for is ATen's inline `#pragma omp parallel` on an OpenMP torch:
// compiled without OpenMP it runs the whole range on the caller, and every
// "parallel" loop below would be serial (the grouped GEMMs then ran expert
// after expert, each BLAS call opening its own team: issue 51). The build
// compiles this file with OpenMP wherever it links torch's libgomp
// (CMakeLists.txt: MOE_TORCH_OPENMP).
#if AT_PARALLEL_OPENMP && defined(MOE_TORCH_OPENMP) && !defined(_OPENMP)
#error "ExpertOps.cpp must be compiled with OpenMP (at::parallel_for would run serially)"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

// The BLAS that libtorch_cpu links (MKL, OpenBLAS) exports the Fortran GEMMs;
// weak, so that a torch without them loads the extension and takes at::mm.
extern "C" {
void sgemm_(const char *transa, const char *transb, const int *m, const int *n,
            const int *k, const float *alpha, const float *a, const int *lda,
            const float *b, const int *ldb, const float *beta, float *c,
            const int *ldc) __attribute__((weak));
void dgemm_(const char *transa, const char *transb, const int *m, const int *n,
            const int *k, const double *alpha, const double *a, const int *lda,
            const double *b, const int *ldb, const double *beta, double *c,
            const int *ldc) __attribute__((weak));
}

namespace {

using at::Tensor;

/// A strided matrix view: element (i, j) at p[i * rs + j * cs]; one of the
/// strides is 1 (the BLAS layouts).
template <typename T> struct Mat {
  const T *p;
  int64_t rows, cols, rs, cs;
};

template <typename T> Mat<T> rowMajor(const T *p, int64_t rows, int64_t cols) {
  return {p, rows, cols, cols, 1};
}

/// Expert e's matrix of a [E, R, C] weight (any strides with a unit one:
/// ensureBlasLayout made sure).
template <typename T> Mat<T> slice(const Tensor &w, int64_t e) {
  return {w.const_data_ptr<T>() + e * w.stride(0), w.size(1), w.size(2),
          w.stride(1), w.stride(2)};
}

/// A weight as BLAS can read its matrices: a unit stride in one of the last
/// two dimensions and a leading dimension that covers the other.
Tensor ensureBlasLayout(const Tensor &w) {
  int64_t r = w.size(1), c = w.size(2);
  bool rowMajorOk = w.stride(2) == 1 && w.stride(1) >= std::max<int64_t>(c, 1);
  bool colMajorOk = w.stride(1) == 1 && w.stride(2) >= std::max<int64_t>(r, 1);
  return rowMajorOk || colMajorOk ? w : w.contiguous();
}

/// C [m, n] (row-major, ldc) = A [m, k] . B [k, n] + beta * C.
template <typename T>
void gemm(const Mat<T> &a, const Mat<T> &b, T beta, T *c, int64_t ldc) {
  int64_t m = a.rows, n = b.cols, k = a.cols;
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  // Column-major BLAS computes C^T [n, m] = B^T [n, k] . A^T [k, m]. A
  // row-major matrix (unit column stride) is its transpose in column-major.
  auto op = [](const Mat<T> &x, int64_t ldMin, char &trans, int &ld) {
    if (x.cs == 1 && (x.rs >= ldMin || x.rows == 1)) {
      trans = 'N';
      ld = static_cast<int>(std::max<int64_t>(x.rs, ldMin));
    } else {
      trans = 'T';
      ld = static_cast<int>(std::max<int64_t>(x.cs, x.rows));
    }
  };
  char ta, tb;
  int lda, ldb;
  op(b, n, ta, lda); // B^T as column-major [n, k]
  op(a, k, tb, ldb); // A^T as column-major [k, m]
  int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  int LDC = static_cast<int>(ldc);
  T one = 1;
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm_) {
      sgemm_(&ta, &tb, &M, &N, &K, &one, b.p, &lda, a.p, &ldb, &beta, c, &LDC);
      return;
    }
  } else {
    if (dgemm_) {
      dgemm_(&ta, &tb, &M, &N, &K, &one, b.p, &lda, a.p, &ldb, &beta, c, &LDC);
      return;
    }
  }
  // No Fortran BLAS exported: the same product through ATen.
  auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  auto view = [&](const Mat<T> &x) {
    return at::from_blob(const_cast<T *>(x.p), {x.rows, x.cols}, {x.rs, x.cs},
                         opts);
  };
  Tensor out = at::from_blob(c, {m, n}, {ldc, 1}, opts);
  at::addmm_out(out, out, view(a), view(b), beta, 1);
}

enum class Gate { SiluGlu, ClampedGlu };

Gate parseGate(c10::string_view gate) {
  if (gate == "silu_glu")
    return Gate::SiluGlu;
  TORCH_CHECK_VALUE(gate == "clamped_glu",
              "expert_mlp: gate must be one of ('silu_glu', 'clamped_glu'), "
              "got '", std::string(gate), "'");
  return Gate::ClampedGlu;
}

template <typename T> T sigmoid(T v) { return T(1) / (T(1) + std::exp(-v)); }

/// act [n, I] = gate(h [n, 2I]) as HF computes it: SiLU(g) * u with g, u the
/// halves of h (silu_glu), or gpt-oss's (clamp(u, -l, l) + 1) * g' *
/// sigmoid(alpha g'), g' = min(g, l), with g, u interleaved (clamped_glu).
template <typename T>
void gateForward(Gate gate, const T *h, int64_t n, int64_t I, T alpha, T limit,
                 T *act) {
  for (int64_t r = 0; r < n; ++r) {
    const T *hr = h + r * 2 * I;
    T *ar = act + r * I;
    if (gate == Gate::SiluGlu) {
      for (int64_t j = 0; j < I; ++j) {
        T g = hr[j];
        ar[j] = g / (T(1) + std::exp(-g)) * hr[I + j];
      }
    } else {
      for (int64_t j = 0; j < I; ++j) {
        T g = std::min(hr[2 * j], limit);
        T u = std::min(std::max(hr[2 * j + 1], -limit), limit);
        ar[j] = (u + T(1)) * (g * sigmoid(g * alpha));
      }
    }
  }
}

/// dh [n, 2I] = d gate(h) / dh applied to da [n, I] (clamp's gradient as
/// torch's: 1 inside the open range, 0 at and beyond the bounds).
template <typename T>
void gateBackward(Gate gate, const T *h, const T *da, int64_t n, int64_t I,
                  T alpha, T limit, T *dh) {
  for (int64_t r = 0; r < n; ++r) {
    const T *hr = h + r * 2 * I, *dr = da + r * I;
    T *out = dh + r * 2 * I;
    if (gate == Gate::SiluGlu) {
      for (int64_t j = 0; j < I; ++j) {
        T g = hr[j], u = hr[I + j], s = sigmoid(g);
        out[I + j] = dr[j] * (g * s);
        out[j] = dr[j] * u * s * (T(1) + g * (T(1) - s));
      }
    } else {
      for (int64_t j = 0; j < I; ++j) {
        T g = hr[2 * j], u = hr[2 * j + 1];
        T gc = std::min(g, limit), s = sigmoid(gc * alpha);
        T uc = std::min(std::max(u, -limit), limit);
        out[2 * j + 1] = (u > -limit && u < limit) ? dr[j] * (gc * s) : T(0);
        out[2 * j] = g < limit ? dr[j] * (uc + T(1)) *
                                     (s + gc * alpha * s * (T(1) - s))
                               : T(0);
      }
    }
  }
}

/// The row ranges [start[e], end[e]) of a grouped GEMM's experts: offsets
/// [E+1] (boundaries) or [E] (ends, the first expert's rows from 0).
struct Groups {
  std::vector<int64_t> start, end;
  int64_t last = 0; // rows from `last` on belong to no expert (zeros)
};

/// The error policy of every moe op: TypeError (TORCH_CHECK_TYPE) for a dtype,
/// ValueError (TORCH_CHECK_VALUE) for a shape or a value, RuntimeError
/// (TORCH_CHECK) for a device.
void checkOffsetsType(const char *op, const Tensor &offsets) {
  TORCH_CHECK_TYPE(offsets.scalar_type() == at::kInt ||
                       offsets.scalar_type() == at::kLong,
                   op, ": offsets must be int32 or int64, got ",
                   offsets.scalar_type());
}

/// A backward op's incoming gradient: a CPU [rows, cols] tensor of x's dtype.
void checkGrad(const char *op, const Tensor &grad, const Tensor &x,
               int64_t rows, int64_t cols) {
  TORCH_CHECK_TYPE(grad.scalar_type() == x.scalar_type(), op, ": grad must be ",
                   x.scalar_type(), ", got ", grad.scalar_type());
  TORCH_CHECK_VALUE(grad.dim() == 2 && grad.size(0) == rows &&
                        grad.size(1) == cols,
                    op, ": grad must be [", rows, ", ", cols, "], got ",
                    grad.sizes());
  TORCH_CHECK(grad.device().is_cpu(), op, ": grad must be on the CPU");
}

Groups groupsOf(const char *op, const Tensor &offsets, int64_t E, int64_t S) {
  checkOffsetsType(op, offsets);
  TORCH_CHECK_VALUE(offsets.dim() == 1 &&
                        (offsets.size(0) == E || offsets.size(0) == E + 1),
                    op, ": offsets must be an integer [E] (ends) or [E+1] "
                    "tensor, E = ", E, ", got ", offsets.sizes());
  Tensor off = offsets.to(at::kLong).contiguous();
  const int64_t *o = off.const_data_ptr<int64_t>();
  bool ends = offsets.size(0) == E;
  Groups g;
  g.start.resize(E);
  g.end.resize(E);
  int64_t prev = ends ? 0 : o[0];
  TORCH_CHECK_VALUE(ends || prev == 0, op, ": offsets[0] must be 0, got ", prev);
  for (int64_t e = 0; e < E; ++e) {
    int64_t next = o[ends ? e : e + 1];
    TORCH_CHECK_VALUE(next >= prev && next <= S, op, ": offsets must not decrease "
                "and stay within the ", S, " rows, got ", next, " after ", prev,
                " (expert ", e, ")");
    g.start[e] = prev;
    g.end[e] = prev = next;
  }
  g.last = prev;
  return g;
}

/// The work (multiply-adds, plus the elements of idle gradient slices to
/// zero) above which a call of forEachExpert spreads its experts over torch's
/// threads: one 256 x 256 expert of one row. A decode call is a few
/// matrix-vector products whose weights come from memory (8 experts x 256 x
/// 256: 2 MB), which one core streams at a fraction of the machine's
/// bandwidth. On a quiet 2-core EPYC, a whole decode step against inductor's
/// in the same process (bench.model_ab, median of 300 interleaved steps) went
/// from 1.10-1.15x with the caller alone to 1.26-1.47x with a team (Mixtral,
/// Qwen3-MoE, DeepSeek-V3). ATen's and inductor's own loops thread above
/// their grain too. The threshold had been ~1M (1ed6b7e) on a machine
/// loaded 4-7 by other processes, where every team waits for its second thread
/// to be scheduled; that is the load's cost to every threaded op, inductor's
/// kernels included, not a reason for ours to run on one core.
constexpr int64_t kTeamWork = int64_t{1} << 16;

/// The cost of reading a weight element, in multiply-adds: at a decode's one
/// or two rows an expert's GEMMs stream its weights from memory, so the
/// threads' shares must balance bytes as well as arithmetic.
constexpr int64_t kWeightReadMacs = 8;

/// How many shares a call of `work` multiply-adds is dealt as: one (the
/// caller) up to kTeamWork, else one per thread of torch's team.
int64_t sharesFor(int64_t work) {
  return work > kTeamWork ? std::max<int64_t>(at::get_num_threads(), 1) : 1;
}

/// f(piece) for every piece of `shares` (CostShares.h: spans of items, or
/// whole items), share i on thread i of the team (a single share on the
/// caller). Which thread runs a piece never changes its result.
template <typename Share, typename F>
void runShares(const std::vector<Share> &shares, F f) {
  at::parallel_for(0, static_cast<int64_t>(shares.size()), 1,
                   [&](int64_t begin, int64_t end) {
                     for (int64_t i = begin; i < end; ++i)
                       for (const auto &piece : shares[i])
                         f(piece);
                   });
}

/// f(e, start, end) for each expert with rows, and idle(e) for each expert
/// without (a backward's gradient slice to zero), those experts spread over
/// torch's threads when the call is worth a team (kTeamWork: `macsPerRow`
/// multiply-adds a row, `weightsPerExpert` elements of an idle expert's
/// slices). An expert is not cut (the backward adds all its rows into its
/// weight gradient), so the experts are dealt whole, the costliest first to
/// the least loaded thread (CostShares.h, wholeItemShares): a busy expert
/// costs its rows' multiply-adds plus a read of its weights, an idle one the
/// writes of its slices. Dealing contiguous halves of the experts had left
/// the threads as unequal as the routing (Mixtral at random weights: 305
/// rows against 719). Which thread runs an expert never changes the result.
template <typename F, typename Idle>
void forEachExpert(const Groups &g, int64_t macsPerRow,
                   int64_t weightsPerExpert, F f, Idle idle) {
  constexpr bool withIdle = !std::is_same_v<Idle, std::nullptr_t>;
  int64_t E = static_cast<int64_t>(g.start.size());
  std::vector<int64_t> experts, costs;
  int64_t work = 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t rows = g.end[e] - g.start[e];
    if (rows <= 0 && !withIdle)
      continue;
    experts.push_back(e);
    // A busy expert: its rows' arithmetic and a pass over its weights (or
    // its slices to zero); an idle one: that pass alone (a write costs a
    // read).
    int64_t macs = rows > 0 ? rows * macsPerRow : 0;
    costs.push_back(macs + kWeightReadMacs * weightsPerExpert);
    work += rows > 0 ? macs : weightsPerExpert;
  }
  auto run = [&](int64_t e) {
    if (g.end[e] > g.start[e])
      f(e, g.start[e], g.end[e]);
    else if constexpr (withIdle)
      idle(e);
  };
  runShares(moe_torch::wholeItemShares(costs, sharesFor(work)),
            [&](int64_t item) { run(experts[item]); });
}

template <typename F>
void forEachGroup(const Groups &g, int64_t macsPerRow,
                  int64_t weightsPerExpert, F f) {
  forEachExpert(g, macsPerRow, weightsPerExpert, f, nullptr);
}

/// Zeros rows [r0, r1) (by default all R) of matrix `e` of a [E, R, C]
/// gradient (strides as allocated: a unit one in the last two dimensions),
/// along the unit stride. The backward kernels allocate their
/// weight gradients uninitialised: the GEMMs (beta = 0) write the slices of
/// experts with rows, so only the idle experts' slices need zeros. A fresh
/// weight gradient is untouched memory (it becomes the parameter's .grad and
/// the next step allocates anew); zero-filling it all first had cost a serial
/// pass of page faults (Mixtral, 16 MB: ~4 ms per call on this machine)
/// before the parallel GEMMs touched it again.
template <typename T>
void zeroSlice(const Tensor &grad, int64_t e, int64_t r0 = 0, int64_t r1 = -1) {
  if (r1 < 0)
    r1 = grad.size(1);
  T *p = grad.data_ptr<T>() + e * grad.stride(0) + r0 * grad.stride(1);
  int64_t r = r1 - r0, c = grad.size(2);
  int64_t rs = grad.stride(1), cs = grad.stride(2);
  if (cs != 1) { // walk along the unit stride
    std::swap(r, c);
    std::swap(rs, cs);
  }
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      p[i * rs + j * cs] = T(0);
}

/// BLAS takes int dimensions.
void checkBlasDims(const char *op, std::initializer_list<const Tensor *> ts) {
  for (const Tensor *t : ts)
    for (int64_t size : t->sizes())
      TORCH_CHECK_VALUE(size < std::numeric_limits<int>::max(), op,
                  ": dimensions of 2^31 or more are not supported (BLAS "
                  "indices), got ", t->sizes());
}

/// The operands of one call, checked.
struct Problem {
  Tensor x, token, rw, w1, b1, w2, b2;
  Groups groups; // the experts' rows
  int64_t T = 0, D = 0, E = 0, S = 0, I = 0, N = 0;
  Gate gate = Gate::SiluGlu;
  double alpha = 1, limit = 0;
  int64_t maxRows = 0;
};

Problem check(const char *op, const Tensor &x, const Tensor &token,
              const Tensor &offsets, const Tensor &rowWeight, const Tensor &w1,
              const std::optional<Tensor> &b1, const Tensor &w2,
              const std::optional<Tensor> &b2, c10::string_view gate,
              double alpha, double limit) {
  Problem p;
  p.gate = parseGate(gate);
  TORCH_CHECK_VALUE(x.dim() == 2 && w1.dim() == 3 && w2.dim() == 3, op,
              ": x must be [T, D], w1 [E, 2I, D] and w2 [E, N, I], got ",
              x.sizes(), ", ", w1.sizes(), ", ", w2.sizes());
  checkBlasDims(op, {&x, &w1, &w2});
  p.T = x.size(0);
  p.D = x.size(1);
  p.E = w1.size(0);
  TORCH_CHECK_VALUE(w1.size(2) == p.D && w1.size(1) % 2 == 0 &&
                  w2.size(0) == p.E && w2.size(2) == w1.size(1) / 2,
              op, ": w1 ", w1.sizes(), " and w2 ", w2.sizes(),
              " do not fit x ", x.sizes(), " (w1 [E, 2I, D], w2 [E, N, I])");
  p.I = w2.size(2);
  p.N = w2.size(1);
  auto dt = x.scalar_type();
  TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kDouble, op,
              ": x must be float32 or float64, got ", dt);
  for (const Tensor *t : {&x, &token, &offsets, &rowWeight, &w1, &w2})
    TORCH_CHECK(t->device().is_cpu(), op, ": every tensor must be on the CPU");
  TORCH_CHECK_TYPE(w1.scalar_type() == dt && w2.scalar_type() == dt &&
                  rowWeight.scalar_type() == dt,
              op, ": w1, w2 and row_weight must have the dtype of x (", dt,
              ")");
  TORCH_CHECK_TYPE(at::isIntegralType(token.scalar_type(), false), op,
                   ": token must be an integer tensor, got ",
                   token.scalar_type());
  TORCH_CHECK_VALUE(token.dim() == 1 && rowWeight.dim() == 1 &&
                        rowWeight.size(0) == token.size(0),
                    op, ": token and row_weight must be [S], got ",
                    token.sizes(), " and ", rowWeight.sizes());
  p.S = token.size(0);
  checkOffsetsType(op, offsets);
  TORCH_CHECK_VALUE(offsets.dim() == 1 && offsets.size(0) == p.E + 1, op,
                    ": offsets must be [E+1] = [", p.E + 1, "], got ",
                    offsets.sizes());
  auto bias = [&](const std::optional<Tensor> &b, const char *name,
                  int64_t n) -> Tensor {
    if (!b || !b->defined())
      return Tensor();
    TORCH_CHECK_VALUE(b->dim() == 2 && b->size(0) == p.E && b->size(1) == n, op,
                ": ", name, " must be [", p.E, ", ", n, "], got ", b->sizes());
    TORCH_CHECK_TYPE(b->scalar_type() == dt, op, ": ", name, " must be ", dt,
                     ", got ", b->scalar_type());
    TORCH_CHECK(b->device().is_cpu(), op, ": ", name, " must be on the CPU");
    return b->contiguous();
  };
  p.b1 = bias(b1, "b1", 2 * p.I);
  p.b2 = bias(b2, "b2", p.N);
  p.groups = groupsOf(op, offsets, p.E, p.S);
  TORCH_CHECK_VALUE(p.groups.last == p.S, op,
              ": offsets must run from 0 to the number of rows ", p.S,
              ", got 0 ... ", p.groups.last);
  for (int64_t e = 0; e < p.E; ++e)
    p.maxRows = std::max(p.maxRows, p.groups.end[e] - p.groups.start[e]);
  p.token = token.to(at::kLong).contiguous();
  if (p.S) {
    const int64_t *tk = p.token.const_data_ptr<int64_t>();
    auto [lo, hi] = std::minmax_element(tk, tk + p.S);
    TORCH_CHECK_VALUE(*lo >= 0 && *hi < p.T, op, ": token holds ",
                *lo < 0 ? *lo : *hi, ", outside [0, ", p.T, ")");
  }
  p.x = x.contiguous();
  p.rw = rowWeight.contiguous();
  p.w1 = ensureBlasLayout(w1);
  p.w2 = ensureBlasLayout(w2);
  p.alpha = alpha;
  p.limit = limit;
  return p;
}

/// out [T, C] = for each token, the sum of its rows of `rows` [S, C] in
/// increasing row order, from zero (eager's index_add_ over the experts).
template <typename T>
void sumRowsPerToken(const Problem &p, const T *rows, int64_t C, T *out) {
  std::vector<int64_t> start(p.T + 1, 0), order(p.S);
  const int64_t *tk = p.token.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < p.S; ++r)
    ++start[tk[r] + 1];
  for (int64_t t = 0; t < p.T; ++t)
    start[t + 1] += start[t];
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t r = 0; r < p.S; ++r)
    order[fill[tk[r]]++] = r;
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1));
  at::parallel_for(0, p.T, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      T *o = out + t * C;
      std::fill(o, o + C, T(0));
      for (int64_t i = start[t]; i < start[t + 1]; ++i) {
        const T *y = rows + order[i] * C;
        for (int64_t j = 0; j < C; ++j)
          o[j] += y[j];
      }
    }
  });
}

/// Per thread: expert e's rows gathered, h = x_e w1[e]^T + b1[e], act.
template <typename T> struct Scratch {
  std::vector<T> xe, h, act;
  explicit Scratch(const Problem &p)
      : xe(p.maxRows * p.D), h(p.maxRows * 2 * p.I), act(p.maxRows * p.I) {}

  /// The forward of expert e's rows [a, b) up to act.
  void hidden(const Problem &p, int64_t e, int64_t a, int64_t b) {
    int64_t n = b - a;
    const T *x = p.x.const_data_ptr<T>();
    const int64_t *tk = p.token.const_data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(x + tk[a + r] * p.D, p.D, xe.data() + r * p.D);
    Mat<T> w1 = slice<T>(p.w1, e);
    Mat<T> w1t{w1.p, w1.cols, w1.rows, w1.cs, w1.rs}; // [D, 2I]
    if (p.b1.defined()) {
      const T *b1 = p.b1.const_data_ptr<T>() + e * 2 * p.I;
      for (int64_t r = 0; r < n; ++r)
        std::copy_n(b1, 2 * p.I, h.data() + r * 2 * p.I);
    }
    gemm<T>(rowMajor<T>(xe.data(), n, p.D), w1t, p.b1.defined() ? T(1) : T(0),
            h.data(), 2 * p.I);
    gateForward<T>(p.gate, h.data(), n, p.I, T(p.alpha), T(p.limit),
                   act.data());
  }

  /// y [n, N] (row-major, ldy = N) = act w2[e]^T + b2[e].
  void output(const Problem &p, int64_t e, int64_t n, T *y) {
    Mat<T> w2 = slice<T>(p.w2, e);
    Mat<T> w2t{w2.p, w2.cols, w2.rows, w2.cs, w2.rs}; // [I, N]
    if (p.b2.defined()) {
      const T *b2 = p.b2.const_data_ptr<T>() + e * p.N;
      for (int64_t r = 0; r < n; ++r)
        std::copy_n(b2, p.N, y + r * p.N);
    }
    gemm<T>(rowMajor<T>(act.data(), n, p.I), w2t, p.b2.defined() ? T(1) : T(0),
            y, p.N);
  }
};

template <typename T> Tensor forward(const Problem &p) {
  Tensor out = at::empty({p.T, p.N}, p.x.options());
  Tensor rows = at::empty({p.S, p.N}, p.x.options());
  T *y = rows.data_ptr<T>();
  const T *rw = p.rw.const_data_ptr<T>();
  int64_t weights = 2 * p.I * p.D + p.N * p.I; // per expert, = MACs per row
  int64_t threads = at::get_num_threads();
  std::vector<std::unique_ptr<Scratch<T>>> scratch(threads);
  auto body = [&](int64_t e, int64_t a, int64_t b) {
    auto &s = scratch[at::get_thread_num()];
    if (!s)
      s = std::make_unique<Scratch<T>>(p);
    s->hidden(p, e, a, b);
    T *ye = y + a * p.N;
    s->output(p, e, b - a, ye);
    // HF's order: the routing weight on the expert's output.
    for (int64_t r = a; r < b; ++r)
      for (int64_t j = 0; j < p.N; ++j)
        y[r * p.N + j] *= rw[r];
  };
  forEachGroup(p.groups, weights, weights, body);
  sumRowsPerToken<T>(p, y, p.N, out.data_ptr<T>());
  return out;
}

template <typename T>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>
backward(const Problem &p, const Tensor &gradIn) {
  Tensor grad = gradIn.contiguous();
  auto opts = p.x.options();
  Tensor gradX = at::empty({p.T, p.D}, opts);
  Tensor gradRw = at::empty({p.S}, opts);
  // Written by the experts' GEMMs, zeroed for idle experts (zeroSlice).
  Tensor gradW1 = at::empty({p.E, 2 * p.I, p.D}, opts);
  Tensor gradW2 = at::empty({p.E, p.N, p.I}, opts);
  Tensor gradB1 = p.b1.defined() ? at::zeros({p.E, 2 * p.I}, opts)
                                 : at::zeros({0}, opts);
  Tensor gradB2 = p.b2.defined() ? at::zeros({p.E, p.N}, opts)
                                 : at::zeros({0}, opts);
  Tensor dxRows = at::empty({p.S, p.D}, opts);
  const T *g = grad.const_data_ptr<T>(), *rw = p.rw.const_data_ptr<T>();
  const int64_t *tk = p.token.const_data_ptr<int64_t>();
  T *grw = gradRw.data_ptr<T>(), *dx = dxRows.data_ptr<T>();
  T *gw1 = gradW1.data_ptr<T>(), *gw2 = gradW2.data_ptr<T>();
  T *gb1 = p.b1.defined() ? gradB1.data_ptr<T>() : nullptr;
  T *gb2 = p.b2.defined() ? gradB2.data_ptr<T>() : nullptr;
  int64_t weights = 2 * p.I * p.D + p.N * p.I; // per expert, = MACs per row
  int64_t threads = at::get_num_threads();
  struct Grad {
    Scratch<T> s;
    std::vector<T> y, dy, da, dh;
    explicit Grad(const Problem &p)
        : s(p), y(p.maxRows * p.N), dy(p.maxRows * p.N),
          da(p.maxRows * p.I), dh(p.maxRows * 2 * p.I) {}
  };
  std::vector<std::unique_ptr<Grad>> scratch(threads);
  // Reads each busy expert's weights and writes their gradients.
  auto body = [&](int64_t e, int64_t a, int64_t b) {
    auto &w = scratch[at::get_thread_num()];
    if (!w)
      w = std::make_unique<Grad>(p);
    int64_t n = b - a, N = p.N, I = p.I, D = p.D;
    w->s.hidden(p, e, a, b);
    w->s.output(p, e, n, w->y.data());
    for (int64_t r = 0; r < n; ++r) {
      const T *gr = g + tk[a + r] * N, *yr = w->y.data() + r * N;
      T *dyr = w->dy.data() + r * N, dot = 0;
      for (int64_t j = 0; j < N; ++j) {
        dot += gr[j] * yr[j];
        dyr[j] = gr[j] * rw[a + r];
      }
      grw[a + r] = dot;
    }
    Mat<T> dy = rowMajor<T>(w->dy.data(), n, N);
    Mat<T> dyT{dy.p, N, n, 1, N};
    // grad_w2[e] [N, I] = dy^T act; grad_b2[e] = sum_r dy.
    gemm<T>(dyT, rowMajor<T>(w->s.act.data(), n, I), T(0), gw2 + e * N * I, I);
    if (gb2)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < N; ++j)
          gb2[e * N + j] += dy.p[r * N + j];
    // da [n, I] = dy w2[e]; dh = gate'(h) da.
    gemm<T>(dy, slice<T>(p.w2, e), T(0), w->da.data(), I);
    gateBackward<T>(p.gate, w->s.h.data(), w->da.data(), n, I, T(p.alpha),
                    T(p.limit), w->dh.data());
    Mat<T> dh = rowMajor<T>(w->dh.data(), n, 2 * I);
    Mat<T> dhT{dh.p, 2 * I, n, 1, 2 * I};
    // grad_w1[e] [2I, D] = dh^T x_e; grad_b1[e] = sum_r dh; dx rows = dh w1[e].
    gemm<T>(dhT, rowMajor<T>(w->s.xe.data(), n, D), T(0), gw1 + e * 2 * I * D,
            D);
    if (gb1)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < 2 * I; ++j)
          gb1[e * 2 * I + j] += dh.p[r * 2 * I + j];
    gemm<T>(dh, slice<T>(p.w1, e), T(0), dx + a * D, D);
  };
  auto idle = [&](int64_t e) {
    zeroSlice<T>(gradW1, e);
    zeroSlice<T>(gradW2, e);
  };
  forEachExpert(p.groups, 3 * weights, 2 * weights, body, idle);
  sumRowsPerToken<T>(p, dx, p.D, gradX.data_ptr<T>());
  return {gradX, gradRw, gradW1, gradB1, gradW2, gradB2};
}

/// The operands of a grouped GEMM x [S, K] . w[e] [K, N], checked.
struct GroupedProblem {
  Tensor x, w;
  Groups groups;
  int64_t S = 0, K = 0, N = 0, E = 0;
};

GroupedProblem checkGrouped(const char *op, const Tensor &x, const Tensor &w,
                            const Tensor &offsets) {
  TORCH_CHECK_VALUE(x.dim() == 2 && w.dim() == 3 && x.size(1) == w.size(1), op,
              ": x must be [S, K] and w [E, K, N], got ", x.sizes(), " and ",
              w.sizes());
  auto dt = x.scalar_type();
  TORCH_CHECK_TYPE((dt == at::kFloat || dt == at::kDouble) && w.scalar_type() == dt,
              op, ": x and w must both be float32 or float64, got ", dt,
              " and ", w.scalar_type());
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu() &&
                  offsets.device().is_cpu(),
              op, ": every tensor must be on the CPU");
  checkBlasDims(op, {&x, &w});
  GroupedProblem p;
  p.S = x.size(0);
  p.K = x.size(1);
  p.E = w.size(0);
  p.N = w.size(2);
  p.groups = groupsOf(op, offsets, p.E, p.S);
  p.x = x.contiguous();
  p.w = ensureBlasLayout(w);
  return p;
}

/// Cost weights of the grouped GEMMs' shares (CostShares.h), in
/// multiply-adds: a weight element read costs kWeightReadMacs (above), and a
/// piece kCallMacs more than its arithmetic (a BLAS call: ~1 us).
constexpr int64_t kCallMacs = int64_t{1} << 16;
/// Where a cut may fall in an expert's columns: a multiple of 16 (one 64-byte
/// line of f32), each side keeping 64 (a BLAS call's column panels).
constexpr int64_t kColumnQuantum = 16, kMinColumns = 64;

/// Columns [c0, c1) of a matrix view.
template <typename T> Mat<T> columns(const Mat<T> &m, int64_t c0, int64_t c1) {
  return {m.p + c0 * m.cs, m.rows, c1 - c0, m.rs, m.cs};
}

template <typename T> Tensor groupedForward(const GroupedProblem &p) {
  Tensor out = at::empty({p.S, p.N}, p.x.options());
  T *o = out.data_ptr<T>();
  const T *x = p.x.const_data_ptr<T>();
  std::fill(o + p.groups.last * p.N, o + p.S * p.N, T(0));
  // Item: a busy expert's N output columns, each n x K multiply-adds and a
  // column of its weight; each piece reads the expert's rows again.
  std::vector<int64_t> expert;
  std::vector<moe_torch::CostItem> items;
  int64_t work = 0;
  for (int64_t e = 0; e < p.E; ++e) {
    int64_t n = p.groups.end[e] - p.groups.start[e];
    if (n == 0)
      continue;
    expert.push_back(e);
    items.push_back({p.N, (n + kWeightReadMacs) * p.K, n * p.K + kCallMacs});
    work += n * p.K * p.N;
  }
  auto shares = moe_torch::costShares(items, sharesFor(work), kColumnQuantum,
                                      kMinColumns);
  runShares(shares, [&](const moe_torch::Span &s) {
    int64_t e = expert[s.item], a = p.groups.start[e], b = p.groups.end[e];
    gemm<T>(rowMajor<T>(x + a * p.K, b - a, p.K),
            columns(slice<T>(p.w, e), s.lo, s.hi), T(0), o + a * p.N + s.lo,
            p.N);
  });
  return out;
}

template <typename T>
std::tuple<Tensor, Tensor> groupedBackward(const GroupedProblem &p,
                                           const Tensor &gradIn,
                                           bool gradWLikeW) {
  Tensor grad = gradIn.contiguous();
  Tensor gradX = at::empty({p.S, p.K}, p.x.options());
  // grad_w contiguous, or with `gradWLikeW` in w's layout (empty_like: the
  // strides of an nn.Linear weight viewed transposed), so that such a
  // parameter's gradient needs no transposing copy. Written by the experts'
  // GEMMs, zeroed for idle experts (never by a pass over all of it: see
  // zeroSlice).
  Tensor gradW = gradWLikeW ? at::empty_like(p.w)
                            : at::empty({p.E, p.K, p.N}, p.x.options());
  bool gwRowMajor = gradW.stride(2) == 1 &&
                    gradW.stride(1) >= std::max<int64_t>(p.N, 1);
  if (!gwRowMajor && !(gradW.stride(1) == 1 &&
                       gradW.stride(2) >= std::max<int64_t>(p.K, 1))) {
    gradW = at::empty({p.E, p.K, p.N}, p.x.options());
    gwRowMajor = true;
  }
  const T *g = grad.const_data_ptr<T>(), *x = p.x.const_data_ptr<T>();
  T *gx = gradX.data_ptr<T>(), *gw = gradW.data_ptr<T>();
  std::fill(gx + p.groups.last * p.K, gx + p.S * p.K, T(0));
  int64_t s1 = gradW.stride(1), s2 = gradW.stride(2);
  // Item: an expert's K columns of grad_x, which are the K rows of
  // grad_w[e]: each 2 n x N multiply-adds and a row of w[e] (a busy expert;
  // each piece reads its grad rows again), or N zeros (an idle expert).
  std::vector<moe_torch::CostItem> items;
  int64_t work = 0;
  for (int64_t e = 0; e < p.E; ++e) {
    int64_t n = p.groups.end[e] - p.groups.start[e];
    if (n > 0)
      items.push_back(
          {p.K, (2 * n + kWeightReadMacs) * p.N, n * p.N + 2 * kCallMacs});
    else
      items.push_back({p.K, p.N, 0});
    work += (2 * n + 1) * p.K * p.N;
  }
  auto shares = moe_torch::costShares(items, sharesFor(work), kColumnQuantum,
                                      kMinColumns);
  runShares(shares, [&](const moe_torch::Span &s) {
    int64_t e = s.item, a = p.groups.start[e], n = p.groups.end[e] - a;
    int64_t k0 = s.lo, k1 = s.hi;
    if (n == 0) { // grad_w[e]'s rows k0..k1 are zeros
      zeroSlice<T>(gradW, e, k0, k1);
      return;
    }
    T *gwe = gw + e * gradW.stride(0);
    Mat<T> w = slice<T>(p.w, e);
    Mat<T> wT{w.p, w.cols, w.rows, w.cs, w.rs}; // [N, K]
    Mat<T> gRows = rowMajor<T>(g + a * p.N, n, p.N);
    Mat<T> xCols = columns(rowMajor<T>(x + a * p.K, n, p.K), k0, k1);
    // grad_x rows, columns k0..k1 = grad rows . w[e]^T's columns k0..k1.
    gemm<T>(gRows, columns(wT, k0, k1), T(0), gx + a * p.K + k0, p.K);
    // grad_w[e] rows k0..k1 [k, N] = x cols^T . grad rows, or its transpose
    // [N, k] = grad rows^T . x cols where grad_w[e] is column-major.
    if (gwRowMajor)
      gemm<T>({xCols.p, k1 - k0, n, 1, p.K}, gRows, T(0), gwe + k0 * s1, s1);
    else
      gemm<T>({gRows.p, p.N, n, 1, p.N}, xCols, T(0), gwe + k0, s2);
  });
  return {gradX, gradW};
}

// `transposed`: w is [E, N, K] (an nn.Linear weight, the product is with
// w[e]^T), and its gradient is returned in that layout, contiguous: a
// parameter's own, where the gradient of its transposed view would need a
// transposing copy in autograd's accumulation.
Tensor groupedMm(const Tensor &x, const Tensor &w, const Tensor &offsets,
                 bool transposed) {
  TORCH_CHECK_VALUE(w.dim() == 3, "grouped_mm: w must be [E, K, N] (or [E, N, K] "
              "transposed), got ", w.sizes());
  GroupedProblem p = checkGrouped("grouped_mm", x,
                                  transposed ? w.transpose(1, 2) : w, offsets);
  return x.scalar_type() == at::kFloat ? groupedForward<float>(p)
                                       : groupedForward<double>(p);
}

std::tuple<Tensor, Tensor> groupedMmBackward(const Tensor &grad,
                                             const Tensor &x, const Tensor &w,
                                             const Tensor &offsets,
                                             bool gradWLikeW, bool transposed) {
  TORCH_CHECK_VALUE(w.dim() == 3, "grouped_mm_backward: w must be [E, K, N] (or "
              "[E, N, K] transposed), got ", w.sizes());
  GroupedProblem p = checkGrouped("grouped_mm_backward", x,
                                  transposed ? w.transpose(1, 2) : w, offsets);
  checkGrad("grouped_mm_backward", grad, x, p.S, p.N);
  bool likeW = gradWLikeW || transposed;
  auto [gradX, gradW] = x.scalar_type() == at::kFloat
                            ? groupedBackward<float>(p, grad, likeW)
                            : groupedBackward<double>(p, grad, likeW);
  if (transposed) // back to w's own layout: no copy when w is contiguous
    gradW = gradW.transpose(1, 2).contiguous();
  return {gradX, gradW};
}

Tensor expertMlp(const Tensor &x, const Tensor &token, const Tensor &offsets,
                 const Tensor &rowWeight, const Tensor &w1,
                 const std::optional<Tensor> &b1, const Tensor &w2,
                 const std::optional<Tensor> &b2, c10::string_view gate,
                 double alpha, double limit) {
  Problem p = check("expert_mlp", x, token, offsets, rowWeight, w1, b1, w2, b2,
                    gate, alpha, limit);
  return x.scalar_type() == at::kFloat ? forward<float>(p) : forward<double>(p);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>
expertMlpBackward(const Tensor &grad, const Tensor &x, const Tensor &token,
                  const Tensor &offsets, const Tensor &rowWeight,
                  const Tensor &w1, const std::optional<Tensor> &b1,
                  const Tensor &w2, const std::optional<Tensor> &b2,
                  c10::string_view gate, double alpha, double limit) {
  Problem p = check("expert_mlp_backward", x, token, offsets, rowWeight, w1,
                    b1, w2, b2, gate, alpha, limit);
  checkGrad("expert_mlp_backward", grad, x, p.T, p.N);
  return x.scalar_type() == at::kFloat ? backward<float>(p, grad)
                                       : backward<double>(p, grad);
}

} // namespace

/// How many threads a parallel loop of this file runs on (the largest ATen
/// thread number seen in a loop of 1024 single-item chunks, plus one): torch's
/// thread count where the file was compiled with OpenMP, 1 where its
/// at::parallel_for is the serial fallback. The tests read it
/// (torch.ops.moe_mlir.expert_ops_team_size).
int64_t expertOpsTeamSize() {
  std::atomic<int64_t> most{0};
  at::parallel_for(0, 1024, 1, [&](int64_t, int64_t) {
    int64_t t = at::get_thread_num() + 1, m = most.load();
    while (t > m && !most.compare_exchange_weak(m, t)) {
    }
  });
  return most.load();
}

// moe_mlir::expert_mlp itself is a Python custom op (its checks, its autograd,
// its Python loop for other dtypes); these are the kernels its body calls.
TORCH_LIBRARY_FRAGMENT(moe_mlir, m) {
  m.def("expert_mlp_cpu(Tensor x, Tensor token, Tensor offsets, "
        "Tensor row_weight, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2, "
        "str gate, float alpha, float limit) -> Tensor");
  m.def("expert_mlp_backward_cpu(Tensor grad, Tensor x, Tensor token, "
        "Tensor offsets, Tensor row_weight, Tensor w1, Tensor? b1, Tensor w2, "
        "Tensor? b2, str gate, float alpha, float limit) -> (Tensor, Tensor, "
        "Tensor, Tensor, Tensor, Tensor)");
  m.def("grouped_mm_cpu(Tensor x, Tensor w, Tensor offsets, "
        "bool transposed=False) -> Tensor");
  m.def("grouped_mm_backward_cpu(Tensor grad, Tensor x, Tensor w, "
        "Tensor offsets, bool grad_w_like_w=False, bool transposed=False) "
        "-> (Tensor, Tensor)");
  m.def("expert_ops_team_size() -> int", &expertOpsTeamSize);
}

TORCH_LIBRARY_IMPL(moe_mlir, CPU, m) {
  m.impl("expert_mlp_cpu", &expertMlp);
  m.impl("expert_mlp_backward_cpu", &expertMlpBackward);
  m.impl("grouped_mm_cpu", &groupedMm);
  m.impl("grouped_mm_backward_cpu", &groupedMmBackward);
}
