# tools/check_layers.py must catch a header that includes up a layer: a copy of include/ whose
# TRIM-KV preset pulls the CPU backend in (a preset may only declare cpu_backend) is refused, naming
# the line, and so is a core header that includes a part (up a layer, and a cycle with it), and a
# part that includes the CPU backend in angle brackets (either spelling of an include is read), and
# a header of every policy that does not reach them (kvpolicy/policies.hpp without the registry).
file(REMOVE_RECURSE ${WORK_DIR}/layers)
file(COPY ${SOURCE_DIR}/include DESTINATION ${WORK_DIR}/layers)
set(preset ${WORK_DIR}/layers/include/kvpolicy/policies/trimkv.hpp)
file(READ ${preset} text)
string(REPLACE "#include \"kvpolicy/cpu/backend_fwd.hpp\"" "#include \"kvpolicy/cpu/backend.hpp\"" changed "${text}")
if(changed STREQUAL text)
  message(FATAL_ERROR "policies/trimkv.hpp no longer includes cpu/backend_fwd.hpp; plant another violation here")
endif()
file(WRITE ${preset} "${changed}")
file(APPEND ${WORK_DIR}/layers/include/kvpolicy/core/math.hpp "#include \"kvpolicy/parts/score/retention.hpp\"\n")
file(APPEND ${WORK_DIR}/layers/include/kvpolicy/parts/score/baseline.hpp "#include <kvpolicy/cpu/backend.hpp>\n")
set(every ${WORK_DIR}/layers/include/kvpolicy/policies.hpp)
file(READ ${every} text)
string(REGEX REPLACE "#include \"kvpolicy/registry.hpp\"[^\n]*\n" "" changed "${text}")
if(changed STREQUAL text)
  message(FATAL_ERROR "policies.hpp no longer includes kvpolicy/registry.hpp; drop another include here")
endif()
file(WRITE ${every} "${changed}")
execute_process(COMMAND ${PYTHON} ${SOURCE_DIR}/tools/check_layers.py ${WORK_DIR}/layers
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT "${out}" MATCHES "kvpolicy/policies/trimkv.hpp:[0-9]+: includes kvpolicy/cpu/backend.hpp"
   OR NOT "${out}" MATCHES "kvpolicy/core/math.hpp:[0-9]+: includes kvpolicy/parts/score/retention.hpp"
   OR NOT "${out}" MATCHES "kvpolicy/parts/score/baseline.hpp:[0-9]+: includes kvpolicy/cpu/backend.hpp"
   OR NOT "${out}" MATCHES "include cycle: "
   OR NOT "${out}" MATCHES "kvpolicy/policies.hpp: does not include kvpolicy/registry.hpp")
  message(FATAL_ERROR "the checker accepted includes that run up a layer (rc=${rc}):\n${out}\n${err}")
endif()
