# Third-party dependencies. scripts/setup_deps.sh installs the pinned versions under .deps/; a
# wheel build (pip install .) gets CUTLASS and tvm-ffi from its build requirements (pyproject.toml).
# Every location can be overridden on the command line (MLA_CUTLASS_DIR, MLA_GTEST_DIR).

# CUTLASS / CuTe headers (pinned: nvidia-cutlass 4.2.0.0). Header-only: an INTERFACE target whose
# include folder is part of the build tree only (an installed mla_decode needs no CUTLASS).
# The headers come from, first match:
#   1. -DMLA_CUTLASS_DIR=/path (a CUTLASS checkout or install: the folder holding include/cute);
#   2. in a wheel build (pip install .), the nvidia-cutlass wheel that pyproject.toml lists as a
#      build requirement, found through the build environment's Python;
#   3. .deps/cutlass (scripts/setup_deps.sh), MLA_CUTLASS_DIR's default;
#   4. an nvidia-cutlass package of the Python interpreter CMake finds (Python_EXECUTABLE).
# The wheel keeps its headers under cutlass_library/source/include.
set(MLA_CUTLASS_PINNED_VERSION 4.2.0)
if(MLA_ENABLE_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "MLA_ENABLE_CUDA is ON but no nvcc was found; "
                        "install the CUDA 13 toolkit or configure with -DMLA_ENABLE_CUDA=OFF")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES 90a)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)

  # The CUTLASS root (holding include/cute) of the nvidia-cutlass wheel installed for
  # Python_EXECUTABLE, or "" where it has none. The package is located, not imported.
  function(mla_cutlass_from_python out_var)
    set(${out_var} "" PARENT_SCOPE)
    if(NOT Python_EXECUTABLE)
      return()
    endif()
    string(CONCAT locate "import importlib.util, os; "
                         "s = importlib.util.find_spec('cutlass_library'); "
                         "print(os.path.join(list(s.submodule_search_locations)[0], 'source'))")
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c "${locate}"
      OUTPUT_VARIABLE root
      OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE result
      ERROR_QUIET)
    if(result EQUAL 0 AND EXISTS "${root}/include/cute/tensor.hpp")
      file(TO_CMAKE_PATH "${root}" root)
      set(${out_var} "${root}" PARENT_SCOPE)
    endif()
  endfunction()

  set(_mla_cutlass_default "${PROJECT_SOURCE_DIR}/.deps/cutlass")
  set(MLA_CUTLASS_ROOT "")
  if(NOT MLA_CUTLASS_DIR STREQUAL _mla_cutlass_default)
    set(MLA_CUTLASS_ROOT "${MLA_CUTLASS_DIR}")
    set(_mla_cutlass_from "MLA_CUTLASS_DIR")
  elseif(SKBUILD)
    # scikit-build-core passes the build environment's interpreter as Python_EXECUTABLE.
    mla_cutlass_from_python(MLA_CUTLASS_ROOT)
    set(_mla_cutlass_from "the nvidia-cutlass package of ${Python_EXECUTABLE}")
  endif()
  if(NOT MLA_CUTLASS_ROOT AND EXISTS "${_mla_cutlass_default}/include/cute/tensor.hpp")
    set(MLA_CUTLASS_ROOT "${_mla_cutlass_default}")
    set(_mla_cutlass_from ".deps/cutlass")
  endif()
  if(NOT MLA_CUTLASS_ROOT AND NOT SKBUILD)
    if(NOT Python_EXECUTABLE)
      find_package(Python COMPONENTS Interpreter QUIET)
    endif()
    mla_cutlass_from_python(MLA_CUTLASS_ROOT)
    set(_mla_cutlass_from "the nvidia-cutlass package of ${Python_EXECUTABLE}")
  endif()
  if(NOT EXISTS "${MLA_CUTLASS_ROOT}/include/cute/tensor.hpp")
    if(MLA_CUTLASS_ROOT)
      set(_mla_where
          "under MLA_CUTLASS_DIR=${MLA_CUTLASS_ROOT} (expected include/cute/tensor.hpp)")
    else()
      set(_mla_where "(neither in .deps/cutlass nor in an nvidia-cutlass package of the Python \
interpreter ${Python_EXECUTABLE})")
    endif()
    message(FATAL_ERROR "CUTLASS headers not found ${_mla_where}; run scripts/setup_deps.sh, "
                        "pip install nvidia-cutlass==4.2.0.0, or point -DMLA_CUTLASS_DIR at a "
                        "CUTLASS checkout (or configure with -DMLA_ENABLE_CUDA=OFF: no device "
                        "code)")
  endif()

  set(_mla_cutlass_version "unknown version")
  if(EXISTS "${MLA_CUTLASS_ROOT}/include/cutlass/version.h")
    file(STRINGS "${MLA_CUTLASS_ROOT}/include/cutlass/version.h" _mla_cutlass_defines
         REGEX "^#define CUTLASS_(MAJOR|MINOR|PATCH) [0-9]+")
    string(REGEX REPLACE
           ".*CUTLASS_MAJOR ([0-9]+).*CUTLASS_MINOR ([0-9]+).*CUTLASS_PATCH ([0-9]+).*"
           "\\1.\\2.\\3" _mla_cutlass_version "${_mla_cutlass_defines}")
  endif()
  message(STATUS "CUTLASS ${_mla_cutlass_version} headers: ${MLA_CUTLASS_ROOT}/include "
                 "(from ${_mla_cutlass_from})")
  if(NOT _mla_cutlass_version STREQUAL MLA_CUTLASS_PINNED_VERSION)
    message(WARNING "CUTLASS ${_mla_cutlass_version} found; the project is built and tested with "
                    "the pinned ${MLA_CUTLASS_PINNED_VERSION} (nvidia-cutlass 4.2.0.0)")
  endif()
  add_library(mla_cutlass INTERFACE)
  target_include_directories(mla_cutlass SYSTEM INTERFACE
                             "$<BUILD_INTERFACE:${MLA_CUTLASS_ROOT}/include>")
