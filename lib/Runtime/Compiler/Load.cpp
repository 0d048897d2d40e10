//===- Load.cpp - Link a kernel object into the process -------------------===//
//
// Part of the MoE-MLIR project.
//
// moeJitLoad (include/MoE/Runtime/KernelJIT.h): one ORC LLJIT per process;
// each loaded object gets a JITDylib of its own (every kernel defines the
// same `kernel` symbols), whose undefined symbols are searched, in order, in
// the runtime libraries the caller names (opened with local visibility and
// searched through their handles: a kernel binds to the runtime the caller
// chose, e.g. libmoe_kernel_runtime.so's error slot, whatever else the
// process has put into its global scope), in the archives it names (one
// shared JITDylib: compiler-rt's helpers, loaded once), then in the process.
//
//===----------------------------------------------------------------------===//

#include "ErrorBuffer.h"
#include "MoE/Runtime/KernelJIT.h"

#include "llvm/ExecutionEngine/Orc/ExecutionUtils.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h"
#include "llvm/Support/DynamicLibrary.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/TargetSelect.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

using namespace llvm;
using namespace llvm::orc;

namespace {

/// What the session reported while the current load ran (the symbols a
/// link could not resolve): ORC reports them apart from the lookup's error.
std::string sessionErrors;

struct Jit {
  std::unique_ptr<LLJIT> jit;
  /// One JITDylib per archive, shared by every kernel.
  std::map<std::string, JITDylib *> archives;
  uint64_t loaded = 0;
};

Expected<Jit &> jit() {
  static Jit *instance = nullptr;
  if (instance)
    return *instance;
  InitializeNativeTarget();
  InitializeNativeTargetAsmPrinter();
  auto created = LLJITBuilder().create();
  if (!created)
    return created.takeError();
  instance = new Jit();
  instance->jit = std::move(*created);
  instance->jit->getExecutionSession().setErrorReporter([](Error e) {
    sessionErrors +=
        (sessionErrors.empty() ? "" : "; ") + toString(std::move(e));
  });
  return *instance;
}

Expected<JITDylib &> archive(Jit &j, const std::string &path) {
  auto it = j.archives.find(path);
  if (it != j.archives.end())
    return *it->second;
  // Its members may call into the C library: the default link order (the
  // process's symbols).
  auto created = j.jit->createJITDylib("archive:" + path);
  if (!created)
    return created.takeError();
  JITDylib &jd = *created;
  auto gen = StaticLibraryDefinitionGenerator::Load(j.jit->getObjLinkingLayer(),
                                                    path.c_str());
  if (!gen)
    return gen.takeError();
  jd.addGenerator(std::move(*gen));
  j.archives[path] = &jd;
  return jd;
}

Expected<void *> load(const char *objectPath, const char *const *libs,
                      int32_t numLibs, const char *const *archives,
                      int32_t numArchives, const char *symbol) {
  auto j = jit();
  if (!j)
    return j.takeError();
  auto buffer = MemoryBuffer::getFile(objectPath);
  if (!buffer)
    return createStringError(buffer.getError(),
                             Twine("cannot read ") + objectPath);
  LLJIT &lljit = *j->jit;
  char prefix = lljit.getDataLayout().getGlobalPrefix();
  auto jd = lljit.createJITDylib("kernel" + std::to_string(j->loaded++));
  if (!jd)
    return jd.takeError();
  for (int32_t i = 0; i < numLibs; ++i) {
    // Local visibility: the library's symbols reach this kernel only.
    void *handle = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
    if (!handle)
      return createStringError(Twine("cannot load ") + libs[i] + ": " +
                               dlerror());
    jd->addGenerator(std::make_unique<DynamicLibrarySearchGenerator>(
        sys::DynamicLibrary(handle), prefix));
  }
  // The link order after the kernel itself: the archives, then what
  // createJITDylib gave it (the process's symbols).
  JITDylibSearchOrder order;
  order.push_back({&*jd, JITDylibLookupFlags::MatchAllSymbols});
  for (int32_t i = 0; i < numArchives; ++i) {
    auto a = archive(*j, archives[i]);
    if (!a)
      return a.takeError();
    // compiler-rt builds its helpers with hidden visibility: match them all.
    order.push_back({&*a, JITDylibLookupFlags::MatchAllSymbols});
  }
  jd->withLinkOrderDo([&](const JITDylibSearchOrder &current) {
    for (const auto &entry : current)
      if (entry.first != &*jd)
        order.push_back(entry);
  });
  jd->setLinkOrder(std::move(order), /*LinkAgainstThisJITDylibFirst=*/false);
  if (Error e = lljit.addObjectFile(*jd, std::move(*buffer)))
    return std::move(e);
  auto init = lljit.lookup(*jd, "__moe_init");
  if (!init)
    return init.takeError();
  init->toPtr<void (*)()>()();
  auto address = lljit.lookup(*jd, symbol);
  if (!address)
    return address.takeError();
  return address->toPtr<void *>();
}

} // namespace

extern "C" void *moeJitLoad(const char *objectPath, const char *const *libs,
                            int32_t numLibs, const char *const *archives,
                            int32_t numArchives, const char *symbol, char *err,
                            int64_t errCap) {
  if (!objectPath || !symbol || (numLibs > 0 && !libs) ||
      (numArchives > 0 && !archives)) {
    mlir::moe::writeErrorBuffer(err, errCap,
                                "moeJitLoad: null path, symbol or list");
    return nullptr;
  }
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  sessionErrors.clear();
  auto address = load(objectPath, libs, numLibs, archives, numArchives, symbol);
  if (!address) {
    std::string why = toString(address.takeError());
    if (!sessionErrors.empty())
      why = sessionErrors + " (" + why + ")";
    mlir::moe::writeErrorBuffer(
        err, errCap, std::string("moeJitLoad: ") + objectPath + ": " + why);
    return nullptr;
  }
  return *address;
}
