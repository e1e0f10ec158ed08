# Block-quantised weight kernels (included by bench/CMakeLists.txt): matvec / matmul
# per GGUF block type, GB/s of weight bytes.
add_executable(quant_bench ${CMAKE_CURRENT_LIST_DIR}/quant_bench.cc)
target_include_directories(quant_bench PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(quant_bench PRIVATE ptllm_ops benchmark::benchmark OpenMP::OpenMP_CXX)
