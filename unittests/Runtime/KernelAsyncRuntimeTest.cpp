//===- KernelAsyncRuntimeTest.cpp - libmoe_kernel_runtime's async ABI -----===//
//
// Part of the MoE-MLIR project.
//
// The mlirAsyncRuntime* entry points of lib/Runtime/CPU/AsyncRuntime.cpp as
// async-parallel-for uses them: tasks on the pool complete tokens of a group
// the caller waits for. The waits run queued tasks themselves, so a task that
// waits for tasks queued behind it completes on a pool of one thread
// (MOE_NUM_THREADS=2: the caller and one pool thread), where a wait that only
// slept would deadlock.
//
//===----------------------------------------------------------------------===//

#include "MoE/Runtime/KernelThreads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <memory>
#include <thread>
#include <vector>

extern "C" {
void *mlirAsyncRuntimeCreateToken();
void *mlirAsyncRuntimeCreateGroup(int64_t);
int64_t mlirAsyncRuntimeAddTokenToGroup(void *, void *);
void mlirAsyncRuntimeEmplaceToken(void *);
void mlirAsyncRuntimeAwaitAllInGroup(void *);
void mlirAsyncRuntimeAwaitToken(void *);
void mlirAsyncRuntimeDropRef(void *, int64_t);
void mlirAsyncRuntimeExecute(void *, void (*)(void *));
int64_t mlirAsyncRuntimGetNumWorkerThreads();
}

namespace {

struct Task {
  std::atomic<int64_t> *sum;
  int64_t value;
  void *token;
  int depth; // > 0: spawns two children and waits for them first
};

void runTask(void *p);

/// Spawns `n` tasks adding `1 << i` (each with `depth`) into `sum` and waits
/// for all of them.
void spawnAndWait(std::atomic<int64_t> &sum, int n, int depth) {
  void *group = mlirAsyncRuntimeCreateGroup(n);
  std::vector<Task> tasks(n);
  for (int i = 0; i < n; ++i) {
    tasks[i] = {&sum, int64_t{1} << i, mlirAsyncRuntimeCreateToken(), depth};
    mlirAsyncRuntimeAddTokenToGroup(tasks[i].token, group);
    mlirAsyncRuntimeExecute(&tasks[i], runTask);
  }
  mlirAsyncRuntimeAwaitAllInGroup(group);
  for (Task &t : tasks)
    mlirAsyncRuntimeDropRef(t.token, 1); // the caller's reference
  mlirAsyncRuntimeDropRef(group, 1);
}

void runTask(void *p) {
  auto *t = static_cast<Task *>(p);
  if (t->depth > 0) {
    std::atomic<int64_t> inner{0};
    spawnAndWait(inner, 2, t->depth - 1);
    EXPECT_EQ(inner.load(), 3);
  }
  t->sum->fetch_add(t->value);
  mlirAsyncRuntimeEmplaceToken(t->token); // drops the task's reference
}

/// Runs `f` on another thread; false when it has not returned within 60 s
/// (the thread is left behind: a deadlock fails the test, not the suite).
template <typename F> bool finishes(F f) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> ready = done->get_future();
  std::thread([f, done] {
    f();
    done->set_value();
  }).detach();
  return ready.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
}

TEST(KernelAsyncRuntime, PoolLeavesOneCoreToTheCaller) {
  // Set before the pool's first use (this binary's first test).
  EXPECT_EQ(mlirAsyncRuntimGetNumWorkerThreads(), 1);
}

TEST(KernelAsyncRuntime, GroupOfTasksCompletes) {
  for (int round = 0; round < 200; ++round) {
    std::atomic<int64_t> sum{0};
    spawnAndWait(sum, 16, 0);
    ASSERT_EQ(sum.load(), (int64_t{1} << 16) - 1);
  }
}

TEST(KernelAsyncRuntime, TasksWaitingForTasksDoNotDeadlockOnePoolThread) {
  // Every task waits for two children, three levels deep: the one pool
  // thread and the caller must run the queued children inside their waits.
  EXPECT_TRUE(finishes([] {
    for (int round = 0; round < 20; ++round) {
      std::atomic<int64_t> sum{0};
      spawnAndWait(sum, 4, 3);
      EXPECT_EQ(sum.load(), 15);
    }
  }));
}

