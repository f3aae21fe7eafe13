#!/usr/bin/env python3
"""Lists the upward imports between the layers of src/ (lib.rs: graph, data, model, comm at the
bottom; sync above them; the training loop, configuration and command line on top) and exits 1
when there is one. Test items (`#[cfg(test)]`, skipped by brace matching: rust_source.py) may
reach up; everything else is read, also after a test module. It also fails when a mode's
`pub const MODE` in src/sync/ comes after the file's tests (a reader looks for the declaration
first).

    .ci/layers.py            # src/
    .ci/layers.py --list     # every module with its layer

This is the check a split into workspace crates would give through the compiler, without the
split (docs/sync-modes.md, "Crates and an in-process transport: measured").
"""
import os
import re
import sys

from rust_source import blank_tests, rust_files, test_module_lines

# Module (first path component under src/, or file stem) -> layer; higher may use lower.
LAYER = {
    "graph": 0, "data": 0, "model": 0, "comm": 0, "rng": 0, "values": 0,
    "sync": 1,
    "train": 2, "config": 2, "cli": 2, "cluster": 2, "bench": 2, "plot": 2, "predict": 2,
}
USE = re.compile(r"\bcrate::([a-z_]+)")


def upward(root):
    found = []
    for path, rel in rust_files(root):
        module = rel.split(os.sep)[0].removesuffix(".rs")
        if module not in LAYER:
            continue
        body = blank_tests(open(path, encoding="utf-8").read())
        for i, line in enumerate(body.splitlines(), 1):
            if line.lstrip().startswith("//"):
                continue
            for m in USE.finditer(line):
                target = m.group(1)
                if target in LAYER and LAYER[target] > LAYER[module]:
                    found.append(f"src/{rel}:{i}: {module} (layer {LAYER[module]}) uses {target} (layer {LAYER[target]})")
    return found


def modes_after_tests(root):
    """`pub const MODE` declarations in src/sync/ that come after the file's first test module."""
    found = []
    for path, rel in rust_files(root):
        if not rel.startswith("sync" + os.sep):
            continue
        text = open(path, encoding="utf-8").read()
        tests = test_module_lines(text)
        for i, line in enumerate(text.splitlines(), 1):
            if line.startswith("pub const MODE") and tests and tests[0] < i:
                found.append(f"src/{rel}:{i}: MODE is declared after the tests (line {tests[0]}): move MODE before the tests")
    return found


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--list" in sys.argv:
        for m, l in sorted(LAYER.items(), key=lambda x: (x[1], x[0])):
            print(l, m)
        return 0
    unknown = [f.removesuffix(".rs") for f in os.listdir(os.path.join(root, "src"))
               if f.removesuffix(".rs") not in LAYER and f not in ("lib.rs", "main.rs", "bin")]
    found = upward(root) + modes_after_tests(root)
    for line in found:
        print(line)
    for u in unknown:
        print(f"src/{u}: a module of no layer: add it to LAYER in .ci/layers.py")
    print(f"{len(found)} upward import(s) or late MODE declaration(s)", file=sys.stderr)
    return 1 if found or unknown else 0


if __name__ == "__main__":
    sys.exit(main())
