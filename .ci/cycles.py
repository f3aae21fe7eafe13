#!/usr/bin/env python3
"""Lists the pairs of files of src/ that import each other, and exits 1 when there is one.

    .ci/cycles.py            # src/
    .ci/cycles.py --edges    # every file and the files it names
    .ci/cycles.py DIR        # another checkout's src/

A file names another when its `use` declarations (grouped ones too: `use super::{a, b::c}`) or its
paths (`crate::comm::collectives::agree(..)`, `super::ps::serve_until`) lead into the other's
module. A parent file (x.rs or x/mod.rs) and its own children (x/y.rs) are not a pair: a child
using its parent's items (`super::{Gossip, Neighbourhood}`) is how a module is split into files.
Test items (`#[cfg(test)]`) are skipped, the rest of each file is read (rust_source.py). main.rs
and src/bin/ are their own crates and use the library by name, so they cannot be in a pair.

The review of issue 39 found seven pairs, among them ssp.rs <-> bosen.rs (two modes' engine
split across two files) and config.rs <-> cluster.rs; a pair is a layer that points both ways.
"""
import os
import re
import sys

from rust_source import blank_tests, rust_files

USE = re.compile(r"\buse\s+([^;]+);", re.S)
PATH = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def module_of(rel):
    """The module path of a file relative to src/ (lib.rs: the crate root, [])."""
    parts = rel.removesuffix(".rs").split(os.sep)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def expand(tree):
    """The paths of a use tree: `super::{a, b::{c, d}}` -> super::a, super::b::c, super::b::d."""
    tree = re.sub(r"\s+", "", tree)
    depth = 0
    for i, c in enumerate(tree):
        if c == "{":
            if depth == 0:
                prefix, inner = tree[:i], tree[i + 1:tree.rindex("}")]
                out, depth2, start = [], 0, 0
                for j, d in enumerate(inner + ","):
                    if d == "{":
                        depth2 += 1
                    elif d == "}":
                        depth2 -= 1
                    elif d == "," and depth2 == 0:
                        if inner[start:j]:
                            out += [prefix + p for p in expand(inner[start:j])]
                        start = j + 1
                return out
            depth += 1
    return [re.sub(r"\bas\b.*$", "", tree.replace(" ", ""))]


def resolve(path, here, modules, children):
    """The module (a key of `modules`) that `path`, written in module `here`, leads into."""
    segs = [s for s in path.split("::") if s and s != "*"]
    if not segs:
        return None
    if segs[0] == "crate":
        cur, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        cur = here
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                cur = cur[:-1]
            segs = segs[1:]
    elif segs[0] in children.get(here, ()):
        cur = here  # a 2018-edition relative path to a child module
    else:
        return None  # std, another crate, or a local item
    for s in segs:
        nxt = cur + (s,)
        if nxt not in modules:
            break
        cur = nxt
    return cur


def edges(root):
    modules, texts = {}, {}
    for path, rel in rust_files(root):
        if rel == "main.rs" or rel.startswith("bin" + os.sep):
            continue
        m = module_of(rel)
        modules[m] = rel
        texts[m] = blank_tests(open(path, encoding="utf-8").read())
    children = {}
    for m in modules:
        if m:
            children.setdefault(m[:-1], set()).add(m[-1])
    found = {}  # (from, to) -> first line
    for m, text in texts.items():
        lines = [(i, l) for i, l in enumerate(text.splitlines(), 1) if not l.lstrip().startswith("//")]
        body = "\n".join(l for _, l in lines)
        line_of = [i for i, _ in lines]
        refs = []
        for u in USE.finditer(body):
            for p in expand(u.group(1)):
                refs.append((p, body.count("\n", 0, u.start())))
        for p in PATH.finditer(body):
            refs.append((p.group(1), body.count("\n", 0, p.start())))
        for p, at in refs:
            target = resolve(p.replace(" ", ""), m, modules, children)
            if target is None or target == m:
                continue
            found.setdefault((m, target), line_of[at])
    return modules, found


def pairs(root):
    modules, found = edges(root)
    out = []
    for (a, b), line in sorted(found.items()):
        if a < b and (b, a) in found:
            if a == b[:-1] or b == a[:-1]:
                continue  # a parent file and its own child
            out.append(f"src/{modules[a]}:{line} <-> src/{modules[b]}:{found[(b, a)]}")
    return out


def main():
    dirs = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = dirs[0] if dirs else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--edges" in sys.argv:
        modules, found = edges(root)
        for (a, b), line in sorted(found.items()):
            print(f"src/{modules[a]}:{line} -> src/{modules[b]}")
        return 0
    found = pairs(root)
    for p in found:
        print(f"{p}: these files import each other: move what both need into one of them, or into a file of its own")
    print(f"{len(found)} pair(s) of files importing each other", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
