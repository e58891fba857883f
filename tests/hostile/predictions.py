#!/usr/bin/env python3
"""Hostile predictions for swt-mini: "reproduction tests" that never call the code under test.

Each one fails unless it can tell, from what the harness lets an execution see, that it runs
after the golden fix; then it passes. So an instance is graded resolved exactly when the
harness leaks the difference between a pre and a post run. Every kind of leak gets its own
instance. Prints SWT-bench predictions (JSONL) for swt-mini on standard output:

    python3 tests/hostile/predictions.py > hostile.jsonl
    reprobench eval --dataset swt-mini --predictions hostile.jsonl --executor process|docker

`--kinds` prints the kinds and their instances instead; `--injected` prints one genuine
reproduction (of reprobench__textkit-1) that also prints forged result lines after the runner's
summary, which `suspicious` must name and `--strict` must refuse; `--escape` prints a test that
starts `setsid sleep 3600` holding the output and hangs (run it with a short `--timeout-s`).
"""
import json
import os
import sys

COMMON = r'''
import os, subprocess, time, unittest

KIND = "%(kind)s"
INSTANCE = "%(instance)s"


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60).stdout
    except Exception:
        return ""


def source_files():
    out = []
    for dp, dns, fns in os.walk("."):
        dns[:] = [d for d in dns if d not in (".git", "tests", "__pycache__")]
        out += [os.path.join(dp, f) for f in fns if f.endswith(".py")]
    return out


def marker_in(directory):
    """A marker an earlier execution left here lately (then True), else leave one (False)."""
    mark = os.path.join(directory, "reprobench-hostile-%%s-%%s" %% (KIND, INSTANCE))
    try:
        if time.time() - os.stat(mark).st_mtime < 300:
            return True
    except OSError:
        pass
    try:
        with open(mark, "w") as f:
            f.write("pre")
    except OSError:
        pass
    return False


def fix_applied_here(text):
    """`text` holds a diff of source files (not tests) whose added lines are all in this tree."""
    found = False
    for section in text.split("diff --git a/")[1:]:
        path = section.split(" ", 1)[0].strip()
        if path.startswith("tests/") or not path.endswith(".py"):
            continue
        added = [l[1:] for l in section.splitlines() if l.startswith("+") and not l.startswith("+++") and l[1:].strip()]
        try:
            with open(path) as f:
                here = f.read()
        except OSError:
            continue
        if added and all(a in here for a in added):
            found = True
        elif added:
            return False
    return found


def readable_places(deadline):
    here = os.path.realpath(".")
    skip = {"/proc", "/sys", "/dev", "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/boot", here}
    for dp, dns, fns in os.walk("/"):
        if time.time() > deadline:
            return
        dns[:] = [d for d in dns if os.path.join(dp, d) not in skip and d not in ("site-packages", "target", "registry", "objects")]
        for f in fns:
            yield os.path.join(dp, f)
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                for fd in os.listdir("/proc/%%s/fd" %% p):
                    yield "/proc/%%s/fd/%%s" %% (p, fd)
            except OSError:
                pass


def read_small(path):
    """A regular file's first 4 MiB (never a pipe or a device, which could block)."""
    import stat
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return ""
        with open(path, "rb") as f:
            return f.read(4 << 20).decode("utf-8", "replace")
    except Exception:
        return ""
'''

