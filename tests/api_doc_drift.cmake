# tools/check_api_doc.py must catch a docs/api.md that drifted from the headers: a copy of the page
# with one declaration changed (remove_sequence's parameter type) is refused, naming the line.
file(READ ${SOURCE_DIR}/docs/api.md doc)
string(FIND "${doc}" "void remove_sequence(std::int64_t seq)" at)
if(at LESS 0)
  message(FATAL_ERROR "docs/api.md no longer quotes Cache::remove_sequence; pick another declaration here")
endif()
string(REPLACE "void remove_sequence(std::int64_t seq)" "void remove_sequence(int seq)" doc "${doc}")
file(WRITE ${WORK_DIR}/api.md "${doc}")
execute_process(COMMAND ${PYTHON} ${SOURCE_DIR}/tools/check_api_doc.py ${SOURCE_DIR} --doc ${WORK_DIR}/api.md
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "kvpolicy/cache.hpp: not in the header: void remove_sequence\\(int seq\\)")
  message(FATAL_ERROR "the checker accepted a drifted api.md (rc=${rc}):\n${out}\n${err}")
endif()
