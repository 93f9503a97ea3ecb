# cuDNN's fused attention (SDPA) for memc.attention and attention_grad: backends/cuda/cudnn_sdpa.cc
# builds the attention graphs through NVIDIA's header-only cuDNN frontend. Included from the
# CUDA block of the top CMakeLists.txt (CUDAToolkit is found). Needs cuDNN 9 (cudnn.h and
# libcudnn) and the frontend's headers, which scripts/cudnn_frontend.sh fetches into
# third_party/cudnn_frontend/include; without either, the library is left out, saying why, and
# tests/cudnn.cmake registers a skipped test in its place.
#
# Defines memc_cudnn_sdpa (static, plain C++ compiled by the host compiler) and sets
# MEMC_HAVE_CUDNN_SDPA. Linked into the CUDA module (libmemc_cuda.so) only.

find_path(CUDNN_INCLUDE_DIR cudnn.h
          HINTS ${CUDAToolkit_INCLUDE_DIRS}
          PATHS /usr/local/cuda/include /usr/include /usr/include/x86_64-linux-gnu)
find_library(CUDNN_LIBRARY cudnn
             HINTS ${CUDAToolkit_LIBRARY_DIR}
             PATHS /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
          PATHS ${CMAKE_SOURCE_DIR}/third_party/cudnn_frontend/include NO_DEFAULT_PATH)

set(MEMC_HAVE_CUDNN_SDPA OFF)
if(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
  set(MEMC_CUDNN_SDPA_MISSING "no cuDNN (cudnn.h and libcudnn) found")
elseif(NOT CUDNN_FRONTEND_INCLUDE_DIR)
  set(MEMC_CUDNN_SDPA_MISSING "no cuDNN frontend headers (run scripts/cudnn_frontend.sh)")
else()
  add_library(memc_cudnn_sdpa STATIC ${CMAKE_SOURCE_DIR}/backends/cuda/cudnn_sdpa.cc)
  target_include_directories(memc_cudnn_sdpa PUBLIC ${CMAKE_SOURCE_DIR})
  # SYSTEM: the frontend's headers are not held to memc's warning flags.
  target_include_directories(memc_cudnn_sdpa SYSTEM PRIVATE ${CUDNN_FRONTEND_INCLUDE_DIR} ${CUDNN_INCLUDE_DIR})
  target_compile_definitions(memc_cudnn_sdpa PRIVATE MEMC_HAVE_CUDNN_FRONTEND=1 PUBLIC MEMC_HAVE_CUDNN_SDPA=1)
  # nvrtc: the frontend's headers also hold its runtime-compiled engines (not used for SDPA).
  target_link_libraries(memc_cudnn_sdpa PUBLIC memc_core ${CUDNN_LIBRARY} CUDA::cudart_static CUDA::nvrtc)  # memc_core: ir/attention_layout
  set(MEMC_HAVE_CUDNN_SDPA ON)
  message(STATUS "memc: cuDNN attention enabled (${CUDNN_LIBRARY}, frontend ${CUDNN_FRONTEND_INCLUDE_DIR})")
endif()
if(NOT MEMC_HAVE_CUDNN_SDPA)
  message(STATUS "memc: cuDNN attention not built: ${MEMC_CUDNN_SDPA_MISSING}")
endif()
