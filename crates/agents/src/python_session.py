# The `python` tool's session: the task's earlier cells are run again, their output discarded,
# then the new cell, as an interactive interpreter would run it (a last expression's value is
# printed). State (names, imports, changes to modules) thus carries from call to call of a task,
# while every call starts from a fresh copy of the repository. Runs on Python 3.6 to 3.13.
import ast
import json
import linecache
import os
import sys
import traceback

CELLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cells.json")


def run_cell(source, name, namespace, echo):
    # Tracebacks then show the cell's lines.
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    tree = ast.parse(source, name)
    last = None
    if echo and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), namespace)
    if last is not None:
        value = eval(compile(last, name, "eval"), namespace)
        if value is not None:
            print(repr(value))


def silenced(run):
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        run()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (null,) + saved:
            os.close(fd)


def main():
    with open(CELLS) as f:
        cells = json.load(f)
    # As in an interactive interpreter: the working directory (the repository) comes first.
    sys.path[0] = ""
    namespace = {"__name__": "__main__"}
    for number, source in enumerate(cells[:-1], 1):

        def replay(source=source, number=number):
            try:
                run_cell(source, "<call %d>" % number, namespace, False)
            except BaseException:
                pass

        silenced(replay)
    try:
        run_cell(cells[-1], "<call %d>" % len(cells), namespace, True)
    except SystemExit:
        raise
    except BaseException:
        kind, value, trace = sys.exc_info()
        # The session's own frames are not the agent's code, nor is the parser's.
        while trace is not None and trace.tb_frame.f_code.co_filename == __file__:
            trace = trace.tb_next
        if isinstance(value, SyntaxError):
            trace = None
        traceback.print_exception(kind, value, trace)
        sys.exit(1)


main()
