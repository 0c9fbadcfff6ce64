# Third-party dependencies. scripts/setup_deps.sh installs the pinned versions under .deps/;
# every location can be overridden on the command line (MLA_CUTLASS_DIR, MLA_GTEST_DIR).

# CUTLASS / CuTe headers (pinned: nvidia-cutlass 4.2.0.0). Header-only: an INTERFACE target.
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

  if(NOT EXISTS "${MLA_CUTLASS_DIR}/include/cute/tensor.hpp")
    message(FATAL_ERROR "CUTLASS headers not found under MLA_CUTLASS_DIR=${MLA_CUTLASS_DIR} "
                        "(expected include/cute/tensor.hpp); run scripts/setup_deps.sh or point "
                        "-DMLA_CUTLASS_DIR at a CUTLASS checkout")
  endif()
  add_library(mla_cutlass INTERFACE)
  target_include_directories(mla_cutlass SYSTEM INTERFACE "${MLA_CUTLASS_DIR}/include")
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