TEST(KernelAsyncRuntime, AwaitTokenCompletedLater) {
  EXPECT_TRUE(finishes([] {
    std::atomic<int64_t> sum{0};
    Task t{&sum, 7, mlirAsyncRuntimeCreateToken(), 0};
    mlirAsyncRuntimeExecute(&t, runTask);
    mlirAsyncRuntimeAwaitToken(t.token);
    EXPECT_EQ(sum.load(), 7);
    mlirAsyncRuntimeDropRef(t.token, 1);
  }));
}

struct Recorded {
  std::thread::id *ranOn;
  void *token;
};

void recordThread(void *p) {
  auto *t = static_cast<Recorded *>(p);
  *t->ranOn = std::this_thread::get_id();
  mlirAsyncRuntimeEmplaceToken(t->token);
}

/// Returns once every pool thread is parked. Nothing else submits tasks
/// meanwhile, so each one ends its spin and parks: this waits for that state,
/// not for a duration (how long it takes depends on the machine's load).
void waitUntilThePoolIsParked() {
  while (moeKernelRuntimeParkedThreads() != mlirAsyncRuntimGetNumWorkerThreads())
    std::this_thread::yield();
}

TEST(KernelAsyncRuntime, HelpersRunTheTasksAndThePoolStaysAsleep) {
  // What the torch extension does around a kernel (KernelThreads.h): another
  // pool's thread serves the queue; the runtime's parked thread is not woken,
  // so every task runs on the helper or on the caller (in its wait). A pool
  // thread still spinning would take tasks too (the contract allows it), so
  // each round starts once the pool is parked.
  EXPECT_TRUE(finishes([] {
    const int64_t poolThreads = mlirAsyncRuntimGetNumWorkerThreads();
    for (int round = 0; round < 20; ++round) {
      waitUntilThePoolIsParked();
      int32_t done = 0;
      moeKernelRuntimeHelpersBegin();
      std::thread helper([&] { moeKernelRuntimeServe(&done); });
      constexpr int n = 16;
      std::vector<std::thread::id> ranOn(n);
      std::vector<Recorded> tasks(n);
      void *group = mlirAsyncRuntimeCreateGroup(n);
      for (int i = 0; i < n; ++i) {
        tasks[i] = {&ranOn[i], mlirAsyncRuntimeCreateToken()};
        mlirAsyncRuntimeAddTokenToGroup(tasks[i].token, group);
        mlirAsyncRuntimeExecute(&tasks[i], recordThread);
      }
      mlirAsyncRuntimeAwaitAllInGroup(group);
      __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
      const std::thread::id helperId = helper.get_id();
      helper.join();
      moeKernelRuntimeHelpersEnd();
      // Still parked: it was not woken while the helpers were registered,
      // and helpersEnd found no task left to wake it for.
      EXPECT_EQ(moeKernelRuntimeParkedThreads(), poolThreads);
      for (Recorded &t : tasks)
        mlirAsyncRuntimeDropRef(t.token, 1);
      mlirAsyncRuntimeDropRef(group, 1);
      for (std::thread::id id : ranOn)
        EXPECT_TRUE(id == helperId || id == std::this_thread::get_id());
    }
  }));
}

TEST(KernelAsyncRuntime, WithoutHelpersATaskWakesTheParkedPool) {
  // The caller waits on a future, not in the runtime (where it would run the
  // task itself): only a pool thread can run the task, and every one of them
  // is parked when it is submitted, so the submit must wake one.
  EXPECT_TRUE(finishes([] {
    constexpr int rounds = 20;
    // Destroyed once the pool has parked again, after the last set_value
    // has returned (get() may return while set_value is still running).
    std::vector<std::promise<std::thread::id>> ranOn(rounds);
    for (int round = 0; round < rounds; ++round) {
      waitUntilThePoolIsParked();
      mlirAsyncRuntimeExecute(&ranOn[round], [](void *p) {
        static_cast<std::promise<std::thread::id> *>(p)->set_value(
            std::this_thread::get_id());
      });
      EXPECT_NE(ranOn[round].get_future().get(), std::this_thread::get_id());
    }
    waitUntilThePoolIsParked();
  }));
}

} // namespace

int main(int argc, char **argv) {
  setenv("MOE_NUM_THREADS", "2", /*overwrite=*/1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
