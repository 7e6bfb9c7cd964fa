# Conan build module (conanfile.py, option cuda=True): kvpolicy::cuda links the CUDA runtime of the
# machine's toolkit, as the CMake package's kvpolicy::cuda does.
if(TARGET kvpolicy::cuda)
  find_package(CUDAToolkit REQUIRED)
  set_property(TARGET kvpolicy::cuda APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
endif()
