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

# cpp-httplib for the server, header-only, from Debian 13's source package (0.18.7 with Debian's
# security fixes; Debian 12's 0.11 reads chunked bodies without a limit and has no header-count
# limit): scripts/fetch_httplib.sh stages it in .deps/httplib (scripts/install_deps.sh runs it;
# the GPU machine gets it in the carried .deps). Debian 12's split /usr/include/httplib.h, if
# installed, is never used: its implementation lives in a library this build does not link.
set(LYCHEE_HTTPLIB_MIN_VERSION 0.18.7)
find_path(LYCHEE_HTTPLIB_INCLUDE_DIR httplib.h PATHS ${PROJECT_SOURCE_DIR}/.deps/httplib/include NO_DEFAULT_PATH)
if(NOT LYCHEE_HTTPLIB_INCLUDE_DIR)
  message(FATAL_ERROR "cpp-httplib >= ${LYCHEE_HTTPLIB_MIN_VERSION} is not staged in "
                      "${PROJECT_SOURCE_DIR}/.deps/httplib: run scripts/fetch_httplib.sh")
endif()
file(STRINGS ${LYCHEE_HTTPLIB_INCLUDE_DIR}/httplib.h HTTPLIB_VERSION_LINE REGEX "^#define CPPHTTPLIB_VERSION \"")
string(REGEX REPLACE ".*\"([0-9.]+)\".*" "\\1" HTTPLIB_VERSION "${HTTPLIB_VERSION_LINE}")
if(NOT HTTPLIB_VERSION OR HTTPLIB_VERSION VERSION_LESS LYCHEE_HTTPLIB_MIN_VERSION)
  message(FATAL_ERROR "${LYCHEE_HTTPLIB_INCLUDE_DIR}/httplib.h is cpp-httplib '${HTTPLIB_VERSION}'; the server needs "
                      ">= ${LYCHEE_HTTPLIB_MIN_VERSION} (delete .deps/httplib and run scripts/fetch_httplib.sh)")
endif()
add_library(lychee_httplib INTERFACE)
target_include_directories(lychee_httplib SYSTEM BEFORE INTERFACE ${LYCHEE_HTTPLIB_INCLUDE_DIR})
# poll() instead of select(): select cannot watch a descriptor >= FD_SETSIZE (1024).
target_compile_definitions(lychee_httplib INTERFACE CPPHTTPLIB_USE_POLL)
target_link_libraries(lychee_httplib INTERFACE Threads::Threads)
