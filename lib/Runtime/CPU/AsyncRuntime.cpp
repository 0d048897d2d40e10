//===- AsyncRuntime.cpp - The async runtime ABI for AOT-compiled kernels --===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The `mlirAsyncRuntime*` entry points that `convert-async-to-llvm` emits
// calls to, for the kernels moe_mlir compiles ahead of time into shared
// objects (python/moe_mlir/runtime/cache.py). Upstream's implementation
// (libmlir_async_runtime.so) links libLLVM, which must not be loaded into a
// torch process that may also load Triton's LLVM; this one is plain C++.
//
// Contract (that of mlir/ExecutionEngine/AsyncRuntime.h):
// - tokens and values are created with two references (the caller's and the
//   task's, dropped when the task emplaces them); groups with one;
// - a token/value/group becomes ready exactly once; awaiters registered
//   before that run on the thread that makes it ready, after it run inline;
// - `mlirAsyncRuntimeExecute` runs a coroutine resume function on the pool.
//
// The pool: a fixed set of worker threads taking tasks from one FIFO. A
// worker that finds the queue empty spins briefly (kernels are short and
// come in bursts) and then parks on a condition variable, so idle workers
// cost nothing. The thread that waits for a token or a group (the kernel's
// caller, which ran a share of the loop itself) runs queued tasks while it
// waits and spins a while before it sleeps: the other shares of a balanced
// loop end within microseconds of its own, and a futex sleep and wake-up
// cost 30-50 us on a virtual machine, more than a decode-size kernel. With
// that, the pool has one thread per core less (the caller is a worker), and
// a task that waits for others cannot deadlock a small pool.
//
//===----------------------------------------------------------------------===//

#include "MoE/Runtime/KernelThreads.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <pthread.h>
#include <thread>
#include <vector>

namespace {

/// One step of a spin-wait: a pause on x86 (frees the core's other
/// hyperthread and avoids a memory-order flush on exit).
inline void cpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

//===----------------------------------------------------------------------===//
// Thread pool
//===----------------------------------------------------------------------===//

class Pool {
public:
  explicit Pool(unsigned n) {
    for (unsigned i = 0; i < n; ++i)
      threads.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(mu);
      stopping = true;
    }
    cv.notify_all();
    for (std::thread &t : threads)
      t.join();
  }
  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> l(mu);
      queue.push_back(std::move(task));
      pending.fetch_add(1, std::memory_order_release);
    }
    if (helpers.load(std::memory_order_acquire) == 0 &&
        parked.load(std::memory_order_acquire) > 0)
      cv.notify_one();
  }
  /// Threads of another pool run the tasks meanwhile (KernelThreads.h).
  void helpersBegin() { helpers.fetch_add(1, std::memory_order_acq_rel); }
  void helpersEnd() {
    if (helpers.fetch_sub(1, std::memory_order_acq_rel) != 1)
      return;
    // Tasks of another caller's kernel submitted meanwhile woke nobody.
    bool queued;
    {
      std::lock_guard<std::mutex> l(mu);
      queued = !queue.empty();
    }
    if (queued)
      cv.notify_all();
  }
  int64_t size() const { return static_cast<int64_t>(threads.size()); }
  int64_t parkedThreads() const {
    return parked.load(std::memory_order_acquire);
  }

  /// Runs one queued task on the calling thread; false when there is none.
  bool runOne() {
    std::function<void()> task;
    if (pending.load(std::memory_order_acquire) <= 0 || !tryPop(task))
      return false;
    task();
    return true;
  }

private:
  bool tryPop(std::function<void()> &task) {
    std::lock_guard<std::mutex> l(mu);
    if (queue.empty())
      return false;
    task = std::move(queue.front());
    queue.pop_front();
    pending.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }

  void loop() {
    std::function<void()> task;
    for (;;) {
      // Spin a little before parking: the next kernel's tasks usually come
      // within microseconds.
      for (int spin = 0; spin < 4000; ++spin) {
        if (runOne())
          spin = 0;
        cpuRelax();
      }
      std::unique_lock<std::mutex> l(mu);
      parked.fetch_add(1, std::memory_order_release);
      // While helpers serve the queue a parked worker stays parked, even when
      // its wait returns without a notify (a spurious wake-up) or a
      // helpersEnd's notify_all meets the next caller's helpersBegin: the
      // last helpersEnd wakes it for what is left (KernelThreads.h).
      cv.wait(l, [this] {
        return stopping || (!queue.empty() &&
                            helpers.load(std::memory_order_acquire) == 0);
      });
      parked.fetch_sub(1, std::memory_order_relaxed);
      if (stopping && queue.empty())
        return;
      task = std::move(queue.front());
      queue.pop_front();
      pending.fetch_sub(1, std::memory_order_relaxed);
      l.unlock();
      task();
      task = nullptr;
    }
  }

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  std::atomic<int64_t> pending{0};
  std::atomic<int> parked{0};
  std::atomic<int> helpers{0};
  bool stopping = false;
  std::vector<std::thread> threads;
};

