# The vcpkg port's CMake steps produce the install tree `cmake --install` produces (cmake -P).
#   -DSOURCE_DIR=<repo> -DWORK_DIR=<scratch> -DGENERATOR=<generator>
# vcpkg itself is not installed here: its helpers are stood in for by functions that do what their
# documentation says for this port (a configure, an install, a config fixup that has nothing to
# move because the package config already lives in share/<port>, a copyright file), and the
# portfile runs unchanged. The port's tree must equal the plain one, plus vcpkg's own copyright
# and usage files.
cmake_minimum_required(VERSION 3.22)
file(REMOVE_RECURSE ${WORK_DIR})
set(PORT kvpolicy)
set(CURRENT_PACKAGES_DIR ${WORK_DIR}/vcpkg/packages)
set(CURRENT_BUILDTREES_DIR ${WORK_DIR}/vcpkg/buildtrees)
set(FEATURES core cpu)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

function(vcpkg_check_features)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_FEATURE_OPTIONS" "FEATURES")
  set(options "")
  list(LENGTH arg_FEATURES n)
  math(EXPR last "${n} - 1")
  foreach(i RANGE 0 ${last} 2)
    math(EXPR j "${i} + 1")
    list(GET arg_FEATURES ${i} feature)
    list(GET arg_FEATURES ${j} option)
    if(feature IN_LIST FEATURES)
      list(APPEND options "-D${option}=ON")
    else()
      list(APPEND options "-D${option}=OFF")
    endif()
  endforeach()
  set(${arg_OUT_FEATURE_OPTIONS} "${options}" PARENT_SCOPE)
endfunction()

function(vcpkg_cmake_configure)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "SOURCE_PATH" "OPTIONS")
  run(${CMAKE_COMMAND} -S ${arg_SOURCE_PATH} -B ${CURRENT_BUILDTREES_DIR}/rel -G ${GENERATOR}
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=${CURRENT_PACKAGES_DIR} ${arg_OPTIONS})
endfunction()

function(vcpkg_cmake_install)
  run(${CMAKE_COMMAND} --build ${CURRENT_BUILDTREES_DIR}/rel)
  run(${CMAKE_COMMAND} --install ${CURRENT_BUILDTREES_DIR}/rel)
endfunction()

function(vcpkg_cmake_config_fixup)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "CONFIG_PATH;PACKAGE_NAME" "")
  if(NOT arg_PACKAGE_NAME)
    set(arg_PACKAGE_NAME ${PORT})
  endif()
  if(NOT arg_CONFIG_PATH STREQUAL "share/${arg_PACKAGE_NAME}")
    message(FATAL_ERROR "config fixup would move ${arg_CONFIG_PATH} to share/${arg_PACKAGE_NAME}: the CMake "
                        "install and the port's tree would differ")
  endif()
  if(NOT EXISTS ${CURRENT_PACKAGES_DIR}/${arg_CONFIG_PATH}/kvpolicyConfig.cmake)
    message(FATAL_ERROR "no kvpolicyConfig.cmake in ${arg_CONFIG_PATH}")
  endif()
endfunction()

function(vcpkg_install_copyright)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "FILE_LIST")
  file(READ ${arg_FILE_LIST} text)
  file(WRITE ${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright "${text}")
endfunction()

include(${SOURCE_DIR}/ports/kvpolicy/portfile.cmake)

# The plain install, with the options a user installing from source uses.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/plain/build -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
    -DKVPOLICY_BUILD_TESTS=OFF -DKVPOLICY_BUILD_EXAMPLES=OFF -DKVPOLICY_BUILD_BENCHMARKS=OFF -DKVPOLICY_ENABLE_CUDA=OFF)
run(${CMAKE_COMMAND} --install ${WORK_DIR}/plain/build --prefix ${WORK_DIR}/plain/prefix)

file(GLOB_RECURSE port_files RELATIVE ${CURRENT_PACKAGES_DIR} ${CURRENT_PACKAGES_DIR}/*)
file(GLOB_RECURSE plain_files RELATIVE ${WORK_DIR}/plain/prefix ${WORK_DIR}/plain/prefix/*)
list(REMOVE_ITEM port_files share/kvpolicy/copyright share/kvpolicy/usage)
list(SORT port_files)
list(SORT plain_files)
if(NOT port_files STREQUAL plain_files)
  message(FATAL_ERROR "install trees differ:\nport:  ${port_files}\nplain: ${plain_files}")
endif()
foreach(f ${plain_files})
  file(SHA256 ${CURRENT_PACKAGES_DIR}/${f} a)
  file(SHA256 ${WORK_DIR}/plain/prefix/${f} b)
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "install trees differ in ${f}")
  endif()
endforeach()
list(LENGTH plain_files n)
if(n LESS 20 OR NOT "share/kvpolicy/kvpolicyConfig.cmake" IN_LIST plain_files OR NOT "include/kvpolicy/trimkv.hpp" IN_LIST plain_files)
  message(FATAL_ERROR "the install tree is incomplete: ${plain_files}")
endif()
foreach(f copyright usage)
  if(NOT EXISTS ${CURRENT_PACKAGES_DIR}/share/kvpolicy/${f})
    message(FATAL_ERROR "the port did not install share/kvpolicy/${f}")
  endif()
endforeach()
message(STATUS "the port's install tree equals cmake --install's: ${n} files, plus copyright and usage")
