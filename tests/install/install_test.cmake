# The installed C++ package, as a project outside this tree sees it: installs the build tree
# MLA_BUILD_DIR to a fresh prefix under MLA_WORK_DIR (cmake --install), checks that the package
# names no path of the source or build tree, then configures, builds and runs the consumer project
# (consumer/, compiling MLA_CONSUMER_SOURCE) against that prefix alone.
#   cmake -DMLA_SOURCE_DIR=... -DMLA_BUILD_DIR=... -DMLA_WORK_DIR=... -DMLA_CONSUMER_SOURCE=...
#         [-DMLA_GENERATOR=... -DMLA_MAKE_PROGRAM=... -DMLA_CXX_COMPILER=... -DMLA_CUDA_ROOT=...]
#         -P install_test.cmake
cmake_minimum_required(VERSION 3.24)

foreach(var MLA_SOURCE_DIR MLA_BUILD_DIR MLA_WORK_DIR MLA_CONSUMER_SOURCE)
  if(NOT ${var})
    message(FATAL_ERROR "install_test.cmake: ${var} is not set")
  endif()
endforeach()

function(step name)
  string(REPLACE ";" " " shown "${ARGN}")
  message(STATUS "install test: ${name}: ${shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "install test: ${name} failed (${result}):\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix "${MLA_WORK_DIR}/prefix")
set(consumer_build "${MLA_WORK_DIR}/consumer-build")
file(REMOVE_RECURSE "${MLA_WORK_DIR}")

step(install "${CMAKE_COMMAND}" --install "${MLA_BUILD_DIR}" --prefix "${prefix}")

# The package is relocatable: its files locate everything from their own folder.
file(GLOB package_files "${prefix}/lib*/cmake/mla_decode/*.cmake")
if(NOT package_files)
  message(FATAL_ERROR "install test: no CMake package under ${prefix}/lib*/cmake/mla_decode")
endif()
foreach(f IN LISTS package_files)
  file(READ "${f}" text)
  foreach(tree "${MLA_SOURCE_DIR}" "${MLA_BUILD_DIR}")
    string(FIND "${text}" "${tree}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "install test: ${f} names ${tree}")
    endif()
  endforeach()
endforeach()

set(configure "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/consumer" -B "${consumer_build}"
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}"
    "-DMLA_CONSUMER_SOURCE=${MLA_CONSUMER_SOURCE}")
if(MLA_GENERATOR)
  list(APPEND configure -G "${MLA_GENERATOR}")
endif()
if(MLA_MAKE_PROGRAM)
  list(APPEND configure "-DCMAKE_MAKE_PROGRAM=${MLA_MAKE_PROGRAM}")
endif()
if(MLA_CXX_COMPILER)
  list(APPEND configure "-DCMAKE_CXX_COMPILER=${MLA_CXX_COMPILER}")
endif()
if(MLA_CUDA_ROOT)
  list(APPEND configure "-DCUDAToolkit_ROOT=${MLA_CUDA_ROOT}")
endif()
step(configure ${configure})
step(build "${CMAKE_COMMAND}" --build "${consumer_build}")

step(run "${consumer_build}/consumer")
message(STATUS "install test: consumer: ${step_output}")
