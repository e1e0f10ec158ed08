# Block-quantised weight kernels (src/ops/quant*): layouts, quantisers, every ISA level.
ptllm_test(quant_test LIBS ptllm_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/quant_test.cc ${CMAKE_CURRENT_LIST_DIR}/quant_kernel_test.cc
           ${CMAKE_CURRENT_LIST_DIR}/quant_relay_test.cc)

# llama.cpp-written GGUF blocks (../shared/models/flagship-27m-gguf) as the layout
# reference. "slow": it quantises the whole 27M model to the K types, which takes
# minutes in the Debug + sanitizer pass; the Release pass runs it (~15 s).
add_executable(quant_gguf_test ${CMAKE_CURRENT_LIST_DIR}/quant_gguf_test.cc)
target_link_libraries(quant_gguf_test PRIVATE ptllm_io ptllm_ops ptllm_testutil GTest::gtest GTest::gtest_main)
gtest_discover_tests(quant_gguf_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 900 LABELS slow ENVIRONMENT OMP_WAIT_POLICY=passive)
