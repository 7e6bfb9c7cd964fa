# Installs the build tree into a fresh prefix, then configures, builds and runs tests/consumer
# against it with find_package(kvpolicy CONFIG REQUIRED).
file(REMOVE_RECURSE ${WORK_DIR})
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
set(installed include/kvpolicy/trimkv.hpp include/kvpolicy/core/concepts.hpp share/kvpolicy/kvpolicyConfig.cmake
              share/kvpolicy/kvpolicyConfigVersion.cmake share/doc/kvpolicy/LICENSE bin/kvpolicy-replay)
if(EXPECT_LM)  # kvpolicy-lm is not built under the sanitizers (apps/CMakeLists.txt)
  list(APPEND installed bin/kvpolicy-lm)
endif()
foreach(f ${installed})
  if(NOT EXISTS ${WORK_DIR}/prefix/${f})
    message(FATAL_ERROR "install tree lacks ${f}")
  endif()
endforeach()
step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build -G ${GENERATOR}
     -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
step(${WORK_DIR}/build/consumer)
step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build-components -G ${GENERATOR}
     -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCONSUMER_ASKS_COMPONENTS=ON -DCONSUMER_VERSION=${MAJOR_MINOR})
# Without Eigen, asking for the cpu component fails and names Eigen3 (not only "kvpolicy_FOUND to FALSE");
# CMake wraps the reason's lines, hence [ \n]+.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build-no-eigen -G ${GENERATOR}
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCONSUMER_ASKS_COMPONENTS=ON
                        -DCONSUMER_VERSION=${MAJOR_MINOR} -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=TRUE
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "component cpu is not available:[ \n]+Eigen3[ \n]+\\(>=[ \n]+3.3;[ \n]+Debian:[ \n]+libeigen3-dev\\)")
  message(FATAL_ERROR "find_package(kvpolicy COMPONENTS cpu) without Eigen3 should fail naming Eigen3 (${rc}):\n${out}\n${err}")
endif()
