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
run_ok(${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy streamingllm --budget 32 --buffer 8 --sinks 2
       --out ${WORK_DIR}/streamingllm.safetensors)
run_ok(${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy knorm --budget 32 --buffer 8 --out ${WORK_DIR}/knorm.safetensors)
run_ok(${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy random --budget 32 --buffer 8 --seed 5
       --out ${WORK_DIR}/random.safetensors)
# an option the policy does not take is refused, not ignored
run_fails("--pool does not apply to policy knorm \\(it is for: snapkv\\)" ${REPLAY}
          --trace ${WORK_DIR}/trace.safetensors --policy knorm --pool max --out ${WORK_DIR}/x.safetensors)
run_fails("--window does not apply to policy wgkv" ${REPLAY}
          --trace ${WORK_DIR}/trace.safetensors --policy wgkv --window 4 --out ${WORK_DIR}/x.safetensors)
run_fails("--sinks S = -1 must be >= 0" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy knorm
          --sinks -1 --out ${WORK_DIR}/x.safetensors)
run_fails("--pool 'min' must be avg or max" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy snapkv
          --prefill 100 --pool min --out ${WORK_DIR}/x.safetensors)
run_fails("--horizon does not apply to policy trimkv" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy trimkv
          --horizon 0 --out ${WORK_DIR}/x.safetensors)
run_fails("--floor does not apply to policy trimkv" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy trimkv
          --floor 1.5 --out ${WORK_DIR}/x.safetensors)
run_fails("--buffer does not apply to policy snapkv" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy snapkv
          --prefill 100 --buffer 4 --out ${WORK_DIR}/x.safetensors)
# SPEC §5: sinks and window for every policy; SnapKV's pooling, kernel and GQA reduction
run_ok(${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy knorm --budget 32 --buffer 8 --sinks 2 --window 4
       --out ${WORK_DIR}/knorm_protected.safetensors)
run_ok(${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy snapkv --budget 32 --prefill 100 --window 8 --pool max
       --pool-kernel 7 --gqa max --sinks 2 --out ${WORK_DIR}/snapkv.safetensors)
file(READ ${WORK_DIR}/snapkv.safetensors header OFFSET 8 LIMIT 2048)
foreach(want [["pooling":"max"]] [["pool_kernel":"7"]] [["gqa":"max"]] [["sinks":"2"]] [["window":"8"]])
  string(FIND "${header}" "${want}" at)
  if(at LESS 0)
    message(FATAL_ERROR "the snapkv output's metadata lacks ${want}:\n${header}")
  endif()
endforeach()
run_fails("--avg-budget M = -3 must be >= 0" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy wgkv
          --avg-budget -3 --out ${WORK_DIR}/x.safetensors)
run_fails("--threshold alpha = 2 must be in \\(0, 1\\] for trimkv" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors
          --policy trimkv --threshold 2 --out ${WORK_DIR}/x.safetensors)
run_fails("--threshold alpha = 4 must be in \\(0, 3\\] for dbtrimkv" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors
          --policy dbtrimkv --horizon 3 --threshold 4 --out ${WORK_DIR}/x.safetensors)
run_fails("--prefill P = 500 must be in \\[0, T = 300\\]" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors
          --policy trimkv --prefill 500 --out ${WORK_DIR}/x.safetensors)
run_fails("--layers and --heads choose heatmaps: give --png DIR" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors
          --layers 0 --out ${WORK_DIR}/x.safetensors)
run_fails("is a directory, not a file" ${REPLAY} --trace ${WORK_DIR} --out ${WORK_DIR}/x.safetensors)
run_fails("--tokens T = 10000000 must be in \\[1, 65536\\]" ${REPLAY} --write-synthetic ${WORK_DIR}/big.safetensors
          --tokens 1e7)
# --out naming the trace is refused, and the trace is left as it was
file(SHA256 ${WORK_DIR}/trace.safetensors trace_sha)
run_fails("is the trace itself: it would overwrite the input" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors
          --out ${WORK_DIR}/./trace.safetensors)
file(SHA256 ${WORK_DIR}/trace.safetensors trace_sha_after)
if(NOT trace_sha STREQUAL trace_sha_after)
  message(FATAL_ERROR "a refused run changed the trace")
endif()
if(EXISTS ${WORK_DIR}/x.safetensors)
  message(FATAL_ERROR "a refused run wrote its output")
endif()
# a buffer far past the trace: the pool is sized by the trace's 300 tokens, not by T + B
run_ok(${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy trimkv --budget 32 --buffer 100000000
       --out ${WORK_DIR}/huge_buffer.safetensors)
# --no-reference: no attn_rel_error; the metadata records every option of the run
run_ok(${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy trimkv --budget 32 --buffer 8 --prefill 50 --window 2
       --no-reference --out ${WORK_DIR}/no_reference.safetensors)
file(READ ${WORK_DIR}/no_reference.safetensors header OFFSET 8 LIMIT 2048)
foreach(want [["prefill":"50"]] [["window":"2"]] [["sinks":"0"]] [["band_a":"10"]] [["recency":"-1"]]
             [["reference":"none (--no-reference)"]] [["trace":"]])
  string(FIND "${header}" "${want}" at)
  if(at LESS 0)
    message(FATAL_ERROR "the output's metadata lacks ${want}:\n${header}")
  endif()
endforeach()
string(FIND "${header}" "attn_rel_error" at)
if(NOT at LESS 0)
  message(FATAL_ERROR "--no-reference still wrote attn_rel_error")
endif()
run_ok(${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy trimkv --budget 32 --buffer 8 --prefill 50
       --out ${WORK_DIR}/trimkv.safetensors --png ${WORK_DIR}/png --layers 0,1 --heads 1)
file(READ ${WORK_DIR}/trimkv.safetensors header OFFSET 8 LIMIT 2048)
string(FIND "${header}" "attn_rel_error" at)
if(at LESS 0)
  message(FATAL_ERROR "a run with the reference wrote no attn_rel_error")
endif()
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
# a bad heatmap choice fails before any work: nothing written, an existing output left as it was
run_fails("layer 9 out of range" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --budget 32 --buffer 8
          --out ${WORK_DIR}/y.safetensors --png ${WORK_DIR}/png2 --layers 9)
file(SHA256 ${WORK_DIR}/knorm.safetensors knorm_sha)
run_fails("kv head 5 out of range" ${REPLAY} --trace ${WORK_DIR}/trace.safetensors --policy trimkv --budget 32 --buffer 8
          --out ${WORK_DIR}/knorm.safetensors --png ${WORK_DIR}/png3 --heads 5)
file(SHA256 ${WORK_DIR}/knorm.safetensors knorm_sha_after)
if(EXISTS ${WORK_DIR}/y.safetensors OR EXISTS ${WORK_DIR}/png2 OR EXISTS ${WORK_DIR}/png3 OR
   NOT knorm_sha STREQUAL knorm_sha_after)
  message(FATAL_ERROR "a run refused for its heatmap options wrote or changed its output")
endif()
