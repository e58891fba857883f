//! What a test under evaluation can learn from inside an execution, on both sandboxes: nothing
//! of the harness. A pre-fix and a post-fix execution of the same probe must see the same world
//! (git's view, file times and inode order, what lies around the tree, processes, mounts,
//! identity, environment), but for the code's content; nothing an earlier execution wrote is
//! there; the environment cannot be written; a stale bytecode cache never runs; and every
//! process an execution started ends with it, `setsid` or not.
//!
//! The process sandbox needs bubblewrap; the docker sandbox the engine and its base image
//! (`reprobench images bootstrap`). Without them a test prints why and passes, unless
//! `REPROBENCH_REQUIRE_DOCKER=1` (docker) or `REPROBENCH_REQUIRE_ISOLATION=1` (process).

use reprobench_sandbox::docker::{DEFAULT_BASE_IMAGE, DockerConfig, DockerSandbox};
use reprobench_sandbox::process::ProcessSandbox;
use reprobench_sandbox::{
    EnvRecipe, ExecOutput, ExecRequest, InputFile, Limits, PatchFile, Prepared, Sandbox,
    StageAheadMode,
};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MODULE: &str = "def f():\n    return 1  # integrity-fix-token\n";
/// The golden fix: the same size, so only content tells it (and a stale cache would hide it).
const FIX: &str = "diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1  # integrity-fix-token\n+    return 2  # integrity-fix-token\n";
const TEST: &str = "diff --git a/tests/test_m.py b/tests/test_m.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_m.py\n@@ -0,0 +1,2 @@\n+from pkg.m import f\n+assert f() in (1, 2)\n";

/// Prints, as one JSON object, everything about its world that must not depend on which
/// patches went in; writes markers where a later execution could find them; reports markers an
/// earlier one left, files that hold the fix's text outside the tree, and whether it can write
/// the environment.
const PROBE: &str = r#"
import json, os, stat, subprocess, sys
out = {}
def sh(cmd):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
    return r.stdout + r.stderr
out["git"] = sh("git status --porcelain --ignored; git log --all --format='%an %ae %ad %s' --date=raw; "
                "git count-objects -v | grep -v size; git stash list; git reflog --format=%gs; "
                "git diff HEAD --stat; ls -a .git; find .git -type f | grep -v /objects/pack/ | sort")
entries = []
for dp, dns, fns in os.walk("."):
    dns[:] = sorted(d for d in dns if not (dp == "." and d == ".git"))
    for n in sorted(dns + fns):
        p = os.path.join(dp, n)
        entries.append((p, os.lstat(p)))
# Inode numbers follow creation order (and so do creation times): their ranks tell which files
# were written when.
ino = {i: r for r, i in enumerate(sorted(st.st_ino for _, st in entries))}
out["tree"] = [(p, stat.filemode(st.st_mode), st.st_mtime_ns, ino[st.st_ino], st.st_nlink, st.st_uid, st.st_gid) for p, st in entries]
out["identity"] = [os.getuid(), os.geteuid(), os.getgid(), sorted(os.getgroups()), os.getcwd()]
out["env"] = sorted("%s=%s" % kv for kv in os.environ.items())
around = {}
for d in ["/", "/tmp", "/var/tmp", "/dev/shm", os.environ.get("HOME", "/"), "..", "../..", os.environ.get("REPROBENCH_SUPPORT", "/")]:
    try:
        around[d] = sorted(os.listdir(d))
    except OSError as e:
        around[d] = "error %s" % e.errno
out["around"] = around
procs = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                procs.append(f.read().replace(b"\0", b" ").decode("utf-8", "replace"))
        except OSError:
            pass
out["processes"] = sorted(procs)
with open("/proc/self/mountinfo") as f:
    out["mounts"] = sorted(" ".join(l.split()[4:6]) for l in f)
found = []
places = ["/tmp", "/var/tmp", "/dev/shm", os.environ.get("HOME", "/tmp"), "..", os.environ.get("REPROBENCH_SUPPORT", "/tmp")]
for d in places:
    if os.path.exists(os.path.join(d, "integrity-marker")):
        found.append(d)
for d in places:
    m = os.path.join(d, "integrity-marker")
    try:
        with open(m, "w") as f:
            f.write("here")
    except OSError:
        pass
