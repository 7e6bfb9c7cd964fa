"""Conan 2 recipe for kvpolicy, a header-only C++20 library of KV-cache policies.

    conan create . -pr:a conan/profiles/debian12       # offline: Eigen and nlohmann_json from Debian

Targets, as the CMake package exports them (docs/packaging.md):
    kvpolicy::kvpolicy   header-only core, no dependency
    kvpolicy::cpu        + Eigen3 and nlohmann_json (gates, safetensors)   option cpu=True
    kvpolicy::cuda       + CUDA::cudart                                   option cuda=True
"""
import os
import re

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load, save
from conan.tools.layout import basic_layout


class KvpolicyConan(ConanFile):
    name = "kvpolicy"
    description = "KV-cache policies (TRIM-KV, DBTrimKV) for LLM inference engines, header-only C++20"
    license = "MIT"
    url = "https://github.com/kvpolicy/kvpolicy"
    homepage = "https://github.com/kvpolicy/kvpolicy"
    topics = ("llm", "inference", "kv-cache", "header-only", "cuda")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"cpu": [True, False], "cuda": [True, False]}
    default_options = {"cpu": True, "cuda": False}
    exports_sources = "LICENSE", "cmake/kvpolicy-conan-*.cmake", "include/*"
    exports = "CMakeLists.txt"  # set_version() reads the one version number from it
    no_copy_source = True

    def set_version(self):
        # The one version number lives in CMakeLists.txt: project(kvpolicy VERSION x.y.z ...).
        text = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        self.version = re.search(r"project\(kvpolicy\s+VERSION\s+([0-9.]+)", text).group(1)

    def layout(self):
        basic_layout(self, src_folder=".")

    def requirements(self):
        if self.options.cpu:
            self.requires("eigen/3.4.0")
            self.requires("nlohmann_json/3.11.2")

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def package_id(self):
        # Header-only: one package for every setting and option (the options select components in
        # package_info; the packaged files are the same).
        self.info.clear()

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        copy(self, "*.hpp", os.path.join(self.source_folder, "include"), os.path.join(self.package_folder, "include"))
        # the policy registry's list of files, as cmake/kvpolicy-registry.cmake writes it for CMake builds
        folder = os.path.join(self.source_folder, "include", "kvpolicy", "policies")
        stems = sorted(f[:-4] for f in os.listdir(folder) if f.endswith(".hpp"))
        save(self, os.path.join(self.package_folder, "include", "kvpolicy", "policies", "registered.inc"),
             "// Written by conanfile.py from include/kvpolicy/policies/: do not edit.\n" +
             "".join(f'#include "kvpolicy/policies/{s}.hpp"\n' for s in stems) +
             "#define KVPOLICY_POLICY_FILES " + ", ".join(f"::kvpolicy::policies::{s}" for s in stems) + "\n")
        copy(self, "kvpolicy-conan-*.cmake", os.path.join(self.source_folder, "cmake"),
             os.path.join(self.package_folder, "lib", "cmake"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "kvpolicy")
        self.cpp_info.set_property("cmake_target_name", "kvpolicy::kvpolicy")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []

        core = self.cpp_info.components["core"]
        core.set_property("cmake_target_name", "kvpolicy::kvpolicy")
        core.bindirs = []
        core.libdirs = []
        build_modules = []
        if self.options.cpu:
            cpu = self.cpp_info.components["cpu"]
            cpu.set_property("cmake_target_name", "kvpolicy::cpu")
            cpu.requires = ["core"]
            cpu.bindirs = []
            cpu.libdirs = []
            # Dependencies Conan packaged are component requirements. Ones a profile declares in
            # [platform_requires] (Debian's Eigen and nlohmann_json) have no package folder, and
            # CMakeDeps refuses them as component requirements (conan-io/docs#3908): a build module
            # finds them the way kvpolicyConfig.cmake does.
            packaged = {d.ref.name for d in self.dependencies.values() if d.package_folder is not None}
            for dep, target in (("eigen", "eigen::eigen"), ("nlohmann_json", "nlohmann_json::nlohmann_json")):
                if dep in packaged:
                    cpu.requires.append(target)
            build_modules.append(os.path.join("lib", "cmake", "kvpolicy-conan-cpu.cmake"))
        if self.options.cuda:
            cuda = self.cpp_info.components["cuda"]
            cuda.set_property("cmake_target_name", "kvpolicy::cuda")
            cuda.requires = ["core"]
            cuda.bindirs = []
            cuda.libdirs = []
            # CUDA comes from the machine's toolkit: the build module links CUDA::cudart to kvpolicy::cuda
            build_modules.append(os.path.join("lib", "cmake", "kvpolicy-conan-cuda.cmake"))
        self.cpp_info.set_property("cmake_build_modules", build_modules)
