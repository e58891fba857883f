# reprobench's line-count tracer: runs a test command (a script, or a module with -m) under
# sys.settrace, counting line events in the frames of the files the golden code patch changes,
# and appends to OUT one JSON line per traced file: {path: {line: count}} over the file's
# executable lines (0 for those not run). Python children started through subprocess are traced
# the same way. This is the measurement SWT-bench's coverage figures are computed from.
# Written for every Python from 3.5 on: no f-strings, no walrus.
import dis
import fcntl
import json
import os
import re
import subprocess
import sys
import threading
import tokenize
import types

USAGE = "usage: coverage_tracer.py --out FILE (--include REGEX | --root DIR --file F...) (-m MODULE | -c CODE | SCRIPT) [ARGS...]"


def parse_args(argv):
    """(out, include, root, cwd_first, mode (-m, -c or None for a script), target, rest).

    `--root DIR --file F ...` traces the files F under DIR (and writes their paths relative to
    DIR); `--include REGEX` is what traced children get. `--cwd-first` puts the working
    directory first on sys.path, as `python -m` and `python -c` do; without it a module runs
    with this file's directory there, as under SWT-bench's tracer."""
    out = None
    include = None
    root = None
    cwd_first = False
    files = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--cwd-first":
            cwd_first = True
            i += 1
            continue
        if a not in ("--out", "--include", "--root", "--file") or i + 1 >= len(argv):
            break
        value = argv[i + 1]
        if a == "--out":
            out = value
        elif a == "--include":
            include = value
        elif a == "--root":
            root = value
        else:
            files.append(value)
        i += 2
    if include is None and root is not None and files:
        include = re.escape(root) + "/(" + "|".join(re.escape(f) for f in files) + ")"
    if out is None or include is None or i >= len(argv):
        sys.exit(USAGE)
    if argv[i] in ("-m", "-c"):
        if i + 1 >= len(argv):
            sys.exit(USAGE)
        return out, include, root, cwd_first, argv[i], argv[i + 1], argv[i + 2:]
    return out, include, root, cwd_first, None, argv[i], argv[i + 1:]


class LineCounter(object):
    """Counts line events in frames whose module file fully matches the include pattern."""

    def __init__(self, include):
        self.pattern = re.compile(include)
        self.counts = {}

    def on_call(self, frame, event, arg):
        if event != "call":
            return None
        path = frame.f_globals.get("__file__", None)
        if path is not None and self.pattern.fullmatch(path):
            return self.on_line
        return None

    def on_line(self, frame, event, arg):
        if event == "line":
            key = (frame.f_code.co_filename, frame.f_lineno)
            self.counts[key] = self.counts.get(key, 0) + 1
        return self.on_line

    def start(self):
        threading.settrace(self.on_call)
        sys.settrace(self.on_call)

    def stop(self):
        sys.settrace(None)
        threading.settrace(None)


def docstring_lines(path, encoding):
    """Lines of strings that open a block (or the file): docstrings carry no line events."""
    lines = set()
    previous = tokenize.INDENT
    with open(path, encoding=encoding) as f:
        for kind, _, start, end, _ in tokenize.generate_tokens(f.readline):
            if kind == tokenize.STRING and previous == tokenize.INDENT:
                lines.update(range(start[0], end[0] + 1))
            previous = kind
    return lines


def code_lines(code, skip, found):
    """Adds the line-table lines of `code` and of the code objects nested in it."""
    for _, line in dis.findlinestarts(code):
        if line is not None and line not in skip:
            found.add(line)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            code_lines(const, skip, found)


def executable_lines(path):
    """The lines of a source file that can produce line events, or None if it cannot be read."""
    try:
        with tokenize.open(path) as f:
            source = f.read()
            encoding = f.encoding
        code = compile(source, path, "exec")
        skip = docstring_lines(path, encoding)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    found = set()
    code_lines(code, skip, found)
    return found


