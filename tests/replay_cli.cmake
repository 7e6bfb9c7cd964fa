# kvpolicy-replay from its command line: --help, a synthetic trace written and replayed with
# heatmaps, and clear errors for bad arguments.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run_ok)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(OUT "${out}" PARENT_SCOPE)
endfunction()

function(run_fails expected)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "${expected}")
    message(FATAL_ERROR "expected failure matching '${expected}' from ${ARGN}, got rc=${rc}\n${out}\n${err}")
  endif()
endfunction()

run_ok(${REPLAY} --help)
foreach(p trimkv dbtrimkv streamingllm knorm random)
  if(NOT OUT MATCHES "${p}")
    message(FATAL_ERROR "--help does not list policy ${p}")
  endif()
endforeach()

run_ok(${REPLAY} --write-synthetic ${WORK_DIR}/trace.safetensors --tokens 300)
foreach(p streamingllm knorm random)
  run_ok(${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy ${p} --budget 32 --buffer 8 --sinks 2 --seed 5
         --out ${WORK_DIR}/${p}.safetensors)
endforeach()
run_fails("--window and --threshold apply to trimkv and dbtrimkv" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors
          --policy knorm --window 4 --out ${WORK_DIR}/x.safetensors)
run_ok(${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy trimkv --budget 32 --buffer 8 --prefill 50
       --out ${WORK_DIR}/trimkv.safetensors --png ${WORK_DIR}/png --layers 0,1 --heads 1)
run_ok(${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy dbtrimkv --budget 32 --buffer 8 --horizon 3 --floor 0.25
       --window 4 --out ${WORK_DIR}/dbtrimkv.safetensors)
foreach(f trimkv.safetensors dbtrimkv.safetensors png/retention_l0_h1.png png/decisions_l1_h1.png)
  if(NOT EXISTS ${WORK_DIR}/${f})
    message(FATAL_ERROR "replay did not write ${f}")
  endif()
endforeach()
file(SIZE ${WORK_DIR}/png/decisions_l1_h1.png png_size)
if(png_size LESS 200)
  message(FATAL_ERROR "heatmap is only ${png_size} bytes")
endif()

run_fails("unknown policy 'lru'" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy lru --out ${WORK_DIR}/x.safetensors)
run_fails("budget M = 0" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --budget 0 --out ${WORK_DIR}/x.safetensors)
run_fails("--budget: 'ten' is not a number" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --budget ten --out ${WORK_DIR}/x.safetensors)
run_fails("cannot open" ${REPLAY} --trace ${WORK_DIR}/missing.safetensors --out ${WORK_DIR}/x.safetensors)
run_fails("--out OUT.safetensors is required" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors)
run_fails("layer 9 out of range" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --budget 32 --buffer 8
          --out ${WORK_DIR}/y.safetensors --png ${WORK_DIR}/png2 --layers 9)
