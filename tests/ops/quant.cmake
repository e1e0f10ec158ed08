# Block-quantised weight kernels (src/ops/quant*): layouts, quantisers, every ISA level.
ptllm_test(quant_test LIBS ptllm_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/quant_test.cc ${CMAKE_CURRENT_LIST_DIR}/quant_kernel_test.cc)
