# Runs one libFuzzer target for SECONDS over a working corpus seeded from the repo's corpus;
# crash inputs land in WORK_DIR/artifacts. Used by the fuzz_* tests.
file(MAKE_DIRECTORY ${WORK_DIR}/corpus ${WORK_DIR}/artifacts)
execute_process(COMMAND ${FUZZER} -max_total_time=${SECONDS} -timeout=20 -rss_limit_mb=2048 -print_final_stats=1
                        -artifact_prefix=${WORK_DIR}/artifacts/ ${WORK_DIR}/corpus ${SEEDS}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${rc}); the crashing input is in ${WORK_DIR}/artifacts")
endif()
