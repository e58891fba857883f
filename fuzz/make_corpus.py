#!/usr/bin/env python3
"""Builds fuzz/corpus/TARGET/ (not committed) from the committed seeds in fuzz/seeds/ and from
files already in the repository: swt-mini's patches and rows, the hostile predictions, the
android rows and reports, and the TOML examples in the README and docs.

    python3 fuzz/make_corpus.py            # from the workspace root or anywhere
"""
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUZZ = os.path.join(ROOT, "fuzz")
CAP = 16 << 10  # larger seeds only slow libFuzzer down; -max_len cuts them anyway
TARGETS = ["diff_reader", "log_parsers", "jsonl_rows", "parquet_rows", "sweep_toml"]


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    data = data[:CAP]
    if not data:
        return
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(FUZZ, "corpus", target, name), "wb") as f:
        f.write(data)


def lines(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return [l for l in f.read().splitlines() if l.strip()]


def main():
    for t in TARGETS:
        os.makedirs(os.path.join(FUZZ, "corpus", t), exist_ok=True)
        for seed in glob.glob(os.path.join(FUZZ, "seeds", t, "*")):
            with open(seed, "rb") as f:
                put(t, f.read())

    swt_rows = lines("datasets/swt-mini/instances.jsonl")
    for line in swt_rows:
        row = json.loads(line)
        put("diff_reader", row.get("patch") or "")
        put("diff_reader", row.get("test_patch") or "")
        if len(line) <= CAP:
            put("jsonl_rows", line + "\n")
        pred = {
            "instance_id": row["instance_id"],
            "model_name_or_path": "fuzz",
            "model_patch": row.get("test_patch"),
        }
        put("jsonl_rows", json.dumps(pred) + "\n")
    put("jsonl_rows", "[" + ",".join(l for l in swt_rows[:2]) + "]")
    put("diff_reader",
        "diff --git a/img.png b/img.png\nnew file mode 100644\nBinary files /dev/null and b/img.png differ\n"
        "diff --git a/old.py b/old.py\ndeleted file mode 100644\n--- a/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x\n-y\n"
        "diff --git a/t.py b/t.py\nGIT binary patch\nliteral 0\nHcmV?d00001\n"
        "--- a/../x.py\t2024-01-01\n+++ \"b/x y.py\"\n@@ -3 +3,2 @@ ctx\n-a\n+b\n+c\n\\ No newline at end of file\n")

    try:
        out = subprocess.run([sys.executable, os.path.join(ROOT, "tests/hostile/predictions.py")],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        for line in out.splitlines()[:12]:
            if line.strip():
                put("jsonl_rows", line + "\n")
                put("diff_reader", json.loads(line).get("model_patch") or "")
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        print(f"make_corpus: skipping the hostile predictions: {e}", file=sys.stderr)

    android = lines("datasets/android-ltg75/instances.jsonl")
    put("jsonl_rows", "\n".join(android[:4]) + "\n")
    for line in android[:4]:
        row = json.loads(line)
        put("jsonl_rows", json.dumps({k: row[k] for k in ("instance_id", "app", "bug_type", "ground_truth_actions")}) + "\n")
    for report in sorted(glob.glob(os.path.join(ROOT, "datasets/android-sim/reports/*.json")))[:4]:
        with open(report, "rb") as f:
            put("jsonl_rows", f.read())

    blocks = re.compile(r"```toml\n(.*?)```", re.S)
    for doc in [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs/*.md")):
        with open(doc, encoding="utf-8") as f:
            for block in blocks.findall(f.read()):
                put("sweep_toml", block)

    for t in TARGETS:
        print(f"corpus {t}: {len(os.listdir(os.path.join(FUZZ, 'corpus', t)))} files")


if __name__ == "__main__":
    main()
