# Shared by the device-side builds (test/GPU/device, bench/gpu/device), which run on a GPU machine without LLVM:
# the host runtime libraries built from source, and a shared library made from an object that
# tools/moe-aot/moe-aot.py compiled ahead of time. Needs MOE_SOURCE_DIR and find_package(CUDAToolkit).

add_library(moe_cpu_runtime SHARED ${MOE_SOURCE_DIR}/lib/Runtime/ErrorReporting.cpp)
target_include_directories(moe_cpu_runtime PUBLIC ${MOE_SOURCE_DIR}/include)

add_library(moe_cuda_runtime SHARED ${MOE_SOURCE_DIR}/lib/Runtime/CUDA/MoECudaRuntime.cpp)
set_target_properties(moe_cuda_runtime PROPERTIES CXX_VISIBILITY_PRESET hidden)
target_link_libraries(moe_cuda_runtime PRIVATE moe_cpu_runtime CUDA::cuda_driver)

# moe_add_aot_library(NAME OBJECT HINT): lib<NAME>.so from OBJECT, linked to the CUDA runtime; a configure error
# naming HINT (the command that makes OBJECT) when it is missing.
function(moe_add_aot_library name object hint)
  if(NOT EXISTS "${object}")
    message(FATAL_ERROR "'${object}' does not exist (run ${hint})")
  endif()
  add_library(${name} SHARED "${object}")
  set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX)
  target_link_libraries(${name} PRIVATE moe_cuda_runtime)
endfunction()
