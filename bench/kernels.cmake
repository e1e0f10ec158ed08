# Kernel micro-benchmarks (included by bench/CMakeLists.txt): matvec / matmul per
# weight dtype, attention over each cache storage, elementwise ops, and the
# machine's memory bandwidth. See docs/BENCHMARKS.md.
add_executable(kernels_bench ${CMAKE_CURRENT_LIST_DIR}/kernels_bench.cc)
target_include_directories(kernels_bench PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(kernels_bench PRIVATE ptllm_kv ptllm_ops ptllm_sampling benchmark::benchmark OpenMP::OpenMP_CXX)