/// The threads besides the caller: one per core (or per requested thread)
/// but the caller's, at least one.
unsigned poolSize() {
  unsigned n = std::thread::hardware_concurrency();
  for (const char *var : {"MOE_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const char *v = std::getenv(var)) {
      long requested = std::strtol(v, nullptr, 10);
      if (requested >= 1) {
        n = static_cast<unsigned>(requested);
        break;
      }
    }
  return n > 1 ? n - 1 : 1;
}

std::atomic<Pool *> thePool{nullptr};
std::mutex poolMutex;

Pool &pool() {
  Pool *p = thePool.load(std::memory_order_acquire);
  if (p)
    return *p;
  std::lock_guard<std::mutex> l(poolMutex);
  p = thePool.load(std::memory_order_relaxed);
  if (!p) {
    // Leaked on purpose: joining workers from a static destructor at exit
    // can deadlock when the process exits from inside a task.
    p = new Pool(poolSize());
    thePool.store(p, std::memory_order_release);
    // A forked child (e.g. a DataLoader worker) has none of the parent's
    // threads: it starts a pool of its own on first use.
    static bool registered = [] {
      pthread_atfork(nullptr, nullptr, [] {
        thePool.store(nullptr, std::memory_order_relaxed);
      });
      return true;
    }();
    (void)registered;
  }
  return *p;
}

/// Waits until `done()`: runs queued tasks meanwhile, spins up to
/// kWaitSpin, then sleeps on `cv` (whose notifier changes `done` under `mu`).
constexpr auto kWaitSpin = std::chrono::microseconds(100);

template <typename Done>
void helpSpinThenBlock(Done done, std::mutex &mu,
                       std::condition_variable &cv) {
  auto start = std::chrono::steady_clock::now();
  for (unsigned spin = 0; !done(); ++spin) {
    if (pool().runOne()) {
      start = std::chrono::steady_clock::now();
      continue;
    }
    if (spin % 64 == 63 &&
        std::chrono::steady_clock::now() - start > kWaitSpin) {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, done);
      return;
    }
    cpuRelax();
  }
}

//===----------------------------------------------------------------------===//
// Reference-counted objects
//===----------------------------------------------------------------------===//

struct Object {
  explicit Object(int64_t refs) : refs(refs) {}
  virtual ~Object() = default;
  void addRef(int64_t n) { refs.fetch_add(n, std::memory_order_relaxed); }
  void dropRef(int64_t n) {
    if (refs.fetch_sub(n, std::memory_order_acq_rel) == n)
      delete this;
  }
  std::atomic<int64_t> refs;
};

/// Something that becomes ready (or an error) once and runs its awaiters
/// then: the common part of tokens and values.
struct Readiness : Object {
  explicit Readiness(int64_t refs) : Object(refs) {}
  enum : int8_t { kPending = 0, kReady = 1, kError = 2 };

  bool done() const { return state.load(std::memory_order_acquire) != 0; }
  bool failed() const {
    return state.load(std::memory_order_acquire) == kError;
  }
  void finish(int8_t s) {
    std::vector<std::function<void()>> run;
    {
      std::lock_guard<std::mutex> l(mu);
      state.store(s, std::memory_order_release);
      run.swap(awaiters);
    }
    cv.notify_all();
    for (auto &f : run)
      f();
    dropRef(1); // the task's reference
  }
  void wait() {
    helpSpinThenBlock([this] { return done(); }, mu, cv);
  }
  /// Runs `f` now when ready, else when it becomes ready.
  void then(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (!done()) {
        awaiters.push_back(std::move(f));
        return;
      }
    }
    f();
  }

  std::atomic<int8_t> state{kPending};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::function<void()>> awaiters;
};

struct Token : Readiness {
  Token() : Readiness(2) {}
};

struct Value : Readiness {
  explicit Value(int64_t size) : Readiness(2), storage(size) {}
  std::vector<char> storage;
};

struct Group : Object {
  Group() : Object(1) {}
  /// Tokens added and not yet ready.
  std::atomic<int64_t> pending{0};
  std::atomic<int64_t> errors{0};
  std::atomic<int64_t> added{0};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::function<void()>> awaiters;

  void tokenDone(bool error) {
    if (error)
      errors.fetch_add(1, std::memory_order_relaxed);
    std::vector<std::function<void()>> run;
    {
      std::lock_guard<std::mutex> l(mu);
      if (pending.fetch_sub(1, std::memory_order_acq_rel) != 1)
        return;
      run.swap(awaiters);
    }
    cv.notify_all();
    for (auto &f : run)
      f();
  }
  void wait() {
    helpSpinThenBlock(
        [this] { return pending.load(std::memory_order_acquire) == 0; }, mu,
        cv);
  }
  void then(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (pending.load(std::memory_order_acquire) != 0) {
        awaiters.push_back(std::move(f));
        return;
      }
    }
    f();
  }
};

