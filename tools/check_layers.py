#!/usr/bin/env python3
"""Check that the headers' includes run down the library's layers and never in a cycle.

Usage:
    python3 tools/check_layers.py [SOURCE_DIR]

The layers (docs/architecture.md), each allowed to include only what its row names:

    core/                                   nothing of the library
    memory/ gate/ registry/                 core/
    parts/                                  core/ memory/ (a Scorer's record: memory/query_window.hpp)
    cache/ (the Cache's step machinery)     core/ memory/ parts/
    inputs/                                 core/ gate/ parts/ registry/
    cache.hpp                               core/ cache/
    cpu/                                    core/ cache/ memory/ parts/
    policies/ (and policies/common/)        core/ memory/ parts/ registry/ cache.hpp, of inputs/ only
                                            source.hpp and sources.hpp (a policy's input source, its own
                                            where it reads a new signal; no file parser), and of cpu/
                                            only backend_fwd.hpp: a preset names cpu_backend as its
                                            default and pulls no backend in
    cuda/                                   core/ cache/ gate/ memory/ parts/ cache.hpp
    dist/                                   core/ parts/ cache/ memory/
    the headers directly under kvpolicy/    anything below them

Includes inside one folder are allowed; together with the rows above, the file graph must have no
cycle. And kvpolicy/policies.hpp includes kvpolicy/registry.hpp, which includes every policy file through
the list CMake writes, so the one include of a CPU program reaches every policy. Prints each violation and exits 1, or prints "layers: N headers, M includes, no include runs
up a layer, no cycle" and exits 0. Python 3 standard library only.
"""

import os
import re
import sys

# quoted or angle-bracketed: either form reaches the same header
INCLUDE = re.compile(r'^\s*#\s*include\s+(?:"(kvpolicy/[^"]+)"|<(kvpolicy/[^>]+)>)')

ALLOWED = {
    "core": set(),
    "parts": {"core", "memory"},
    "memory": {"core"},
    "gate": {"core"},
    "registry": {"core"},
    "cache": {"core", "memory", "parts"},
    "inputs": {"core", "gate", "parts", "registry"},
    "inputs_sources": {"core", "registry"},
    "cache.hpp": {"core", "cache"},
    "cpu": {"core", "cache", "memory", "parts"},
    "policies": {"core", "inputs_sources", "memory", "parts", "registry", "cache.hpp", "cpu_fwd"},
    "cuda": {"core", "cache", "gate", "memory", "parts", "cache.hpp"},
    "dist": {"core", "parts", "cache", "memory"},
}

# the headers a CPU program includes for a family of policies (docs/architecture.md)
# The header of every policy (a CPU program's one include for any of them): it reaches every file
# under policies/ through the registry, whose list of those files CMake writes
# (policies/registered.inc), so a policy added as its file needs no family header's edit.
EVERY_POLICY = "kvpolicy/policies.hpp"
REGISTRY = "kvpolicy/registry.hpp"


def layer(path):
    """The layer of a header path under include/ ("kvpolicy/x/y.hpp")."""
    parts = path.split("/")
    if len(parts) == 2:
        return "cache.hpp" if parts[1] == "cache.hpp" else "top"
    if parts[1] == "cpu" and parts[2] == "backend_fwd.hpp":
        return "cpu_fwd"
    if parts[1] == "inputs" and parts[2] in ("source.hpp", "sources.hpp"):
        return "inputs_sources"
    return parts[1]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    include = os.path.join(root, "include")
    graph, problems, count = {}, [], 0
    for folder, _, files in os.walk(os.path.join(include, "kvpolicy")):
        for name in sorted(files):
            if not name.endswith((".hpp", ".cuh")):
                continue
            path = os.path.relpath(os.path.join(folder, name), include).replace(os.sep, "/")
            targets = []
            with open(os.path.join(include, path), encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = m.group(1) or m.group(2)
                    count += 1
                    targets.append(target)
                    if not os.path.exists(os.path.join(include, target)) and not target.endswith(".inc"):
                        problems.append(f"{path}:{number}: includes {target}, which does not exist")
                        continue
                    a, b = layer(path), layer(target)
                    if a == "cpu_fwd":
                        a = "cpu"
                    if a == "top" or a == b or (a == "cpu" and b == "cpu_fwd") or (a == "inputs" and b == "inputs_sources"):
                        continue
                    if b not in ALLOWED.get(a, set()):
                        problems.append(f"{path}:{number}: includes {target}: {a}/ may include only "
                                        f"{', '.join(sorted(ALLOWED.get(a, set()))) or 'nothing of the library'}")
            graph[path] = targets

    # a cycle among files: depth-first search, grey = on the current path
    colour = {}

    def visit(node, stack):
        colour[node] = "grey"
        stack.append(node)
        for nxt in graph.get(node, []):
            if colour.get(nxt) == "grey":
                cycle = stack[stack.index(nxt):] + [nxt]
                problems.append("include cycle: " + " -> ".join(cycle))
            elif nxt in graph and nxt not in colour:
                visit(nxt, stack)
        stack.pop()
        colour[node] = "black"

    for node in sorted(graph):
        if node not in colour:
            visit(node, [])

    if REGISTRY not in graph.get(EVERY_POLICY, []):
        problems.append(f"{EVERY_POLICY}: does not include {REGISTRY}: a CPU program that includes it would not "
                        f"have every registered policy")

    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"layers: {len(graph)} headers, {count} includes, no include runs up a layer, no cycle, "
          f"{EVERY_POLICY} reaches every policy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
