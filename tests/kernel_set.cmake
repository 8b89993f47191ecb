# ctest verify.kernels_<isa>: blocked and streaming with one CPU kernel set
# forced (ATTN_CPU_ISA), over every fixture but the long tier. Skipped, with
# the reason, when the CPU does not allow the set, or when it is the set this
# machine uses anyway (verify.make_verify runs that one).
#   cmake -DCLI=attn -DISA=avx512_vbmi|avx512|portable -DFIXTURES=dir -P kernel_set.cmake
execute_process(COMMAND ${CLI} list RESULT_VARIABLE rc OUTPUT_VARIABLE listing ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "attn list: exit ${rc}\n${err}")
endif()
string(REGEX MATCH "CPU kernel set: ([a-z0-9_]+)" found "${listing}")
set(default ${CMAKE_MATCH_1})
set(ENV{ATTN_CPU_ISA} ${ISA})
execute_process(COMMAND ${CLI} list RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 2 AND err MATCHES "does not allow it")
  message("SKIPPED: ${err}")
  return()
endif()
string(REGEX MATCH "CPU kernel set: ([a-z0-9_]+)" found "${out}")
set(forced ${CMAKE_MATCH_1})
if(forced STREQUAL default)
  message("SKIPPED: ATTN_CPU_ISA=${ISA} gives ${default}, the kernel set this machine uses; verify.make_verify runs it")
  return()
endif()
# avx512_bf16 on a machine that runs avx512_vbmi: the same source compiled
# without VBMI, whose kernels differ in the fp8 decode alone (the unit tests
# hold every decode kernel of the two sets to each other): the quantised
# fixtures, where they differ. A machine without VBMI runs the whole suite.
set(tags smoke,full,layer)
if(default STREQUAL "avx512_vbmi" AND forced STREQUAL "avx512_bf16")
  set(tags quantised)
  message("avx512_bf16 beside avx512_vbmi: the quantised fixtures only")
endif()
# The metamorphic relations are judged on the machine's own set only (by
# verify.make_verify; CI time); batch invariance, which the splits and tiles
# decide, on this set too.
execute_process(COMMAND ${CLI} verify ${FIXTURES} --backend blocked --backend streaming -t ${tags} --quiet
                        --skip-check relations
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ATTN_CPU_ISA=${ISA} attn verify: exit ${rc}, expected 0\n${err}")
endif()
