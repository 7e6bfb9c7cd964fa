# vcpkg port of kvpolicy (header-only). Used from a checkout as an overlay port:
#   vcpkg install kvpolicy[cpu] --overlay-ports=<checkout>/ports
# A registry copy replaces the SOURCE_PATH line with vcpkg_from_github() of the release tag
# (docs/packaging.md); everything below it stays as it is.
set(VCPKG_BUILD_TYPE release)  # header-only: no debug tree
set(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../..")

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    cpu  KVPOLICY_WITH_CPU
    cuda KVPOLICY_ENABLE_CUDA
)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    -DKVPOLICY_BUILD_TESTS=OFF
    -DKVPOLICY_BUILD_EXAMPLES=OFF
    -DKVPOLICY_BUILD_BENCHMARKS=OFF
    ${FEATURE_OPTIONS}
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(CONFIG_PATH share/kvpolicy)

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
