# Where a Markdown section of a document is: doc_section(TEXT FILE NAME BEGIN END) sets BEGIN and END
# to the offsets in TEXT of the section "## NAME", from its heading to the next "## " heading or the
# end; a document without it is an error naming FILE. For the tests that check a doc's table against
# what the code states (policies_index.cmake, policies_options.cmake).
function(doc_section text file name begin_var end_var)
  string(FIND "${text}" "\n## ${name}\n" begin)
  if(begin LESS 0)
    message(FATAL_ERROR "${file}: no '## ${name}' section")
  endif()
  math(EXPR begin "${begin} + 1")
  string(SUBSTRING "${text}" ${begin} -1 section)
  string(FIND "${section}" "\n## " length)
  if(length LESS 0)
    string(LENGTH "${section}" length)
  endif()
  math(EXPR end "${begin} + ${length}")
  set(${begin_var} ${begin} PARENT_SCOPE)
  set(${end_var} ${end} PARENT_SCOPE)
endfunction()
