"""Reading src/ as the .ci checks need it: each file's text with its test items blanked out, and
what the rest of it names of the crate. Shared by layers.py and cycles.py.

A test item is whatever follows `#[cfg(test)]`: a `mod tests { ... }` block (found by matching
braces that skips strings, chars and comments), a `mod x;` line or one item. It is replaced by
blank lines, so line numbers stay those of the file, and what comes after it is still read (the
old check stopped at the first `#[cfg(test)]` and never read the 288 lines after five mode files'
tests, every `MODE` among them).
"""
import os
import re

CFG_TEST = "#[cfg(test)]"


def _skip_literal(text, i):
    """Index just past the string, char or comment starting at text[i], or i if none starts there."""
    n = len(text)
    if text.startswith("//", i):
        j = text.find("\n", i)
        return n if j < 0 else j
    if text.startswith("/*", i):
        depth, j = 1, i + 2
        while j < n and depth:
            if text.startswith("/*", j):
                depth, j = depth + 1, j + 2
            elif text.startswith("*/", j):
                depth, j = depth - 1, j + 2
            else:
                j += 1
        return j
    m = re.compile(r'b?r(#*)"').match(text, i)
    if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
        end = text.find('"' + m.group(1), m.end())
        return n if end < 0 else end + 1 + len(m.group(1))
    if text[i] == '"' or text.startswith('b"', i) and (i == 0 or not text[i - 1].isalnum()):
        j = i + (2 if text[i] == "b" else 1)
        while j < n and text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        return j + 1
    if text[i] == "'":
        # A char literal ('x', '\n', '\u{1F600}', '{'), not a lifetime ('a, 'static).
        m = re.compile(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'").match(text, i)
        if m:
            return m.end()
    return i


def _item_end(text, i):
    """End of the item starting at text[i]: past its `;` or its matching `}` at depth 0."""
    depth, n = 0, len(text)
    while i < n:
        j = _skip_literal(text, i)
        if j != i:
            i = j
            continue
        c = text[i]
        if c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
            if depth == 0 and c == "}":
                return i + 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return n


def blank_tests(text):
    """The text with every `#[cfg(test)]` item replaced by blank lines (newlines kept)."""
    out, i = [], 0
    while True:
        j = text.find(CFG_TEST, i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        # Only an attribute at the start of a line (not one quoted in a comment or string).
        line_start = text.rfind("\n", 0, j) + 1
        if text[line_start:j].strip():
            out.append(text[i:j + len(CFG_TEST)])
            i = j + len(CFG_TEST)
            continue
        end = _item_end(text, j + len(CFG_TEST))
        out.append(text[i:j])
        out.append("\n" * text.count("\n", j, end))
        i = end


def test_module_lines(text):
    """Line numbers (1-based) where a `#[cfg(test)]` attribute starts a line."""
    return [i for i, line in enumerate(text.splitlines(), 1) if line.strip() == CFG_TEST]


def code_lines(text):
    """(line number, line) of the text with tests blanked, comments dropped (strings kept)."""
    body = blank_tests(text)
    return [(i, line) for i, line in enumerate(body.splitlines(), 1) if not line.lstrip().startswith("//")]


def rust_files(root):
    """(path, path relative to src/) of every .rs file under src/, sorted."""
    src = os.path.join(root, "src")
    for dirpath, dirs, files in os.walk(src):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".rs"):
                path = os.path.join(dirpath, f)
                yield path, os.path.relpath(path, src)
