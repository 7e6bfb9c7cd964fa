# Conan build module (conanfile.py, option cpu=True): kvpolicy::cpu links Eigen3 and nlohmann_json.
# When Conan packaged them, CMakeDeps has already defined their targets; when a profile declares
# them in [platform_requires] (system packages), they are found here, as kvpolicyConfig.cmake does.
if(TARGET kvpolicy::cpu)
  if(NOT TARGET Eigen3::Eigen)
    find_package(Eigen3 3.3 REQUIRED NO_MODULE)
  endif()
  if(NOT TARGET nlohmann_json::nlohmann_json)
    find_package(nlohmann_json 3.2 REQUIRED)
  endif()
  set_property(TARGET kvpolicy::cpu APPEND PROPERTY INTERFACE_LINK_LIBRARIES Eigen3::Eigen nlohmann_json::nlohmann_json)
endif()
