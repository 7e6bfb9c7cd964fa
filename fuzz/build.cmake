# Configures and builds the fuzz targets with clang in WORK_DIR (the fuzz_build test, a fixture).
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/fuzz -B ${WORK_DIR} -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CLANGXX})
step(${CMAKE_COMMAND} --build ${WORK_DIR})