def write_counts(out, counts, root):
    """Appends one JSON line per file with counts (paths under `root` relative to it); several
    processes may append to `out`."""
    per_file = {}
    for (path, line), n in counts.items():
        per_file.setdefault(path, {})[line] = n
    text = []
    for path in sorted(per_file):
        if path.startswith("<") and path.endswith(">"):
            continue
        lines = executable_lines(path)
        if lines is None:
            continue
        hits = per_file[path]
        row = dict((str(line), hits.get(line, 0)) for line in sorted(lines))
        if root and path.startswith(root.rstrip("/") + "/"):
            path = path[len(root.rstrip("/")) + 1:]
        text.append(json.dumps({path: row}) + "\n")
    with open(out, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write("".join(text))
        f.flush()
        fcntl.flock(f, fcntl.LOCK_UN)


PYTHON_FLAGS_WITH_VALUE = ("-X", "-W", "--check-hash-based-pycs")
INTERACTIVE_FLAG = re.compile(r"-[A-Za-z]*i[A-Za-z]*$")
MODE_FLAG = re.compile(r"-([A-Za-z]*?)([cm])(.*)$")


def traced_command(argv, tracer_args):
    """The argv of a Python child run under this tracer, or None to run it as it is.

    The interpreter's own flags stay in front; a script, `-m MODULE` or `-c CODE` and its
    arguments go behind the tracer. Interactive and stdin programs are not traced."""
    flags = []
    rest = iter(argv[1:])
    for a in rest:
        if INTERACTIVE_FLAG.match(a) or a == "-":
            return None
        if a == "--":
            a = next(rest, None)
            if a is None:
                return None
            return [sys.executable] + flags + [__file__] + tracer_args + [a] + list(rest)
        if not a.startswith("-"):
            return [sys.executable] + flags + [__file__] + tracer_args + [a] + list(rest)
        mode = MODE_FLAG.match(a)
        if mode:
            if mode.group(1):
                flags.append("-" + mode.group(1))
            value = mode.group(3) or next(rest, None)
            if value is None:
                return None
            return [sys.executable] + flags + [__file__] + tracer_args + ["--cwd-first", "-" + mode.group(2), value] + list(rest)
        flags.append(a)
        if a in PYTHON_FLAGS_WITH_VALUE:
            value = next(rest, None)
            if value is None:
                return None
            flags.append(value)
    return None


def trace_children(tracer_args):
    """Makes subprocess start Python children under this tracer."""
    original = subprocess.Popen.__init__

    def init(self, args, *positional, **kwargs):
        new = args
        as_list = args
        if isinstance(args, str):
            import shlex
            as_list = shlex.split(args)
        if isinstance(as_list, (list, tuple)) and as_list and "python" in os.path.basename(str(as_list[0])):
            traced = traced_command([str(a) for a in as_list], tracer_args)
            if traced is not None:
                new = " ".join(traced) if isinstance(args, str) and kwargs.get("shell") else traced
        original(self, new, *positional, **kwargs)

    subprocess.Popen.__init__ = init


def main():
    out, include, root, cwd_first, mode, target, rest = parse_args(sys.argv[1:])
    tracer_args = ["--out", out, "--include", include]
    if root:
        tracer_args += ["--root", root]
    if cwd_first and mode is not None:
        sys.path[0] = os.getcwd()
    counter = LineCounter(include)
    trace_children(tracer_args)
    status = 0
    if mode == "-m":
        import runpy
        sys.argv = [target] + rest
        run = lambda: runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif mode == "-c":
        sys.argv = ["-c"] + rest
        code = compile(target, "<string>", "exec")
        main_globals = {"__file__": "<string>", "__name__": "__main__", "__package__": None, "__cached__": None}
        run = lambda: exec(code, main_globals)
    else:
        sys.argv = [target] + rest
        sys.path[0] = os.path.dirname(target)
        with open(target, "rb") as f:
            code = compile(f.read(), target, "exec")
        main_globals = {"__file__": target, "__name__": "__main__", "__package__": None, "__cached__": None}
        run = lambda: exec(code, main_globals)
    counter.start()
    try:
        run()
    except SystemExit as e:
        if e.code is None:
            status = 0
        elif isinstance(e.code, int):
            status = e.code
        else:
            sys.stderr.write(str(e.code) + "\n")
            status = 1
    finally:
        counter.stop()
        write_counts(out, counter.counts, root)
    sys.exit(status)


if __name__ == "__main__":
    main()
