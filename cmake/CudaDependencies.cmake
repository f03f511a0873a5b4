# cuDNN (for the dense prefill attention through the header-only cudnn-frontend). The frontend
# headers come from the PyPI wheel nvidia-cudnn-frontend, unpacked by scripts/install_deps.sh
# into .deps/cudnn_frontend (or found under LYCHEE_DEPS_PREFIX / CMAKE_PREFIX_PATH).
find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/include
          PATH_SUFFIXES x86_64-linux-gnu REQUIRED)
find_library(CUDNN_LIBRARY NAMES cudnn HINTS /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu REQUIRED)
find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
          HINTS ${PROJECT_SOURCE_DIR}/.deps/cudnn_frontend/include ${LYCHEE_DEPS_PREFIX}/cudnn_frontend/include
          REQUIRED)
add_library(lychee_cudnn INTERFACE)
target_include_directories(lychee_cudnn SYSTEM INTERFACE ${CUDNN_INCLUDE_DIR} ${CUDNN_FRONTEND_INCLUDE_DIR})
find_package(CUDAToolkit REQUIRED)
# cudnn-frontend compiles some kernels at run time through NVRTC.
target_link_libraries(lychee_cudnn INTERFACE ${CUDNN_LIBRARY} CUDA::nvrtc)
message(STATUS "lychee: cuDNN ${CUDNN_LIBRARY}, frontend headers ${CUDNN_FRONTEND_INCLUDE_DIR}")

# NCCL, for tensor parallelism's all-reduce (cuda/common/nccl_comm.h). Optional: without it the
# CUDA build still works and cuda::NcclComm throws kUnsupported. The CUDA 13 toolkit on these
# machines ships it (include/nccl.h, lib/libnccl.so); Debian's libnccl-dev puts it under /usr;
# NCCL_ROOT points at any other install. LYCHEE_NCCL=OFF builds without it even when present.
set(LYCHEE_NCCL "AUTO" CACHE STRING "Link NCCL for tensor parallelism: AUTO, ON or OFF")
set(LYCHEE_HAS_NCCL OFF)
if(NOT LYCHEE_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h
            HINTS ${NCCL_ROOT}/include ${CUDAToolkit_LIBRARY_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY NAMES nccl
               HINTS ${NCCL_ROOT}/lib ${NCCL_ROOT}/lib64 ${CUDAToolkit_LIBRARY_ROOT}/lib
                     ${CUDAToolkit_LIBRARY_ROOT}/lib64 ${CUDAToolkit_LIBRARY_DIR})
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    add_library(lychee_nccl INTERFACE)
    target_include_directories(lychee_nccl SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(lychee_nccl INTERFACE ${NCCL_LIBRARY})
    set(LYCHEE_HAS_NCCL ON)
    message(STATUS "lychee: NCCL ${NCCL_LIBRARY}, headers ${NCCL_INCLUDE_DIR}")
  elseif(LYCHEE_NCCL STREQUAL "ON")
    message(FATAL_ERROR "LYCHEE_NCCL=ON but nccl.h / libnccl were not found (set NCCL_ROOT)")
  else()
    message(STATUS "lychee: NCCL not found: tensor parallelism unavailable (cuda::NcclComm throws kUnsupported)")
  endif()
endif()
