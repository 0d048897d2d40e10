# libtorch from the project venv (scripts/install-python.sh), shared by the
# torch extension (lib/Runtime/Torch) and the reference tests (unittests).
#
# The PyPI wheel carries libtorch (headers, libtorch_cpu.so, libc10.so). We link
# those libraries directly: find_package(Torch) would probe the CUDA toolkit,
# and the wheel targets another CUDA than /usr/local/cuda.
#
# Defines MOE_TORCH_DIR (cache), MOE_TORCH_FOUND and, when found, the
# interface target moe_libtorch (once; the variables in every including scope).

file(GLOB _moe_torch_candidates "${MOE_SOURCE_DIR}/.venv/lib/python3*/site-packages/torch")
set(_moe_torch_default "")
if(_moe_torch_candidates)
  list(GET _moe_torch_candidates 0 _moe_torch_default)
endif()
set(MOE_TORCH_DIR "${_moe_torch_default}" CACHE PATH "The `torch` package directory of a PyTorch wheel (holds include/ and lib/)")

set(MOE_TORCH_FOUND OFF)
if(MOE_TORCH_DIR AND EXISTS "${MOE_TORCH_DIR}/lib/libtorch_cpu.so" AND EXISTS "${MOE_TORCH_DIR}/lib/libc10.so"
   AND EXISTS "${MOE_TORCH_DIR}/include/ATen/ATen.h")
  set(MOE_TORCH_FOUND ON)
endif()

if(MOE_TORCH_FOUND AND NOT TARGET moe_libtorch)
  # The wheel's C++ ABI must match ours (g++ >= 5 defaults to the new std::string ABI).
  file(STRINGS "${MOE_TORCH_DIR}/lib/libc10.so" _moe_c10_cxx11 REGEX "_ZNSt7__cxx11" LIMIT_COUNT 1)
  if(_moe_c10_cxx11)
    set(_moe_torch_abi 1)
  else()
    set(_moe_torch_abi 0)
  endif()
  message(STATUS "MoE: libtorch from ${MOE_TORCH_DIR} (_GLIBCXX_USE_CXX11_ABI=${_moe_torch_abi})")

  add_library(moe_libtorch INTERFACE)
  target_include_directories(moe_libtorch SYSTEM INTERFACE
    "${MOE_TORCH_DIR}/include"
    "${MOE_TORCH_DIR}/include/torch/csrc/api/include")
  target_compile_definitions(moe_libtorch INTERFACE _GLIBCXX_USE_CXX11_ABI=${_moe_torch_abi})
  # ATen's headers need C++20 (torch >= 2.10); the rest of the project stays at C++17.
  target_compile_features(moe_libtorch INTERFACE cxx_std_20)
  target_link_libraries(moe_libtorch INTERFACE
    "${MOE_TORCH_DIR}/lib/libtorch_cpu.so"
    "${MOE_TORCH_DIR}/lib/libc10.so")
endif()
