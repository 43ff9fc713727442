#!/usr/bin/python3
"""The house rules, measured: library files over 700 lines, functions over 150, commands over 300.

Usage: tools/house.py [--top N] [--check]

Reads the C++ sources of the library folders (not tests/, not the command-line tools'
main), lists the longest files and functions, and with --check exits 1 when a file is over
700 lines, a function over 150, or a command (tools/cmd_*.cpp: what it does belongs in the
library, where a test reaches it without the command line) over 300. A function is a brace block opened after a parameter list
(`) {`, `) const {`, `) override {`, ...) outside any other function; its length counts its
lines from the signature's last line to the closing brace. Lambdas count towards the function
that holds them. Strings, characters and comments are skipped when matching braces.
"""
import argparse
import pathlib
import re
import sys

LIBRARY = ["model", "partition", "sim", "exec", "kernels", "traces", "search", "campaign", "tools"]
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 150
MAX_COMMAND_LINES = 300
OPENS_BODY = re.compile(r"\)\s*(const)?\s*(noexcept)?\s*(override|final)?\s*(->\s*[\w:<>,\s*&]+)?\s*(:\s*[^;{}]*)?$")


def code_only(text):
    """The text with comments, strings and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = ')' + (m.group(1) if m else "") + '"'
            j = text.find(end, i)
            j = n if j < 0 else j + len(end)
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j + 1, n) - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(name, first line, lines) of each function body in the file."""
    text = code_only(path.read_text(errors="replace"))
    found, depth, body_depth, start, name = [], 0, None, 0, ""
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            if body_depth is None:
                before = text[max(0, i - 3000):i]
                head = before[before.rfind(";") + 1:] if ";" in before else before
                head = head[head.rfind("}") + 1:] if "}" in head else head
                if OPENS_BODY.search(head.rstrip()) and not re.search(r"\b(if|for|while|switch|catch)\s*\(", head):
                    m = re.search(r"([~\w:]+)\s*\(", head)
                    body_depth, start, name = depth, line, (m.group(1) if m else "?")
            depth += 1
        elif c == "}":
            depth -= 1
            if body_depth is not None and depth == body_depth:
                found.append((name, start, line - start + 1))
                body_depth = None
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    root = pathlib.Path(__file__).resolve().parent.parent
    sources = sorted(p for d in LIBRARY for p in (root / d).rglob("*") if p.suffix in (".cpp", ".hpp", ".cu"))
    files = sorted(((len(p.read_text(errors="replace").splitlines()), p.relative_to(root)) for p in sources), reverse=True)
    funcs = sorted(((n, f"{p.relative_to(root)}:{s}", name) for p in sources for name, s, n in functions(p)), reverse=True)
    print(f"largest files (limit {MAX_FILE_LINES} lines):")
    for n, p in files[:args.top]:
        print(f"  {n:5d}  {p}")
    print(f"longest functions (limit {MAX_FUNCTION_LINES} lines):")
    for n, where, name in funcs[:args.top]:
        print(f"  {n:5d}  {where}  {name}")
    commands = sorted((f for f in files if f[1].parent.name == "tools" and f[1].name.startswith("cmd_")), reverse=True)
    print(f"largest commands (limit {MAX_COMMAND_LINES} lines):")
    for n, p in commands[:3]:
        print(f"  {n:5d}  {p}")
    over = [f for f in files if f[0] > MAX_FILE_LINES] + [f for f in funcs if f[0] > MAX_FUNCTION_LINES]
    over += [f for f in commands if f[0] > MAX_COMMAND_LINES]
    if args.check and over:
        print(f"{len(over)} over the limits", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
