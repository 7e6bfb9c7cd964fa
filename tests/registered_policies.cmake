# registered_policies(<out-var>): the registered policies' names, from ${REPLAY} --list-policies
# (one per line, the name before the first tab). For the cmake -P checks that compare a list with
# the registry.
function(registered_policies out)
  execute_process(COMMAND ${REPLAY} --list-policies RESULT_VARIABLE rc OUTPUT_VARIABLE listing)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvpolicy-replay --list-policies failed (${rc})")
  endif()
  string(REPLACE "\n" ";" lines "${listing}")
  set(names "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([^\t]+)\t")
      list(APPEND names "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out} "${names}" PARENT_SCOPE)
endfunction()