out["markers_found"] = found
leaks = []
# Made here, so that this file does not hold it.
token = ("return " + "2  # integrity-" + "fix-token").encode()
skip = {"/proc", "/sys", "/dev", "/usr", "/etc", os.path.realpath(".")}
for top in ["/"]:
    for dp, dns, fns in os.walk(top):
        dns[:] = [d for d in dns if os.path.join(dp, d) not in skip]
        for n in fns:
            p = os.path.join(dp, n)
            try:
                if os.path.getsize(p) < (1 << 20):
                    with open(p, "rb") as f:
                        if token in f.read():
                            leaks.append(p)
            except OSError:
                pass
out["fix_text_outside_the_tree"] = leaks
venv = os.environ.get("VIRTUAL_ENV") or os.path.dirname(os.path.dirname(sys.executable))
out["venv_writable"] = os.access(venv, os.W_OK) or sh("touch %s/written 2>/dev/null && echo yes" % venv).strip() == "yes"
sys.path.insert(0, ".")
import pkg.m
out_value = pkg.m.f()
print(json.dumps({"world": out, "f": out_value}, sort_keys=True))
"#;

fn require(var: &str, why: &str) -> Option<()> {
    if std::env::var(var).as_deref() == Ok("1") {
        panic!("{var}=1 but {why}");
    }
    eprintln!("skipped: {why}");
    None
}

fn git(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .status()
        .unwrap()
        .success();
    assert!(ok, "git {args:?}");
}

/// A bare mirror of a tiny package; (mirror, commit). The commit is the same on every run.
fn mirror(root: &Path) -> (PathBuf, String) {
    let work = root.join("src");
    std::fs::create_dir_all(work.join("pkg")).unwrap();
    std::fs::create_dir_all(work.join("tests")).unwrap();
    std::fs::write(work.join("pkg/__init__.py"), "").unwrap();
    std::fs::write(work.join("pkg/m.py"), MODULE).unwrap();
    std::fs::write(work.join("pkg/other.py"), "X = 1\n").unwrap();
    std::fs::write(work.join("tests/__init__.py"), "").unwrap();
    std::fs::write(work.join("probe.py"), PROBE).unwrap();
    git(&work, &["init", "-q"]);
    git(&work, &["add", "-A"]);
    let ok = Command::new("git")
        .arg("-C")
        .arg(&work)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "pkg",
        ])
        .env("GIT_AUTHOR_DATE", "2020-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2020-01-01T00:00:00Z")
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let out = Command::new("git")
        .args(["-C", work.to_str().unwrap(), "rev-parse", "HEAD"])
        .output()
        .unwrap();
    let commit = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let bare = root.join("o__pkg.git");
    let ok = Command::new("git")
        .args(["clone", "-q", "--bare"])
        .arg(&work)
        .arg(&bare)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    (bare, commit)
}

/// The install step leaves a bytecode cache of `pkg/m.py` compiled from a source with the seal's
/// time and the fixed source's size: valid for the fixed source too, by Python's check, unless
/// the sandbox removes it.
fn recipe(mirror: PathBuf, commit: String, python: &str) -> EnvRecipe {
    EnvRecipe {
        repo: "o/pkg".into(),
        mirror,
        base_commit: commit,
        python: python.into(),
        install: "touch -d @946684800 pkg/m.py && python -m py_compile pkg/m.py && ls pkg/__pycache__ | grep -q m.".into(),
        // django 3.x's exports need it; hosts often lack it (the process sandbox compiles it).
        locales: vec!["en_US.UTF-8".into()],
        ..Default::default()
    }
}

fn request(patches: &[(&str, &str)], command: &[&str], timeout: Duration) -> ExecRequest {
    ExecRequest {
        patches: patches
            .iter()
            .map(|(label, text)| PatchFile {
                label: label.to_string(),
                contents: text.as_bytes().to_vec(),
            })
            .collect(),
        command: command.iter().map(|s| s.to_string()).collect(),
        limits: Limits {
            timeout,
            memory_mb: 1024,
            disk_mb: 256,
            ..Limits::default()
        },
        ..ExecRequest::default()
    }
}

