# ctest driver: install the build tree into a scratch prefix, build the consumer project
# against it with find_package, run it; then the same against the build tree itself (Tutti_DIR =
# the build directory, nothing installed). Arguments: BUILD_DIR, SOURCE_DIR, WORK_DIR,
# EXPECT_CUDA_IPC (whether the cuda_ipc component was built).
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()
run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build"
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
    -DEXPECT_CUDA_IPC=${EXPECT_CUDA_IPC}
    -DPLUGIN_SOURCE=${SOURCE_DIR}/../../examples/plugin/storeloop.c)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer" "file://${WORK_DIR}/store")
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/from-build-tree"
    -DTutti_DIR=${BUILD_DIR} -DCMAKE_BUILD_TYPE=Release -DEXPECT_CUDA_IPC=${EXPECT_CUDA_IPC})
run(${CMAKE_COMMAND} --build "${WORK_DIR}/from-build-tree")
run("${WORK_DIR}/from-build-tree/consumer" "file://${WORK_DIR}/store2")
