"""Reading Rust source for the .ci checks: the lexer that blanks comments, strings and character
literals (shared with fn-lengths.py), and the removal of test items, so that a check reads a
whole file except its `#[cfg(test)]` items (the `mod tests { ... }` block), code after them included.
"""
import importlib.util
import os
import re

_spec = importlib.util.spec_from_file_location("fn_lengths", os.path.join(os.path.dirname(__file__), "fn-lengths.py"))
_fn_lengths = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fn_lengths)
code_only = _fn_lengths.code_only

CFG_TEST = re.compile(r"#\[cfg\(test\)\]")


def test_items(code):
    """(start, end) offsets of every `#[cfg(test)]` item in `code` (the output of `code_only`): from
    the attribute to the brace that closes the item's block, or to its `;` (`mod tests;`, a `use`)."""
    spans = []
    pos = 0
    while (m := CFG_TEST.search(code, pos)):
        k = m.end()
        while k < len(code) and code[k] not in "{;":
            k += 1
        if k < len(code) and code[k] == "{":
            k = _fn_lengths.block_end(code, k)
        end = min(k + 1, len(code))
        spans.append((m.start(), end))
        pos = end
    return spans


def without_tests(text):
    """(code, spans): `text` with comments, strings, characters and test items blanked (offsets and
    newlines kept, so line numbers still hold), and the blanked test items' spans."""
    code = code_only(text)
    spans = test_items(code)
    for a, b in spans:
        code = code[:a] + re.sub(r"[^\n]", " ", code[a:b]) + code[b:]
    return code, spans


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1
