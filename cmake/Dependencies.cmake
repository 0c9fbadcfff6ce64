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