/// The sandboxes this machine has, each with a prepared instance; those it lacks are skipped.
async fn sandboxes(root: &Path) -> Vec<(&'static str, Arc<dyn Sandbox>, Prepared)> {
    let (bare, commit) = mirror(root);
    let mut out: Vec<(&'static str, Arc<dyn Sandbox>, Prepared)> = Vec::new();
    let cache = root.join("cache");
    let process = ProcessSandbox::new(cache.clone());
    if let Some(problem) = process.isolation_problem() {
        require(
            "REPROBENCH_REQUIRE_ISOLATION",
            &format!("the process sandbox cannot isolate here: {problem}"),
        );
    } else {
        let python = String::from_utf8(
            Command::new("python3")
                .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let r = recipe(bare.clone(), commit.clone(), python.trim());
        let prepared = process.prepare(&r).await.expect("process prepare");
        out.push(("process", Arc::new(process), prepared));
    }
    let cfg = DockerConfig {
        cache_dir: cache.join("docker"),
        ..DockerConfig::default()
    };
    match DockerSandbox::connect(cfg, StageAheadMode::default()).await {
        Ok(sb) if sb.engine().inspect_image(DEFAULT_BASE_IMAGE).await.is_ok() => {
            let python = sb.base_python().await.expect("base python");
            let r = recipe(bare, commit, &python);
            let prepared = sb.prepare(&r).await.expect("docker prepare");
            out.push(("docker", Arc::new(sb), prepared));
        }
        Ok(_) => {
            require(
                "REPROBENCH_REQUIRE_DOCKER",
                &format!(
                    "base image {DEFAULT_BASE_IMAGE} is missing (reprobench images bootstrap)"
                ),
            );
        }
        Err(e) => {
            require(
                "REPROBENCH_REQUIRE_DOCKER",
                &format!("the Docker engine is not reachable ({e})"),
            );
        }
    }
    out
}

/// A locale the recipe names is there in every execution, whether the host has it or not.
#[tokio::test]
async fn the_locales_a_recipe_names_are_there_in_every_execution() {
    let root = tempdir();
    for (kind, sb, prepared) in sandboxes(root.path()).await {
        let script = "LANG=en_US.UTF-8 LC_ALL=en_US.UTF-8 python3 -c 'import locale; print(locale.setlocale(locale.LC_ALL, \"\"), locale.getpreferredencoding())'";
        let out = sb
            .exec(
                &prepared,
                request(&[], &["bash", "-c", script], Duration::from_secs(60)),
            )
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(0), "{kind}: {}", out.output);
        assert_eq!(out.output.trim(), "en_US.UTF-8 UTF-8", "{kind}");
    }
}

fn tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn probed(kind: &str, out: &ExecOutput) -> serde_json::Value {
    assert_eq!(out.exit_code, Some(0), "{kind}: {}", out.output);
    serde_json::from_str(out.output.trim())
        .unwrap_or_else(|e| panic!("{kind}: {e}: {}", out.output))
}

#[tokio::test]
async fn a_pre_and_a_post_execution_see_the_same_world_but_for_the_code() {
    let root = tempdir();
    for (kind, sb, prepared) in sandboxes(root.path()).await {
        let run = |patches: &'static [(&'static str, &'static str)]| {
            let (sb, prepared) = (sb.clone(), prepared.clone());
            async move {
                let out = sb
                    .exec(
                        &prepared,
                        request(patches, &["python3", "probe.py"], Duration::from_secs(300)),
                    )
                    .await
                    .unwrap();
                assert!(out.patches.iter().all(|p| p.applied), "{kind}: {out:?}");
                probed(kind, &out)
            }
        };
        let pre = run(&[("test", TEST)]).await;
        let post = run(&[("code", FIX), ("test", TEST)]).await;
        // The code differs, and the post execution runs the fixed code, not a stale cache of it.
        assert_eq!(
            (pre["f"].as_i64(), post["f"].as_i64()),
            (Some(1), Some(2)),
            "{kind}"
        );
        let (pre, post) = (&pre["world"], &post["world"]);
        for key in pre.as_object().unwrap().keys() {
            assert_eq!(
                pre[key], post[key],
                "{kind}: `{key}` differs between pre and post"
            );
        }
        assert_eq!(
            post["markers_found"],
            serde_json::json!([]),
            "{kind}: an earlier execution's files are there"
        );
        assert_eq!(
            post["fix_text_outside_the_tree"],
            serde_json::json!([]),
            "{kind}"
        );
        assert_eq!(
            post["venv_writable"],
            serde_json::json!(false),
            "{kind}: the environment is writable"
        );
        let git = post["git"].as_str().unwrap();
        assert!(
            git.starts_with(
                "reprobench reprobench@localhost 946684800 +0000 reprobench: base commit\n"
            ),
            "{kind}: {git}"
        );
        assert_ne!(
            post["identity"][0],
            serde_json::json!(0),
            "{kind}: runs as root"
        );
        eprintln!("{kind}: pre and post see the same world");
    }
}

