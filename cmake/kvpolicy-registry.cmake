# The policy registry's list (kvpolicy/registry.hpp): every file under include/kvpolicy/policies/
# is one registered policy (or family), its stem the name of its type in kvpolicy::policies. The
# list is written, never edited, so that adding a policy is adding its file (docs/adding-a-policy.md).
#   kvpolicy_write_registry(<include dir> <output file>)
function(kvpolicy_write_registry include_dir output)
  file(GLOB files CONFIGURE_DEPENDS ${include_dir}/kvpolicy/policies/*.hpp)
  list(SORT files)
  set(includes "")
  set(types "")
  foreach(file IN LISTS files)
    get_filename_component(stem ${file} NAME_WE)
    if(NOT stem MATCHES "^[a-z][a-z0-9_]*$")
      message(FATAL_ERROR "include/kvpolicy/policies/${stem}.hpp: a policy file's stem names its type: [a-z][a-z0-9_]*")
    endif()
    string(APPEND includes "#include \"kvpolicy/policies/${stem}.hpp\"\n")
    list(APPEND types "::kvpolicy::policies::${stem}")
  endforeach()
  list(JOIN types ", " types)
  file(CONFIGURE OUTPUT ${output} CONTENT
       "// Written by CMake (cmake/kvpolicy-registry.cmake) from include/kvpolicy/policies/: do not edit.\n@includes@#define KVPOLICY_POLICY_FILES @types@\n"
       @ONLY)
endfunction()