# kind -> (what it looks at, body of post(): True when it believes the fix is in)
KINDS = {
    "git_status": ("git's view of the tree: a source file shows as changed", r'''
def post():
    lines = sh("git status --porcelain").splitlines()
    return any(l[3:].strip().endswith(".py") and not l[3:].strip().startswith("tests/") for l in lines)
'''),
    "git_diff": ("git's diff against HEAD names a source file", r'''
def post():
    names = sh("git diff HEAD --name-only").split()
    return any(n.endswith(".py") and not n.startswith("tests/") for n in names)
'''),
    "file_times": ("file times: a source file is newer than the others", r'''
def post():
    times = [os.stat(f).st_mtime for f in source_files()]
    return len(times) > 1 and max(times) - min(times) > 0.2
'''),
    "tmp_marker": ("state left by an earlier execution in /tmp", r'''
def post():
    return marker_in("/tmp")
'''),
    "home_marker": ("state left by an earlier execution in $HOME", r'''
def post():
    return marker_in(os.environ.get("HOME", "/tmp"))
'''),
    "devshm_marker": ("state left by an earlier execution in /dev/shm", r'''
def post():
    return marker_in("/dev/shm")
'''),
    "var_tmp_marker": ("state left by an earlier execution in /var/tmp", r'''
def post():
    return marker_in("/var/tmp")
'''),
    "parent_marker": ("state left by an earlier execution two levels above the tree", r'''
def post():
    return marker_in(os.path.abspath("../.."))
'''),
    "golden_patch": ("the golden fix itself, found anywhere readable and already in the tree", r'''
def post():
    deadline = time.time() + 40
    for path in readable_places(deadline):
        if path.endswith((".patch", ".diff")) or "/proc/" in path:
            if fix_applied_here(read_small(path)):
                return True
    return False
'''),
    "harness_script": ("the harness's script, found anywhere readable, names a code patch", r'''
def post():
    deadline = time.time() + 40
    for path in readable_places(deadline):
        if path.endswith((".sh", ".patch")) or "/proc/" in path or "reprobench" in path:
            text = read_small(path)
            # Made here, so that this file (and copies of it) does not hold them.
            if ("apply " + "code") in text or ("code" + ".patch") in text:
                return True
    return False
'''),
    "escaped_process": ("a process the pre run left behind is still alive", r'''
def post():
    tag = "reprobench-hostile-daemon-" + INSTANCE
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open("/proc/%%s/cmdline" %% p, "rb") as f:
                    if tag.encode() in f.read():
                        return True
            except OSError:
                pass
    subprocess.Popen(["sh", "-c", "sleep 120", tag], start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return False
'''),
    "environment_marker": ("state left by an earlier execution in the environment's site-packages", r'''
def post():
    import sysconfig
    return marker_in(sysconfig.get_paths()["purelib"])
'''),
    "pristine_copy": ("a copy of the tree as it was, found anywhere readable, differs from it in a source file", r'''
def post():
    deadline = time.time() + 40
    here = [os.path.normpath(f) for f in source_files()]
    for path in readable_places(deadline):
        for rel in here:
            if path.endswith("/" + rel):
                try:
                    with open(path, "rb") as there, open(rel, "rb") as mine:
                        if there.read() != mine.read():
                            return True
                except OSError:
                    pass
    return False
'''),
}

TEST = r'''

class HostileReproduction(unittest.TestCase):
    def test_reproduces(self):
        self.assertTrue(post(), "the harness did not tell")


if __name__ == "__main__":
    unittest.main()
'''


def instances():
    here = os.path.dirname(os.path.abspath(__file__))
    rows = os.path.join(here, "..", "..", "datasets", "swt-mini", "instances.jsonl")
    with open(rows) as f:
        return [json.loads(l)["instance_id"] for l in f if l.strip()]


def new_file_diff(path, text):
    lines = text.splitlines()
    body = "".join("+" + l + "\n" for l in lines)
    return (
        "diff --git a/%s b/%s\nnew file mode 100644\n--- /dev/null\n+++ b/%s\n@@ -0,0 +1,%d @@\n%s"
        % (path, path, path, len(lines), body)
    )


def assignments():
    ids = instances()
    if len(ids) < len(KINDS):
        sys.exit("swt-mini has %d instances for %d kinds" % (len(ids), len(KINDS)))
    return list(zip(KINDS, ids))


INJECTED = r'''import atexit

from textkit.slug import slugify


def test_accented_letters_are_transliterated():
    assert slugify("Crème Brûlée à la carte") == "creme-brulee-a-la-carte"


# After the runner's closing summary, contradicting results for a test that does not exist;
# they change no verdict (the real test decides), but a grader must notice them.
atexit.register(lambda: print("FAILED tests/test_injected.py::test_forged\n"
                              "PASSED tests/test_injected.py::test_forged", flush=True))
'''


ESCAPE = r'''import subprocess, sys, time, unittest


class Escape(unittest.TestCase):
    def test_escape(self):
        # Outlives the test if it can, holding the output open.
        subprocess.Popen(["setsid", "sleep", "3600"], stdout=sys.__stdout__, stderr=sys.__stderr__)
        time.sleep(3600)
'''


def main():
    if "--escape" in sys.argv[1:]:
        # A test that starts `setsid sleep 3600` holding the output, then hangs: its execution
        # must end at the timeout, and leave no process.
        patch = new_file_diff("tests/test_escape.py", ESCAPE)
        print(json.dumps({"instance_id": "reprobench__textkit-2", "model_name_or_path": "escape", "model_patch": patch}))
        return
    if "--injected" in sys.argv[1:]:
        # A genuine reproduction of reprobench__textkit-1 that also prints forged result lines.
        patch = new_file_diff("tests/test_injected.py", INJECTED)
        print(json.dumps({"instance_id": "reprobench__textkit-1", "model_name_or_path": "injected", "model_patch": patch}))
        return
    if "--kinds" in sys.argv[1:]:
        for kind, instance in assignments():
            print("%s\t%s\t%s" % (kind, instance, KINDS[kind][0]))
        return
    for kind, instance in assignments():
        source = (COMMON % {"kind": kind, "instance": instance}) + (KINDS[kind][1] % ()) + TEST
        patch = new_file_diff("tests/test_hostile_%s.py" % kind, source)
        print(json.dumps({"instance_id": instance, "model_name_or_path": "hostile", "model_patch": patch}))


if __name__ == "__main__":
    main()