endif()

# GoogleTest (pinned: Debian's googletest 1.12.1), built from source with the project.
if(MLA_BUILD_TESTS)
  if(NOT EXISTS "${MLA_GTEST_DIR}/CMakeLists.txt")
    message(FATAL_ERROR "GoogleTest sources not found at MLA_GTEST_DIR=${MLA_GTEST_DIR}; "
                        "run scripts/setup_deps.sh or point -DMLA_GTEST_DIR at a googletest tree")
  endif()
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  add_subdirectory("${MLA_GTEST_DIR}" "${CMAKE_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL)
endif()

# apache-tvm-ffi (pinned: 0.1.15.post2), for the Python package's module. Located through the
# Python interpreter that has it installed: scripts/build.sh passes the .deps/venv interpreter as
# Python_EXECUTABLE; a wheel build (pip install .) uses its build environment's.
if(MLA_BUILD_PYTHON)
  find_package(Python COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -m tvm_ffi.config --cmakedir
    OUTPUT_VARIABLE MLA_TVM_FFI_CMAKE_DIR
    OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE MLA_TVM_FFI_RESULT
    ERROR_QUIET)
  if(NOT MLA_TVM_FFI_RESULT EQUAL 0)
    message(FATAL_ERROR "MLA_BUILD_PYTHON is ON but ${Python_EXECUTABLE} has no apache-tvm-ffi; "
                        "run scripts/setup_deps.sh (it creates .deps/venv) or "
                        "pip install apache-tvm-ffi==0.1.15.post2")
  endif()
  find_package(tvm_ffi CONFIG REQUIRED PATHS "${MLA_TVM_FFI_CMAKE_DIR}" NO_DEFAULT_PATH)
endif()
