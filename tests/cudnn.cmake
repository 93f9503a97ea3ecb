# cuDNN attention (backends/cuda/cudnn_sdpa.h): its graphs for the committed models' attention
# shapes validate for sm_90 without a GPU; the workspace query needs one and skips, saying why.
# Without the library (no nvcc, no cuDNN, or no frontend headers) one skipped test says which.
if(MEMC_HAVE_CUDNN_SDPA)
  add_executable(cudnn_sdpa_test ${CMAKE_CURRENT_SOURCE_DIR}/cuda/cudnn_sdpa_test.cc)
  target_link_libraries(cudnn_sdpa_test PRIVATE memc_cudnn_sdpa GTest::gtest GTest::gtest_main)
  target_include_directories(cudnn_sdpa_test SYSTEM PRIVATE ${CUDNN_INCLUDE_DIR})  # cudnnCreate
  gtest_discover_tests(cudnn_sdpa_test DISCOVERY_MODE PRE_TEST PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
else()
  if(NOT MEMC_CUDNN_SDPA_MISSING)
    set(MEMC_CUDNN_SDPA_MISSING "the CUDA backend is not built (no nvcc, or a sanitizer or fuzz build)")
  endif()
  add_test(NAME cudnn_sdpa_not_built COMMAND sh -c "echo 'cuDNN attention not built: ${MEMC_CUDNN_SDPA_MISSING}'; exit 77")
  set_tests_properties(cudnn_sdpa_not_built PROPERTIES SKIP_RETURN_CODE 77)
endif()
