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
