# ctest verify.make_verify: make verify's run (the Makefile's VERIFY_ARGS) over
# every fixture folder given, with JSON and JUnit; exit 0 is the only pass.
#   cmake -DCLI=attn -DMAKEFILE=Makefile -DFIXTURES="dir;dir" -DOUT=dir -P make_verify.cmake
file(STRINGS ${MAKEFILE} line REGEX "^VERIFY_ARGS [?]?= ")
if(NOT line)
  message(FATAL_ERROR "${MAKEFILE} has no VERIFY_ARGS line")
endif()
string(REGEX REPLACE "^VERIFY_ARGS [?]?= " "" args "${line}")
separate_arguments(args UNIX_COMMAND "${args}")
file(MAKE_DIRECTORY ${OUT})
execute_process(COMMAND ${CLI} verify ${FIXTURES} ${args} --quiet --json ${OUT}/verify.json --junit ${OUT}/verify.xml
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "attn verify ${FIXTURES} ${args}: exit ${rc}, expected 0\n${err}")
endif()
