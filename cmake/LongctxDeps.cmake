# Every dependency is a Debian 12 package (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(TBB REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(hwy REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
# oneDNN (libdnnl-dev): found directly because Debian's dnnl-config.cmake
# demands the OpenCL headers of its GPU runtime, which the CPU backend never uses.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
add_library(DNNL::dnnl UNKNOWN IMPORTED)
set_target_properties(DNNL::dnnl PROPERTIES IMPORTED_LOCATION ${DNNL_LIBRARY}
                                            INTERFACE_INCLUDE_DIRECTORIES ${DNNL_INCLUDE_DIR})
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)  # tokenizer pre-tokenizer regexes
# longctx-server: cpp-httplib (Debian builds it as a library; its .pc file
# gives the defines the library was built with) and nlohmann-json.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
find_package(nlohmann_json 3.10 REQUIRED)

# CUDA: AUTO builds gpu/ when nvcc is found.
set(LONGCTX_HAVE_CUDA OFF)
if(NOT LONGCTX_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # sm_80 (A100), sm_89 (L40/4090), sm_90 (H100/H200) code, plus PTX for newer GPUs.
      set(CMAKE_CUDA_ARCHITECTURES 80-real 89-real 90)
    endif()
    enable_language(CUDA)
    # C++20 like the other sources; CMake 3.25 does not know nvcc's flag for it.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(LONGCTX_HAVE_CUDA ON)
  elseif(LONGCTX_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LONGCTX_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()

set(LONGCTX_HAVE_PYTHON OFF)
if(NOT LONGCTX_PYTHON STREQUAL "OFF")
  if(NOT DEFINED PYTHON_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(PYTHON_EXECUTABLE /usr/bin/python3)  # Debian's python, not a pyenv shim
  endif()
  find_package(pybind11 CONFIG QUIET)
  if(pybind11_FOUND)
    set(LONGCTX_HAVE_PYTHON ON)
  elseif(LONGCTX_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "LONGCTX_PYTHON=ON but pybind11 was not found (apt-get install pybind11-dev)")
  endif()
endif()
