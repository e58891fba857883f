"""reprobench datasets fetch: rows from the Hugging Face datasets API, environment specs exported
from the `swebench` package (PyPI), repositories mirrored with git. Run by `reprobench datasets
fetch`; arguments: MANIFEST_JSON OUT_DIR REPOS_DIR. Standard library only (plus pip for swebench).
"""
import json, os, subprocess, sys, tempfile, urllib.parse, urllib.request

manifest_path, out_dir, repos_dir = sys.argv[1:4]
manifest = json.load(open(manifest_path))
src = manifest["source"]
excluded = set(manifest.get("exclude", {}).get("instance_ids", []))


def get(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.load(r)


rows, offset = [], 0
while True:
    q = urllib.parse.urlencode({"dataset": src["huggingface_dataset"], "config": "default",
                                "split": src["split"], "offset": offset, "length": 100})
    page = get("https://datasets-server.huggingface.co/rows?" + q)
    batch = [r["row"] for r in page.get("rows", [])]
    rows.extend(batch)
    offset += len(batch)
    print(f"rows: {offset}/{page.get('num_rows_total', '?')}", file=sys.stderr)
    if not batch or offset >= page.get("num_rows_total", offset):
        break
kept = [r for r in rows if r["instance_id"] not in excluded]
with open(os.path.join(out_dir, "instances.jsonl"), "w") as f:
    for r in kept:
        f.write(json.dumps(r) + "\n")
print(f"kept {len(kept)} of {len(rows)} rows ({len(excluded)} ids excluded)", file=sys.stderr)

# Environment specs: exported from the swebench package, not rewritten by hand.
venv = tempfile.mkdtemp(prefix="reprobench-swebench-")
subprocess.run([sys.executable, "-m", "venv", venv], check=True)
subprocess.run([os.path.join(venv, "bin/pip"), "install", "--quiet", "swebench"], check=True)
export = r'''
import json, sys
from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS as M
parsers = {"django/django": "django", "sympy/sympy": "sympy"}
out = {}
for repo, versions in M.items():
    for version, s in versions.items():
        pkgs = s.get("pip_packages", []) or []
        if isinstance(s.get("packages"), str) and s["packages"] not in ("requirements.txt", "environment.yml"):
            pkgs = s["packages"].split() + pkgs
        pre = s.get("pre_install", []) or []
        out.setdefault(repo, {})[version] = {
            "python": s.get("python", "3.9"),
            "packages": pkgs,
            "pre_install": pre if isinstance(pre, list) else [pre],
            "install": s.get("install", ""),
            "test_cmd": s["test_cmd"] if isinstance(s["test_cmd"], str) else " ".join(s["test_cmd"]),
            "log_parser": parsers.get(repo, "pytest"),
            "test_directives": "modules" if repo == "django/django" else "paths",
        }
json.dump(out, sys.stdout, indent=1)
'''
env = subprocess.run([os.path.join(venv, "bin/python"), "-c", export], check=True, capture_output=True, text=True).stdout
open(os.path.join(out_dir, "env.json"), "w").write(env)
print("environment specs exported from swebench", file=sys.stderr)

os.makedirs(repos_dir, exist_ok=True)
for repo in sorted({r["repo"] for r in kept}):
    dest = os.path.join(repos_dir, repo.replace("/", "__") + ".git")
    if os.path.isdir(dest):
        subprocess.run(["git", "-C", dest, "fetch", "--quiet", "--prune"], check=False)
        continue
    print(f"mirroring {repo}", file=sys.stderr)
    r = subprocess.run(["git", "clone", "--quiet", "--mirror", f"https://github.com/{repo}", dest])
    if r.returncode != 0:
        print(f"could not mirror {repo}: its instances will report a missing mirror", file=sys.stderr)