/// Whether a process whose command line holds `marker` is alive on this host.
fn alive(marker: &str) -> bool {
    let out = Command::new("pgrep").args(["-f", marker]).output().unwrap();
    !String::from_utf8_lossy(&out.stdout).trim().is_empty()
}

/// Polls until no process holds `marker`, failing at the deadline.
async fn none_left(kind: &str, marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while alive(marker) {
        assert!(
            Instant::now() < deadline,
            "{kind}: a process of the execution is still alive ({marker})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn every_process_an_execution_started_ends_with_it_setsid_or_not() {
    let root = tempdir();
    for (kind, sb, prepared) in sandboxes(root.path()).await {
        let marker = format!("3600.{}{}", std::process::id(), kind.len());
        // Escapes that hold the output open, started by the shell and by Python, then an end.
        let script = format!(
            "setsid sleep {marker} & \
             python3 -c 'import subprocess; subprocess.Popen([\"sleep\", \"{marker}\"], start_new_session=True)'; \
             echo done"
        );
        let out = tokio::time::timeout(
            Duration::from_secs(300),
            sb.exec(
                &prepared,
                request(&[], &["sh", "-c", &script], Duration::from_secs(600)),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("{kind}: the execution waited on its escaped processes"))
        .unwrap();
        assert_eq!(out.exit_code, Some(0), "{kind}: {}", out.output);
        assert_eq!(out.output.trim(), "done", "{kind}");
        none_left(kind, &marker).await;

        // Killed at its timeout, with an escape running.
        let marker = format!("3601.{}{}", std::process::id(), kind.len());
        let script = format!("setsid sleep {marker} & sleep {marker}");
        let out = tokio::time::timeout(
            Duration::from_secs(300),
            sb.exec(
                &prepared,
                request(&[], &["sh", "-c", &script], Duration::from_secs(2)),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("{kind}: the timed-out execution did not end"))
        .unwrap();
        assert!(out.timed_out, "{kind}: {out:?}");
        none_left(kind, &marker).await;
        eprintln!("{kind}: no process outlived its execution");
    }
}

#[tokio::test]
async fn support_files_are_there_outside_the_tree_and_the_collected_one_comes_back() {
    let root = tempdir();
    for (kind, sb, prepared) in sandboxes(root.path()).await {
        let mut req = request(
            &[],
            &[
                "sh",
                "-c",
                "cat \"$REPROBENCH_SUPPORT/tool.txt\"; test -e tool.txt || echo not-in-the-tree; \
                 echo counted > \"$REPROBENCH_SUPPORT/out.txt\"",
            ],
            Duration::from_secs(120),
        );
        req.support.push(InputFile {
            path: "tool.txt".into(),
            contents: b"tool\n".to_vec(),
            mode: 0o644,
        });
        req.collect = Some("out.txt".into());
        let out = sb.exec(&prepared, req).await.unwrap();
        assert_eq!(out.output, "tool\nnot-in-the-tree\n", "{kind}");
        assert_eq!(out.collected.as_deref(), Some(&b"counted\n"[..]), "{kind}");
    }
}

#[tokio::test]
async fn a_dropped_execution_is_killed_at_once_not_left_to_its_timeout() {
    let root = tempdir();
    for (kind, sb, prepared) in sandboxes(root.path()).await {
        let marker = format!("3602.{}{}", std::process::id(), kind.len());
        let script = format!("setsid sleep {marker} & sleep {marker}");
        let task = tokio::spawn({
            let (sb, prepared) = (sb.clone(), prepared.clone());
            async move {
                sb.exec(
                    &prepared,
                    request(&[], &["sh", "-c", &script], Duration::from_secs(3600)),
                )
                .await
            }
        });
        // Running: then the attempt goes away (cancelled, revoked, drained).
        let deadline = Instant::now() + Duration::from_secs(120);
        while !alive(&marker) {
            assert!(
                Instant::now() < deadline,
                "{kind}: the execution never started"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        task.abort();
        none_left(kind, &marker).await;
        eprintln!("{kind}: a dropped execution left no process");
    }
}
