//===- GlibcFloor.cpp - What glibc 2.31 and GCC 10's libstdc++ lack -------===//
//
// Part of the MoE-MLIR project.
//
// The wheel's libraries link against glibc 2.31 and GCC 10's libstdc++
// (scripts/glibc-sysroot.sh; CMakeLists.txt: moe_link_glibc_floor), so that
// they load on the systems users have (manylinux_2_31). They are compiled on
// Debian 12 against its headers and LLVM 22's static libraries, whose code
// references a few things that only newer libraries define; each is defined
// here (every library has its own copy, none exported: -Wl,--exclude-libs),
// from what the old libraries have. Nothing else is needed: the other newer symbol
// versions (pthread_create@GLIBC_2.34, stat@GLIBC_2.33, ...) are new versions
// of old functions, which the linker binds at their 2.31 versions, or live in
// 2.31's libc_nonshared.a.
//
//===----------------------------------------------------------------------===//

#include <malloc.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>

#define MOE_HIDDEN __attribute__((visibility("hidden")))

extern "C" {

// glibc 2.32: libstdc++'s inline reference counting reads it to skip atomics
// in a single-threaded process. 0 ("not known to be single-threaded"): always
// atomic, which is what GCC 10's headers did.
MOE_HIDDEN char __libc_single_threaded = 0;

// glibc 2.33 (LLVM's Process::GetMallocUsage): mallinfo's int counters,
// widened.
MOE_HIDDEN struct mallinfo2 mallinfo2(void) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  struct mallinfo m = mallinfo();
#pragma GCC diagnostic pop
  struct mallinfo2 r;
  r.arena = static_cast<unsigned>(m.arena);
  r.ordblks = static_cast<unsigned>(m.ordblks);
  r.smblks = static_cast<unsigned>(m.smblks);
  r.hblks = static_cast<unsigned>(m.hblks);
  r.hblkhd = static_cast<unsigned>(m.hblkhd);
  r.usmblks = static_cast<unsigned>(m.usmblks);
  r.fsmblks = static_cast<unsigned>(m.fsmblks);
  r.uordblks = static_cast<unsigned>(m.uordblks);
  r.fordblks = static_cast<unsigned>(m.fordblks);
  r.keepcost = static_cast<unsigned>(m.keepcost);
  return r;
}

// glibc 2.36 (libstdc++'s and LLVM's random seeds): the kernel's random
// source (getrandom, glibc 2.25), retried when a signal interrupts it.
MOE_HIDDEN uint32_t arc4random(void) {
  uint32_t value = 0;
  while (getrandom(&value, sizeof(value), 0) != sizeof(value))
    if (errno != EINTR)
      break;
  return value;
}

// The exported constructor and destructor of std::exception_ptr (CXXABI_1.3.3,
// in every libstdc++ since GCC 4.4), by name: GCC 12's headers define both
// inline, calling the reference-count members below.
void _ZNSt15__exception_ptr13exception_ptrC1ERKS0_(void *self,
                                                   const void *other);
void _ZNSt15__exception_ptr13exception_ptrD1Ev(void *self);
}

namespace std {

// GLIBCXX_3.4.29 (GCC 11): what `new T[n]` throws for a bad n.
MOE_HIDDEN void __throw_bad_array_new_length() {
  throw std::bad_array_new_length();
}

namespace __exception_ptr {
// CXXABI_1.3.13 (GCC 11) exported the exception's reference count. One more
// reference: a copy made by the old constructor, never destroyed.
void exception_ptr::_M_addref() noexcept {
  alignas(exception_ptr) unsigned char copy[sizeof(exception_ptr)];
  _ZNSt15__exception_ptr13exception_ptrC1ERKS0_(copy, this);
}
// One reference fewer: the old destructor on a bitwise copy (this one keeps
// its pointer, as the member it stands for does).
void exception_ptr::_M_release() noexcept {
  alignas(exception_ptr) unsigned char copy[sizeof(exception_ptr)];
  std::memcpy(copy, static_cast<void *>(this), sizeof(copy));
  _ZNSt15__exception_ptr13exception_ptrD1Ev(copy);
}
} // namespace __exception_ptr

} // namespace std
