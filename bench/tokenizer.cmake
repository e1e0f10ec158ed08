# Tokenizer benchmark (included by bench/CMakeLists.txt).
add_executable(tokenizer_bench ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bench.cc)
target_link_libraries(tokenizer_bench PRIVATE ptllm_tokenizer benchmark::benchmark)
target_compile_definitions(tokenizer_bench PRIVATE PTLLM_SHARED_DIR="${PTLLM_SHARED_DIR}")
