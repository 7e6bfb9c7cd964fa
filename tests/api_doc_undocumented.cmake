# tools/api_doc.py must refuse a public name without a /// comment: a copy of the headers where
# core/error.hpp declares one more struct, undocumented, is refused, naming it; and must refuse a
# docs/api.md edited by hand (--check).
file(REMOVE_RECURSE ${WORK_DIR}/api_doc_tree)
file(COPY ${SOURCE_DIR}/include DESTINATION ${WORK_DIR}/api_doc_tree)
file(COPY ${SOURCE_DIR}/docs/api-preface.md ${SOURCE_DIR}/docs/api.md DESTINATION ${WORK_DIR}/api_doc_tree/docs)
set(tree ${WORK_DIR}/api_doc_tree)
execute_process(COMMAND ${PYTHON} ${SOURCE_DIR}/tools/api_doc.py ${tree} --check
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the copy of the tree should pass before it is changed (rc=${rc}):\n${out}\n${err}")
endif()
file(APPEND ${tree}/docs/api.md "one line written by hand\n")
execute_process(COMMAND ${PYTHON} ${SOURCE_DIR}/tools/api_doc.py ${tree} --check
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "is not what the headers make")
  message(FATAL_ERROR "the generator accepted a docs/api.md edited by hand (rc=${rc}):\n${out}\n${err}")
endif()
file(APPEND ${tree}/include/kvpolicy/core/error.hpp "\nnamespace kvpolicy {\nstruct Undocumented {};\n}\n")
execute_process(COMMAND ${PYTHON} ${SOURCE_DIR}/tools/api_doc.py ${tree} --check
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "kvpolicy/core/error.hpp: `Undocumented` is public and has no /// comment")
  message(FATAL_ERROR "the generator accepted an undocumented public name (rc=${rc}):\n${out}\n${err}")
endif()