using Resume = void (*)(void *);

} // namespace

//===----------------------------------------------------------------------===//
// The C ABI
//===----------------------------------------------------------------------===//

extern "C" {

void moeKernelRuntimeHelpersBegin() { pool().helpersBegin(); }
void moeKernelRuntimeHelpersEnd() { pool().helpersEnd(); }
int64_t moeKernelRuntimeParkedThreads() { return pool().parkedThreads(); }
void moeKernelRuntimeServe(const int32_t *done) {
  Pool &p = pool();
  while (!__atomic_load_n(done, __ATOMIC_ACQUIRE))
    if (!p.runOne())
      cpuRelax();
}

void mlirAsyncRuntimeAddRef(void *obj, int64_t count) {
  static_cast<Object *>(obj)->addRef(count);
}

void mlirAsyncRuntimeDropRef(void *obj, int64_t count) {
  static_cast<Object *>(obj)->dropRef(count);
}

void *mlirAsyncRuntimeCreateToken() { return static_cast<Object *>(new Token); }

void *mlirAsyncRuntimeCreateValue(int64_t size) {
  return static_cast<Object *>(new Value(size));
}

void *mlirAsyncRuntimeCreateGroup(int64_t /*size*/) {
  return static_cast<Object *>(new Group);
}

int64_t mlirAsyncRuntimeAddTokenToGroup(void *tokenPtr, void *groupPtr) {
  auto *token = static_cast<Token *>(static_cast<Object *>(tokenPtr));
  auto *group = static_cast<Group *>(static_cast<Object *>(groupPtr));
  int64_t rank = group->added.fetch_add(1, std::memory_order_relaxed);
  group->pending.fetch_add(1, std::memory_order_acq_rel);
  // The group must outlive the token's completion.
  group->addRef(1);
  token->then([group, token] {
    group->tokenDone(token->failed());
    group->dropRef(1);
  });
  return rank;
}

bool mlirAsyncRuntimeIsGroupError(void *groupPtr) {
  return static_cast<Group *>(static_cast<Object *>(groupPtr))
             ->errors.load() > 0;
}

// A token and a value complete alike (both are a Readiness): the value entry
// points are the token ones.
void mlirAsyncRuntimeEmplaceToken(void *t) {
  static_cast<Readiness *>(static_cast<Object *>(t))->finish(Readiness::kReady);
}
void mlirAsyncRuntimeSetTokenError(void *t) {
  static_cast<Readiness *>(static_cast<Object *>(t))->finish(Readiness::kError);
}
bool mlirAsyncRuntimeIsTokenError(void *t) {
  return static_cast<Readiness *>(static_cast<Object *>(t))->failed();
}
void mlirAsyncRuntimeAwaitToken(void *t) {
  static_cast<Readiness *>(static_cast<Object *>(t))->wait();
}
void mlirAsyncRuntimeEmplaceValue(void *v) { mlirAsyncRuntimeEmplaceToken(v); }
void mlirAsyncRuntimeSetValueError(void *v) { mlirAsyncRuntimeSetTokenError(v); }
bool mlirAsyncRuntimeIsValueError(void *v) {
  return mlirAsyncRuntimeIsTokenError(v);
}
void mlirAsyncRuntimeAwaitValue(void *v) { mlirAsyncRuntimeAwaitToken(v); }
void mlirAsyncRuntimeAwaitAllInGroup(void *g) {
  static_cast<Group *>(static_cast<Object *>(g))->wait();
}

void *mlirAsyncRuntimeGetValueStorage(void *v) {
  return static_cast<Value *>(static_cast<Object *>(v))->storage.data();
}

void mlirAsyncRuntimeExecute(void *handle, Resume resume) {
  pool().submit([handle, resume] { resume(handle); });
}

void mlirAsyncRuntimeAwaitTokenAndExecute(void *t, void *handle,
                                          Resume resume) {
  static_cast<Token *>(static_cast<Object *>(t))->then([handle, resume] {
    resume(handle);
  });
}
void mlirAsyncRuntimeAwaitValueAndExecute(void *v, void *handle,
                                          Resume resume) {
  static_cast<Value *>(static_cast<Object *>(v))->then([handle, resume] {
    resume(handle);
  });
}
void mlirAsyncRuntimeAwaitAllInGroupAndExecute(void *g, void *handle,
                                               Resume resume) {
  static_cast<Group *>(static_cast<Object *>(g))->then([handle, resume] {
    resume(handle);
  });
}

// (sic: upstream's spelling, which async-to-llvm emits.)
int64_t mlirAsyncRuntimGetNumWorkerThreads() { return pool().size(); }

} // extern "C"
