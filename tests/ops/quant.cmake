# Block-quantised weight kernels (src/ops/quant*): layouts, quantisers, every ISA level.
ptllm_test(quant_test LIBS ptllm_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/quant_test.cc ${CMAKE_CURRENT_LIST_DIR}/quant_kernel_test.cc)
# llama.cpp-written GGUF blocks (../shared/models/flagship-27m-gguf) as the layout reference.
ptllm_test(quant_gguf_test LIBS ptllm_io ptllm_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/quant_gguf_test.cc)
