# System dependencies, all from distribution packages (scripts/setup.sh installs them).
# LYCHEE_DEPS_PREFIX points at an unpacked prefix (headers + static libs) for machines
# where a -dev package is missing (the GPU machine lacks PCRE2 and utf8proc headers).
set(LYCHEE_DEPS_PREFIX "" CACHE PATH "Extra prefix with headers and static libraries")
if(LYCHEE_DEPS_PREFIX)
  list(PREPEND CMAKE_PREFIX_PATH ${LYCHEE_DEPS_PREFIX})
endif()

find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)

# OpenBLAS (cblas interface).
find_package(OpenBLAS CONFIG QUIET)
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread REQUIRED)
find_library(OPENBLAS_LIBRARY NAMES openblas REQUIRED)
add_library(lychee_blas INTERFACE)
target_include_directories(lychee_blas SYSTEM INTERFACE ${CBLAS_INCLUDE_DIR})
target_link_libraries(lychee_blas INTERFACE ${OPENBLAS_LIBRARY})

# PCRE2 (8-bit, with Unicode properties) for the tokenizers' pre-tokenizer patterns.
find_path(PCRE2_INCLUDE_DIR pcre2.h REQUIRED)
find_library(PCRE2_LIBRARY NAMES pcre2-8 REQUIRED)
add_library(lychee_pcre2 INTERFACE)
target_include_directories(lychee_pcre2 SYSTEM INTERFACE ${PCRE2_INCLUDE_DIR})
target_link_libraries(lychee_pcre2 INTERFACE ${PCRE2_LIBRARY})
target_compile_definitions(lychee_pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)

# utf8proc for Unicode normalisation (NFC, as Qwen2's tokenizer asks).
find_path(UTF8PROC_INCLUDE_DIR utf8proc.h REQUIRED)
find_library(UTF8PROC_LIBRARY NAMES utf8proc REQUIRED)
add_library(lychee_utf8proc INTERFACE)
target_include_directories(lychee_utf8proc SYSTEM INTERFACE ${UTF8PROC_INCLUDE_DIR})
target_link_libraries(lychee_utf8proc INTERFACE ${UTF8PROC_LIBRARY})
if(UTF8PROC_LIBRARY MATCHES "\\.a$")
  target_compile_definitions(lychee_utf8proc INTERFACE UTF8PROC_STATIC)
endif()

# cpp-httplib for the server. Debian's libcpp-httplib-dev ships a "split" httplib.h whose
# implementation is in libcpp-httplib.so (linked when found); the GPU machine's prefix has the
# full header-only httplib.h (scripts/gpu/make_deps.sh) and no library.
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
find_library(HTTPLIB_LIBRARY NAMES cpp-httplib)
add_library(lychee_httplib INTERFACE)
target_include_directories(lychee_httplib SYSTEM INTERFACE ${HTTPLIB_INCLUDE_DIR})
if(HTTPLIB_LIBRARY)
  target_link_libraries(lychee_httplib INTERFACE ${HTTPLIB_LIBRARY})
endif()
target_link_libraries(lychee_httplib INTERFACE Threads::Threads)
