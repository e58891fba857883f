//! The Docker sandbox against a real engine and a tiny bare git repository made here.
//!
//! Needs the engine and the base image ([`DEFAULT_BASE_IMAGE`]). Without them each test prints
//! why and passes, unless `REPROBENCH_REQUIRE_DOCKER=1`, when it fails. Make the base image with
//! `cargo test -p reprobench-agent-node --test docker_sandbox -- --ignored bootstrap` (root,
//! debootstrap) or `reprobench images bootstrap`.

use bollard::query_parameters::{
    EventsOptionsBuilder, ListContainersOptionsBuilder, RemoveImageOptionsBuilder,
    TagImageOptionsBuilder,
};
use futures_util::StreamExt;
use reprobench_sandbox::docker::{
    BootstrapOptions, CONTAINER_LABEL, DEFAULT_BASE_IMAGE, DockerConfig, DockerSandbox,
    LAYER_LABEL, LayerKind, bootstrap_base_image, plan_eviction,
};
use reprobench_sandbox::{
    EnvRecipe, ExecOutput, ExecRequest, InputFile, Limits, PatchFile, Prepared, Sandbox,
    SandboxError, StageAheadMode,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const CALC: &str = "def add(a, b):\n    return a + b\n";
const TEST_CALC: &str = "import unittest\n\nfrom calc import add\n\n\nclass TestAdd(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\nif __name__ == '__main__':\n    unittest.main()\n";

/// Skips (prints why, returns `None`) or, under `REPROBENCH_REQUIRE_DOCKER=1`, fails.
fn skip<T>(why: &str) -> Option<T> {
    if std::env::var("REPROBENCH_REQUIRE_DOCKER").as_deref() == Ok("1") {
        panic!("REPROBENCH_REQUIRE_DOCKER=1 but {why}");
    }
    eprintln!("skipping Docker sandbox test: {why}");
    None
}

/// A connected sandbox with a private cache dir, or `None` (skip) without engine or base image.
async fn sandbox() -> Option<(DockerSandbox, tempfile::TempDir)> {
    let cache = tempfile::tempdir().unwrap();
    let cfg = DockerConfig {
        cache_dir: cache.path().to_path_buf(),
        ..DockerConfig::default()
    };
    let sb = match DockerSandbox::connect(cfg, StageAheadMode::default()).await {
        Ok(sb) => sb,
        Err(e) => return skip(&format!("the Docker engine is not reachable ({e})")),
    };
    if sb.engine().inspect_image(DEFAULT_BASE_IMAGE).await.is_err() {
        return skip(&format!(
            "base image {DEFAULT_BASE_IMAGE} is missing (make it with `reprobench images bootstrap`)"
        ));
    }
    Some((sb, cache))
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .env("GIT_AUTHOR_DATE", "2020-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2020-01-01T00:00:00Z")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A bare mirror of a tiny Python project; returns (mirror, base commit). `nonce` changes the
/// commit (so a test can have an instance image of its own); without it the commit is the same
/// on every run, so the image is reused.
fn make_mirror(root: &Path, nonce: Option<&str>) -> (PathBuf, String) {
    let work = root.join("work");
    std::fs::create_dir_all(work.join("tests")).unwrap();
    std::fs::write(work.join("calc.py"), CALC).unwrap();
    std::fs::write(work.join("tests/__init__.py"), "").unwrap();
    std::fs::write(work.join("tests/test_calc.py"), TEST_CALC).unwrap();
    // Tracked although ignored: the instance must still have it.
    std::fs::write(work.join(".gitignore"), "*.log\n").unwrap();
    std::fs::write(work.join("keep.log"), "tracked\n").unwrap();
    if let Some(n) = nonce {
        std::fs::write(work.join("NONCE"), n).unwrap();
    }
    git(&work, &["init", "-q"]);
    git(&work, &["add", "-A", "-f"]);
    git(&work, &["commit", "-q", "-m", "calc"]);
    let commit = git(&work, &["rev-parse", "HEAD"]);
    let mirror = root.join("o__calc.git");
    let out = Command::new("git")
        .args(["clone", "-q", "--bare"])
        .arg(&work)
        .arg(&mirror)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (mirror, commit)
}

fn recipe(mirror: PathBuf, commit: String, python: String) -> EnvRecipe {
    EnvRecipe {
        repo: "o/calc".into(),
        mirror,
        base_commit: commit,
        python,
        packages: vec![],
        pre_install: vec!["echo pre > PRE_INSTALLED".into()],
        install: String::new(),
        ..Default::default()
    }
}

/// The shared instance (same commit on every run), prepared once per test binary.
/// The mirror (and its commit) of [`shared`]'s environment.
static MIRROR: OnceLock<(PathBuf, String)> = OnceLock::new();

async fn shared(sb: &DockerSandbox) -> Prepared {
    static PREPARED: tokio::sync::OnceCell<Prepared> = tokio::sync::OnceCell::const_new();
    let (mirror, commit) = MIRROR
        .get_or_init(|| {
            // Statics are never dropped: the directory is named after the process, and those
            // of test processes that are gone are removed here.
            const PREFIX: &str = "reprobench-docker-test-";
            let tmp = std::env::temp_dir();
            for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let stale = name
                    .strip_prefix(PREFIX)
                    .is_some_and(|pid| !Path::new("/proc").join(pid).exists());
                if stale {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
            let root = tmp.join(format!("{PREFIX}{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            make_mirror(&root, None)
        })
        .clone();
    let python = sb.base_python().await.unwrap();
    PREPARED
        .get_or_init(|| async {
            sb.prepare(&recipe(mirror, commit, python))
                .await
                .expect("prepare")
        })
        .await
        .clone()
}

fn request(command: &[&str]) -> ExecRequest {
    ExecRequest {
        files: vec![],
        command: command.iter().map(|s| s.to_string()).collect(),
        env: vec![],
        limits: Limits {
            memory_mb: 512,
            pids: 128,
            disk_mb: 64,
            timeout: Duration::from_secs(120),
            ..Limits::default()
        },
        ..ExecRequest::default()
    }
}

fn sh(script: &str) -> ExecRequest {
    request(&["sh", "-c", script])
}

#[track_caller]
fn assert_ran(out: &ExecOutput, code: i64) {
    assert_eq!(out.exit_code, Some(code), "output:\n{}", out.output);
    assert!(!out.timed_out);
}

async fn our_containers(sb: &DockerSandbox, image: &str) -> Vec<String> {
    let filters = HashMap::from([(
        "label".to_string(),
        vec![
            CONTAINER_LABEL.to_string(),
            format!("reprobench.image={image}"),
        ],
    )]);
    let options = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let list = sb.engine().list_containers(Some(options)).await.unwrap();
    list.into_iter().filter_map(|c| c.id).collect()
}

/// A private tag for the shared image, so a test can find exactly its own containers.
async fn alias(sb: &DockerSandbox, prepared: &Prepared, name: &str) -> Prepared {
    let Prepared::Image(image) = prepared else {
        panic!("docker prepares images")
    };
    let tag = format!("{name}-{}", std::process::id());
    let options = TagImageOptionsBuilder::new()
        .repo("reprobench-test/alias")
        .tag(&tag)
        .build();
    sb.engine().tag_image(image, Some(options)).await.unwrap();
    Prepared::Image(format!("reprobench-test/alias:{tag}"))
}

async fn remove_image(sb: &DockerSandbox, image: &str) {
    let options = RemoveImageOptionsBuilder::new().force(true).build();
    if let Err(e) = sb.engine().remove_image(image, Some(options), None).await {
        eprintln!("could not remove {image}: {e}");
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The tags in `repo` of images built for the layer key `key` (tags are `KEY-CONTENTHASH`).
async fn tags_of_key(sb: &DockerSandbox, repo: &str, key: &str) -> Vec<String> {
    let filters = HashMap::from([("reference".to_string(), vec![format!("{repo}:{key}-*")])]);
    let options = bollard::query_parameters::ListImagesOptionsBuilder::new()
        .filters(&filters)
        .build();
    let images = sb.engine().list_images(Some(options)).await.unwrap();
    images.into_iter().flat_map(|i| i.repo_tags).collect()
}

/// How many times the engine tagged `image` between two instants (one per build).
async fn tag_events(sb: &DockerSandbox, image: &str, since: f64, until: f64) -> usize {
    let filters = HashMap::from([
        ("type".to_string(), vec!["image".to_string()]),
        ("event".to_string(), vec!["tag".to_string()]),
    ]);
    let options = EventsOptionsBuilder::new()
        .since(&format!("{since:.3}"))
        .until(&format!("{until:.3}"))
        .filters(&filters)
        .build();
    let events: Vec<_> = sb.engine().events(Some(options)).collect().await;
    events
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| {
            e.actor
                .as_ref()
                .and_then(|a| a.attributes.as_ref())
                .and_then(|a| a.get("name"))
                .map(String::as_str)
                == Some(image)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_builds_each_layer_once_and_exec_runs_the_tests() {
    let Some((sb, _cache)) = sandbox().await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let nonce = format!("{}-{}", std::process::id(), unix_now());
    let (mirror, commit) = make_mirror(root.path(), Some(&nonce));
    let python = sb.base_python().await.unwrap();
    let r = recipe(mirror, commit.clone(), python);

    let since = unix_now() - 1.0;
    let started = Instant::now();
    let (a, b) = tokio::join!(sb.prepare(&r), sb.prepare(&r));
    let first = started.elapsed();
    let (a, b) = (a.expect("prepare"), b.expect("prepare"));
    let Prepared::Image(instance_tag) = a.clone() else {
        panic!("{a:?}")
    };
    assert!(
        instance_tag.starts_with(&format!("reprobench/instance:{}-", r.instance_key())),
        "{instance_tag}"
    );
    assert_eq!(a, b, "concurrent prepares agree");
    let until = unix_now() + 1.0;
    assert_eq!(
        tag_events(&sb, &instance_tag, since, until).await,
        1,
        "the instance layer is built once"
    );

    let since = unix_now() - 1.0;
    let started = Instant::now();
    assert_eq!(sb.prepare(&r).await.unwrap(), a);
    let again = started.elapsed();
    assert_eq!(
        tag_events(&sb, &instance_tag, since, unix_now() + 1.0).await,
        0,
        "a second prepare reuses the image"
    );
    let image = sb.engine().inspect_image(&instance_tag).await.unwrap();
    let labels = image.config.unwrap().labels.unwrap();
    assert_eq!(labels[LAYER_LABEL], "instance");
    eprintln!(
        "first prepare {first:?}, second {again:?}, image {} MB",
        image.size.unwrap_or(0) >> 20
    );

    let out = sb
        .exec(&a, request(&["python3", "-m", "unittest", "-v"]))
        .await
        .unwrap();
    assert_ran(&out, 0);
    assert!(
        out.output.contains("test_add") && out.output.contains("OK"),
        "{}",
        out.output
    );
    assert!(
        out.command_time > Duration::ZERO && out.overhead > Duration::ZERO,
        "{out:?}"
    );
    // The timeline: every phase in the order it ran, the command's the command's time.
    let names: Vec<&str> = out.phases.iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        [
            "create", "attach", "boot", "copy", "input", "files", "stage", "unpack", "go",
            "command", "exit", "output"
        ]
    );
    let command = out.phases.iter().find(|p| p.name == "command").unwrap();
    assert_eq!(command.took, out.command_time);
    let total: Duration = out.phases.iter().map(|p| p.took).sum();
    assert!(
        total <= out.command_time + out.overhead + Duration::from_millis(50),
        "the phases ({total:?}) fit in the execution's wall time: {out:?}"
    );
    eprintln!(
        "unittest: command {:?}, overhead {:?}, phases {:?}",
        out.command_time, out.overhead, out.phases
    );

    // The command's own CPU: a command that spins for half a second of CPU counts at least
    // that (and its child's), one that sleeps for a second next to nothing.
    let spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass";
    let out = sb
        .exec(
            &a,
            sh(&format!("python3 -c '{spin}' && python3 -c '{spin}'")),
        )
        .await
        .unwrap();
    assert_ran(&out, 0);
    let cpu = out.command_cpu.expect("docker tells the command's CPU");
    assert!(
        cpu >= Duration::from_millis(980),
        "two half-second spins: {cpu:?}"
    );
    let out = sb.exec(&a, sh("sleep 1")).await.unwrap();
    assert_ran(&out, 0);
    let cpu = out.command_cpu.expect("docker tells the command's CPU");
    assert!(cpu < Duration::from_millis(300), "a sleep: {cpu:?}");

    // In /work, a git repository whose one commit is the tree (the pre_install's file in it),
    // with the ignored files beside it; run as an unprivileged user.
    let out = sb
        .exec(&a, sh("pwd; git status --porcelain; cat PRE_INSTALLED keep.log; git log --format=%s; which python3; id -u"))
        .await
        .unwrap();
    assert_ran(&out, 0);
    assert_eq!(
        out.output,
        "/work\npre\ntracked\nreprobench: base commit\n/opt/venv/bin/python3\n1000\n"
    );

    // A prediction's patch applies with git, and a failing test gives its exit code.
    let patch = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a + b\n+    return a - b\n";
    let mut req = sh("git apply fix.patch && python3 -m unittest 2>&1");
    req.files.push(InputFile {
        path: "fix.patch".into(),
        contents: patch.into(),
        mode: 0o644,
    });
    let out = sb.exec(&a, req).await.unwrap();
    assert_ran(&out, 1);
    assert!(out.output.contains("FAILED (failures=1)"), "{}", out.output);

    // The container booted ahead for the next execution goes too.
    sb.settle().await;
    remove_image(&sb, &instance_tag).await;
}

/// Polls every 50 ms until `done` holds, failing at a 120 s deadline with `state()` in the message.
async fn poll_until(what: &str, done: impl Fn() -> bool, state: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: {}", state());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls until a container for the next execution is booted ahead, failing at the deadline.
async fn booted_ahead(sb: &DockerSandbox) {
    poll_until(
        "no container was booted ahead",
        || sb.booted_ahead() == (1, 0),
        || format!("{:?}", sb.booted_ahead()),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_booted_ahead_runs_the_next_execution_as_a_fresh_one() {
    let Some((_sb, _cache)) = sandbox().await else {
        return;
    };
    // Booted ahead, not staged: the container's own copy and the execution's input.
    let (sb, _cache) = staging(StageAheadMode::Off).await;
    let shared = shared(&sb).await;
    let prepared = alias(&sb, &shared, "ahead").await;
    let Prepared::Image(image) = &prepared else {
        unreachable!()
    };
    let leave = "echo left > /tmp/left; echo left > /work/left; echo left > calc.py; \
                 setsid sleep 3617 & echo first";
    let mut req = sh(
        "test -e /tmp/left || echo no-tmp; test -e /work/left || echo no-work; cat calc.py new.txt; \
         cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -q 'sleep 361[7]' || echo no-sleep",
    );
    req.files.push(InputFile {
        path: "new.txt".into(),
        contents: b"mine\n".to_vec(),
        mode: 0o644,
    });
    // Not announced: nothing is booted for it.
    let out = sb.exec(&prepared, sh("true")).await.unwrap();
    assert_ran(&out, 0);
    assert_eq!(sb.booted_ahead(), (0, 0));
    sb.exec_ahead(&prepared, &req);
    let out = sb.exec(&prepared, sh(leave)).await.unwrap();
    assert_ran(&out, 0);
    assert_eq!(out.output, "first\n");
    booted_ahead(&sb).await;

    // Taken by the next execution of the image and limits: nothing of the first is there, the
    // patches and files are this one's, and its creation was off this execution's path.
    sb.exec_ahead(&prepared, &sh("echo third"));
    let out = sb.exec(&prepared, req).await.unwrap();
    assert_ran(&out, 0);
    assert_eq!(
        out.output,
        format!("no-tmp\nno-work\n{CALC}mine\nno-sleep\n")
    );
    assert_eq!(
        (took(&out, "create"), took(&out, "attach")),
        (Duration::ZERO, Duration::ZERO),
        "{out:?}"
    );

    // Other limits are another environment: that execution boots its own (and, announcing
    // nothing, has nothing booted after it).
    booted_ahead(&sb).await;
    let mut req = sh("echo other");
    req.limits.memory_mb = 256;
    let out = sb.exec(&prepared, req).await.unwrap();
    assert_ran(&out, 0);
    assert!(took(&out, "create") > Duration::ZERO, "{out:?}");
    assert_eq!(sb.booted_ahead(), (1, 0));

    // Settling removes what was booted ahead, and nothing is left.
    sb.settle().await;
    assert_eq!(sb.booted_ahead(), (0, 0));
    assert_eq!(our_containers(&sb, image).await, Vec::<String>::new());
    remove_image(&sb, image).await;

    // Off, no execution boots another ahead.
    let cache = tempfile::tempdir().unwrap();
    let off = DockerSandbox::connect(
        DockerConfig {
            cache_dir: cache.path().to_path_buf(),
            boot_ahead: false,
            ..DockerConfig::default()
        },
        StageAheadMode::default(),
    )
    .await
    .unwrap();
    off.exec_ahead(&shared, &sh("echo next"));
    let out = off.exec(&shared, sh("true")).await.unwrap();
    assert_ran(&out, 0);
    assert_eq!(off.booted_ahead(), (0, 0));
    off.settle().await;
}

/// Threads that keep every core of the host busy (one more than there are cores) until
/// dropped.
struct BusyCores {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyCores {
    fn start() -> BusyCores {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = (0..=cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        BusyCores { stop, threads }
    }
}

impl Drop for BusyCores {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A sandbox staging ahead `when-idle`, its cache, and an image of its own named `name` (as
/// prepared, and its tag); `None` where the docker tests skip.
async fn when_idle_image(
    name: &str,
) -> Option<(DockerSandbox, tempfile::TempDir, Prepared, String)> {
    sandbox().await?;
    let (sb, cache) = staging(StageAheadMode::WhenIdle).await;
    let shared = shared(&sb).await;
    let prepared = alias(&sb, &shared, name).await;
    let Prepared::Image(image) = &prepared else {
        unreachable!()
    };
    let image = image.clone();
    Some((sb, cache, prepared, image))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_tasks_container_boots_once_a_core_is_idle_unless_always() {
    let Some((sb, _cache, prepared, image)) = when_idle_image("next-task-idle").await else {
        return;
    };
    let image = image.as_str();
    // Every core busy while an execution runs: the next task's container is not booted.
    let busy = BusyCores::start();
    sb.exec_next_task_ahead(&prepared, &sh("echo next"));
    let announced = Instant::now();
    let out = sb.exec(&prepared, sh("sleep 1")).await.unwrap();
    assert_ran(&out, 0);
    assert_eq!(sb.booted_ahead(), (0, 0));
    // Its boot still waits, the announcement standing: the staging that began with the
    // command's start, finding no container, left both alone.
    assert_eq!(sb.waiting_for_idle_core(), 1);
    // A core idle again while it is announced: booted then, and its execution takes it. A
    // boot that stops waiting with nothing booted while its announcement still lives lost the
    // announcement (to the staging begun at the command's start, which may take the key first
    // once a core is idle). On a machine that other work keeps busy longer than an
    // announcement lives, it is announced again (with an execution, whose start is what boots
    // the announced).
    drop(busy);
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut announced_at = announced;
    while sb.booted_ahead() != (1, 0) {
        assert!(
            Instant::now() < deadline,
            "not booted once a core was idle: {:?}",
            sb.booted_ahead()
        );
        if sb.waiting_for_idle_core() == 0 && sb.booted_ahead() == (0, 0) {
            // 30 s is how long an announcement lives; nearer to it the two cannot be told apart.
            assert!(
                announced_at.elapsed() > Duration::from_secs(28),
                "the boot stopped waiting while its announcement stood ({:?} old)",
                announced_at.elapsed()
            );
            sb.exec_next_task_ahead(&prepared, &sh("echo next"));
            announced_at = Instant::now();
            assert_ran(&sb.exec(&prepared, sh("true")).await.unwrap(), 0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = sb.exec(&prepared, sh("echo next")).await.unwrap();
    assert_ran(&out, 0);
    assert_eq!(out.output, "next\n");
    assert_eq!(took(&out, "create"), Duration::ZERO, "{out:?}");
    sb.settle().await;

    // `always`: booted at once, every core busy or not.
    let (always, _always_cache) = staging(StageAheadMode::Always).await;
    let busy = BusyCores::start();
    always.exec_next_task_ahead(&prepared, &sh("echo next"));
    let out = always.exec(&prepared, sh("true")).await.unwrap();
    assert_ran(&out, 0);
    booted_ahead(&always).await;
    drop(busy);
    always.settle().await;
    assert_eq!(our_containers(&sb, image).await, Vec::<String>::new());
    remove_image(&sb, image).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_next_task_came_its_own_next_execution_boots_ahead_on_busy_cores() {
    let Some((sb, _cache, prepared, image)) = when_idle_image("next-task-came").await else {
        return;
    };
    let image = image.as_str();
    let busy = BusyCores::start();
    // The next task's first execution is announced while another runs: its boot waits for an
    // idle core.
    sb.exec_next_task_ahead(&prepared, &sh("echo first"));
    assert_ran(&sb.exec(&prepared, sh("true")).await.unwrap(), 0);
    assert_eq!(sb.waiting_for_idle_core(), 1);
    // That task comes, every core still busy: its second execution is announced (within the
    // task) and its first runs, booting its own container. The second's boot does not wait
    // for an idle core, as no execution within a task does.
    sb.exec_ahead(&prepared, &sh("echo second"));
    let first = sb.exec(&prepared, sh("echo first")).await.unwrap();
    assert_ran(&first, 0);
    booted_ahead(&sb).await;
    assert_eq!(sb.waiting_for_idle_core(), 0);
    let second = sb.exec(&prepared, sh("echo second")).await.unwrap();
    assert_ran(&second, 0);
    assert_eq!(second.output, "second\n");
    assert_eq!(took(&second, "create"), Duration::ZERO, "{second:?}");
    drop(busy);
    sb.settle().await;
    assert_eq!(our_containers(&sb, image).await, Vec::<String>::new());
    remove_image(&sb, image).await;
}

/// A sandbox like [`sandbox`]'s (whose check it follows), staging announced executions ahead
/// as `stage` says.
async fn staging(stage: StageAheadMode) -> (DockerSandbox, tempfile::TempDir) {
    let cache = tempfile::tempdir().unwrap();
    let sb = DockerSandbox::connect(
        DockerConfig {
            cache_dir: cache.path().to_path_buf(),
            ..DockerConfig::default()
        },
        stage,
    )
    .await
    .unwrap();
    (sb, cache)
}

/// Polls until `n` containers booted ahead have staged an announced execution's tree (and
/// nothing is being booted or staged), failing at the deadline.
async fn staged_ahead(sb: &DockerSandbox, n: usize) {
    poll_until(
        &format!("{n} staged ahead expected"),
        || sb.staged_ahead() == n && sb.booted_ahead().1 == 0,
        || {
            format!(
                "{} staged, {:?} booted",
                sb.staged_ahead(),
                sb.booted_ahead()
            )
        },
    )
    .await
}

/// The error an execution of `req` gives on a sandbox that stages nothing ahead.
async fn off_failure(prepared: &Prepared, req: &ExecRequest) -> String {
    let (off, _cache) = staging(StageAheadMode::Off).await;
    let e = off.exec(prepared, req.clone()).await.unwrap_err();
    off.settle().await;
    e.to_string()
}

/// The names of an execution's phases, in order.
fn phase_names(out: &ExecOutput) -> Vec<&'static str> {
    out.phases.iter().map(|p| p.name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_execution_runs_in_the_container_that_staged_its_tree_exactly_as_on_its_path()
{
    let Some((_sb, _cache)) = sandbox().await else {
        return;
    };
    let (sb, _cache) = staging(StageAheadMode::Always).await;
    let shared = shared(&sb).await;
    let prepared = alias(&sb, &shared, "staged").await;
    let Prepared::Image(image) = &prepared else {
        unreachable!()
    };
    // What the command sees of its tree: names, sizes, modes and times, git's view, content.
    let look = "find . -path ./.git -prune -o -printf '%p %s %m %T@ %U\\n' | sort; \
                git status --porcelain; git log --format='%H %at %s'; cat calc.py new.txt; \
                cat \"$REPROBENCH_SUPPORT\"/s.txt; pwd; id -u";
    let mut wanted = sh(look);
    wanted.files.push(InputFile {
        path: "new.txt".into(),
        contents: b"mine\n".to_vec(),
        mode: 0o640,
    });
    wanted.support.push(InputFile {
        path: "s.txt".into(),
        contents: b"support\n".to_vec(),
        mode: 0o644,
    });
    wanted.patches.push(PatchFile {
        label: "code".into(),
        contents: b"--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a + b\n+    return b + a\n".to_vec(),
    });

    // Announced, then staged in the container booted while another execution runs.
    sb.exec_ahead(&prepared, &wanted);
    let out = sb.exec(&prepared, sh("echo before")).await.unwrap();
    assert_ran(&out, 0);
    assert!(phase_names(&out).contains(&"go"), "{out:?}");
    staged_ahead(&sb, 1).await;
    let ahead = sb.exec(&prepared, wanted.clone()).await.unwrap();
    assert_ran(&ahead, 0);
    let names = phase_names(&ahead);
    assert!(
        names.contains(&"ahead") && !names.contains(&"go"),
        "{names:?}"
    );
    for p in [
        "create", "attach", "boot", "copy", "input", "files", "stage", "unpack",
    ] {
        assert_eq!(
            took(&ahead, p),
            Duration::ZERO,
            "{p} was off the path: {ahead:?}"
        );
    }
    assert!(ahead.output.contains("return b + a"), "{}", ahead.output);

    // The same request staged on its path sees the same.
    let (off, _off_cache) = staging(StageAheadMode::Off).await;
    off.exec_ahead(&prepared, &wanted);
    let _ = off.exec(&prepared, sh("true")).await.unwrap();
    booted_ahead(&off).await;
    assert_eq!(off.staged_ahead(), 0, "off stages nothing ahead");
    let on_path = off.exec(&prepared, wanted.clone()).await.unwrap();
    assert_ran(&on_path, 0);
    assert!(phase_names(&on_path).contains(&"go"), "{on_path:?}");
    assert_eq!(ahead.output, on_path.output);
    assert_eq!(ahead.patches, on_path.patches);
    assert_eq!(ahead.prepare_log, on_path.prepare_log);
    off.settle().await;

    // A tree staged for one request goes to no other: that one boots its own container.
    let mut other = wanted.clone();
    other.command = vec!["sh".into(), "-c".into(), "cat calc.py".into()];
    sb.exec_ahead(&prepared, &wanted);
    let _ = sb.exec(&prepared, sh("true")).await.unwrap();
    staged_ahead(&sb, 1).await;
    let out = sb.exec(&prepared, other).await.unwrap();
    assert_ran(&out, 0);
    assert_eq!(out.output, "def add(a, b):\n    return b + a\n");
    assert!(!phase_names(&out).contains(&"ahead"), "{out:?}");
    assert!(took(&out, "create") > Duration::ZERO, "{out:?}");

    // A tree whose staging fails ahead fails its execution as it fails on the path: the file
    // fits the stage's tmpfs (twice disk_mb) once, as input, but not twice.
    let mut full = sh("true");
    full.limits.disk_mb = 1;
    full.files.push(InputFile {
        path: "big.bin".into(),
        contents: vec![7; 1536 << 10],
        mode: 0o644,
    });
    let on_path = off_failure(&prepared, &full).await;
    sb.exec_ahead(&prepared, &full);
    let mut small = sh("true");
    small.limits.disk_mb = 1;
    let _ = sb.exec(&prepared, small).await.unwrap();
    staged_ahead(&sb, 2).await;
    let ahead = sb.exec(&prepared, full).await.unwrap_err();
    assert_eq!(
        ahead.to_string(),
        on_path,
        "staged ahead and on the path fail alike"
    );
    assert!(matches!(ahead, SandboxError::BadInput(_)), "{ahead}");
    assert!(
        on_path.contains("writing the files") && !on_path.contains("REPROBENCH-"),
        "the error names the step, not the script's markers: {on_path}"
    );

    // Settling removes the containers booted ahead, the staged one too, and nothing is left.
    sb.settle().await;
    assert_eq!((sb.booted_ahead(), sb.staged_ahead()), ((0, 0), 0));
    assert_eq!(our_containers(&sb, image).await, Vec::<String>::new());
    remove_image(&sb, image).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_tasks_first_execution_is_staged_while_another_images_execution_runs() {
    let Some((_sb, _cache)) = sandbox().await else {
        return;
    };
    let (sb, _cache) = staging(StageAheadMode::Always).await;
    let shared = shared(&sb).await;
    // A task found ahead of its grant: its environment is there, so the recipe is found, with
    // nothing built; another commit's is not there and is not built.
    let (mirror, commit) = MIRROR.get().expect("`shared` made the mirror").clone();
    let python = sb.base_python().await.unwrap();
    assert_eq!(
        sb.find_prepared(&recipe(mirror.clone(), commit, python.clone()))
            .await,
        Some(shared.clone())
    );
    let other_commit = "0".repeat(40);
    assert_eq!(
        sb.find_prepared(&recipe(mirror, other_commit, python))
            .await,
        None
    );
    // This task's last execution runs on one image; the next task's first, announced, is of
    // another: its container is booted and its tree staged meanwhile.
    let current = alias(&sb, &shared, "current-task").await;
    let next_task = alias(&sb, &shared, "next-task").await;
    let first = sh("echo first of the next task");
    sb.exec_ahead(&next_task, &first);
    let out = sb
        .exec(&current, sh("echo last of this task"))
        .await
        .unwrap();
    assert_ran(&out, 0);
    staged_ahead(&sb, 1).await;
    let out = sb.exec(&next_task, first).await.unwrap();
    assert_ran(&out, 0);
    assert_eq!(out.output, "first of the next task\n");
    assert!(phase_names(&out).contains(&"ahead"), "{out:?}");
    assert_eq!(took(&out, "create"), Duration::ZERO, "{out:?}");
    sb.settle().await;
    for image in [&current, &next_task] {
        let Prepared::Image(image) = image else {
            unreachable!()
        };
        assert_eq!(our_containers(&sb, image).await, Vec::<String>::new());
        remove_image(&sb, image).await;
    }
}

/// How long an execution's phase `name` took.
fn took(out: &ExecOutput, name: &str) -> Duration {
    out.phases
        .iter()
        .find(|p| p.name == name)
        .map_or(Duration::ZERO, |p| p.took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_images_have_own_sizes_parents_and_last_use() {
    let Some((sb, _cache)) = sandbox().await else {
        return;
    };
    let prepared = shared(&sb).await;
    let Prepared::Image(instance) = &prepared else {
        unreachable!()
    };
    let images = sb.cached_images().await.unwrap();
    let inst = images
        .iter()
        .find(|i| &i.tag == instance)
        .expect("the instance is listed");
    assert_eq!(inst.kind, LayerKind::Instance);
    let env_tag = inst.parent.clone().expect("instances name their env");
    let env = images
        .iter()
        .find(|i| i.tag == env_tag)
        .expect("its env is listed");
    assert_eq!(env.kind, LayerKind::Env);
    let full = sb
        .engine()
        .inspect_image(instance)
        .await
        .unwrap()
        .size
        .unwrap() as u64;
    // Own sizes exclude the layers below: the tiny repository adds far less than the image.
    assert!(
        inst.own_bytes < full / 2 && env.own_bytes < full,
        "{inst:?} {env:?} of {full}"
    );
    assert!(inst.last_use > 0 && env.last_use > 0);
    assert!(
        !images.iter().any(|i| i.tag.contains("python-base")),
        "the base image is never listed"
    );
    // Pinned while an exec runs, so even a zero budget keeps it and its env.
    let watch = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let images = sb.cached_images().await.unwrap();
            if images.iter().any(|i| &i.tag == instance && i.in_use) {
                return plan_eviction(&images, 0);
            }
            assert!(
                Instant::now() < deadline,
                "the instance was never seen in use"
            );
        }
    };
    let (planned, out) = tokio::join!(watch, sb.exec(&prepared, request(&["sleep", "5"])));
    assert_ran(&out.unwrap(), 0);
    assert!(
        !planned.contains(instance) && !planned.contains(&env_tag),
        "{planned:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_files_land_in_the_work_dir_and_escapes_are_refused() {
    let Some((sb, _cache)) = sandbox().await else {
        return;
    };
    let prepared = shared(&sb).await;

    let mut req = request(&["./run.sh"]);
    req.files = vec![
        InputFile {
            path: "run.sh".into(),
            contents:
                b"#!/bin/sh\ncat tests/test_new.py; echo \"$GREETING\"; ls -l run.sh | cut -c1-10\n"
                    .to_vec(),
            mode: 0o755,
        },
        InputFile {
            path: "tests/test_new.py".into(),
            contents: b"# new test\n".to_vec(),
            mode: 0o644,
        },
    ];
    req.env = vec![("GREETING".into(), "hello there".into())];
    let out = sb.exec(&prepared, req).await.unwrap();
    assert_ran(&out, 0);
    assert_eq!(out.output, "# new test\nhello there\n-rwxr-xr-x\n");

    for bad in ["../escape.py", "tests/../../escape.py", "/etc/passwd"] {
        let mut req = request(&["true"]);
        req.files.push(InputFile {
            path: bad.into(),
            contents: b"x".to_vec(),
            mode: 0o644,
        });
        let err = sb.exec(&prepared, req).await.unwrap_err();
        assert!(matches!(err, SandboxError::BadInput(_)), "{bad}: {err:?}");
    }

    // Output past the cap keeps its head and its tail, and says what was left out between.
    let mut req = request(&["python3", "-c", "print('x' * 100000); print('the end')"]);
    req.limits.max_output_bytes = 1000;
    let out = sb.exec(&prepared, req).await.unwrap();
    assert_ran(&out, 0);
    assert!(out.output_truncated);
    assert!(out.output.starts_with(&"x".repeat(500)), "{}", out.output);
    assert!(out.output.ends_with("\nthe end\n"), "{}", out.output);
    assert!(
        out.output.contains(" bytes of output left out here") && out.output.len() < 1200,
        "{} bytes: {}",
        out.output.len(),
        out.output
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_is_off() {
    let Some((sb, _cache)) = sandbox().await else {
        return;
    };
    let prepared = shared(&sb).await;
    let script = "
import socket
blocked = 0
for addr in [('1.1.1.1', 80), ('151.101.0.223', 443), ('127.0.0.1', 9)]:
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(addr)
        print('connected', addr)
    except OSError as e:
        blocked += 1
        print('blocked', addr, e)
print(sorted(n for _, n in socket.if_nameindex()))
raise SystemExit(0 if blocked == 3 else 1)
";
    let started = Instant::now();
    let out = sb
        .exec(&prepared, request(&["python3", "-c", script]))
        .await
        .unwrap();
    assert_ran(&out, 0);
    assert!(
        out.output.contains("['lo']"),
        "only loopback: {}",
        out.output
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "connects fail fast: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_everything_and_the_container_is_removed() {
    let Some((sb, _cache)) = sandbox().await else {
        return;
    };
    let shared = shared(&sb).await;
    let prepared = alias(&sb, &shared, "timeout").await;
    let Prepared::Image(image) = &prepared else {
        unreachable!()
    };

    let mut req = sh("echo started; sleep 1000 & sleep 1000");
    req.limits.timeout = Duration::from_secs(2);
    let started = Instant::now();
    let out = sb.exec(&prepared, req).await.unwrap();
    let took = started.elapsed();
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.exit_code, None);
    assert_eq!(out.output, "started\n");
    assert!(out.command_time >= Duration::from_millis(1500), "{out:?}");
    assert!(
        took < Duration::from_secs(30),
        "the exec returns soon after the timeout: {took:?}"
    );
    // Removal goes on in the background once the container has stopped.
    sb.settle().await;
    assert_eq!(
        our_containers(&sb, image).await,
        Vec::<String>::new(),
        "the container is gone"
    );

    // A finished exec leaves nothing either, once its removal in the background is done.
    let out = sb.exec(&prepared, request(&["true"])).await.unwrap();
    assert_ran(&out, 0);
    sb.settle().await;
    assert_eq!(our_containers(&sb, image).await, Vec::<String>::new());
    remove_image(&sb, image).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_memory_and_processes_are_limited() {
    let Some((sb, _cache)) = sandbox().await else {
        return;
    };
    let prepared = shared(&sb).await;

    // Writes beyond the tmpfs size fail inside; the root filesystem is read-only, and the
    // image's repository and its archive (the tree before the patches) are closed.
    let mut req = sh(
        "dd if=/dev/zero of=/work/big bs=1M count=100 2>&1 | grep -o 'No space left on device'; \
         dd if=/dev/zero of=/tmp/big bs=1M count=100 2>&1 | grep -o 'No space left on device'; \
         touch /usr/x 2>&1 | grep -c 'Read-only file system'; \
         ls /testbed /var/lib/reprobench/repo.tar 2>&1 | grep -c 'Permission denied'; \
         df -m /work | tail -1 | tr -s ' ' | cut -d' ' -f2",
    );
    req.limits.disk_mb = 32;
    let out = sb.exec(&prepared, req).await.unwrap();
    assert_ran(&out, 0);
    assert_eq!(
        out.output,
        "No space left on device\nNo space left on device\n1\n2\n32\n"
    );

    // Input files that do not fit: the command never runs, and the error says what to raise.
    let mut req = request(&["true"]);
    req.files.push(InputFile {
        path: "big.bin".into(),
        contents: vec![7; 3 << 20],
        mode: 0o644,
    });
    req.limits.disk_mb = 2;
    let err = sb.exec(&prepared, req).await.unwrap_err();
    assert!(
        matches!(&err, SandboxError::BadInput(m) if m.contains("disk_mb")),
        "{err:?}"
    );

    // Memory beyond the limit kills the command (the kernel's OOM killer: SIGKILL, 137).
    let mut req = request(&[
        "python3",
        "-c",
        "x = bytearray(1 << 30); print('allocated')",
    ]);
    req.limits.memory_mb = 128;
    let out = sb.exec(&prepared, req).await.unwrap();
    assert_ran(&out, 137);

    // A fork loop stops at the pids limit.
    let script = "
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as e:
    print('fork failed after', n, e.strerror)
";
    let mut req = request(&["python3", "-c", script]);
    req.limits.pids = 32;
    let out = sb.exec(&prepared, req).await.unwrap();
    assert_ran(&out, 0);
    let n: usize = out
        .output
        .split_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        out.output.starts_with("fork failed after") && n < 32,
        "{}",
        out.output
    );

    // A shell fork bomb: contained, and the exec returns at the timeout.
    let mut req = request(&["bash", "-c", ":(){ :|:& };:; wait"]);
    req.limits.pids = 64;
    req.limits.timeout = Duration::from_secs(5);
    let started = Instant::now();
    let out = sb.exec(&prepared, req).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    assert!(out.timed_out || out.exit_code.is_some(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_recipes_are_bad_input() {
    let Some((sb, _cache)) = sandbox().await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let (mirror, commit) = make_mirror(root.path(), None);
    let python = sb.base_python().await.unwrap();

    let missing = "0123456789abcdef0123456789abcdef01234567";
    let r = recipe(mirror.clone(), missing.into(), python.clone());
    let err = sb.prepare(&r).await.unwrap_err();
    let SandboxError::BadInput(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(
        msg.contains(missing)
            && msg.contains("o/calc")
            && msg.contains(&mirror.display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("reprobench datasets prepare"), "{msg}");

    // (Another install command, so no existing instance image makes the mirror unnecessary.)
    let mut r = recipe(
        root.path().join("nowhere.git"),
        commit.clone(),
        python.clone(),
    );
    r.install = "true".into();
    assert!(matches!(
        sb.prepare(&r).await,
        Err(SandboxError::BadInput(_))
    ));

    let r = recipe(mirror.clone(), commit.clone(), "2.7".into());
    let err = sb.prepare(&r).await.unwrap_err();
    let SandboxError::BadInput(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("2.7") && msg.contains(&python), "{msg}");

    let mut r = recipe(mirror, commit, python);
    r.install = "echo installing; echo 'boom: setup.py is broken' >&2; exit 3".into();
    let err = sb.prepare(&r).await.unwrap_err();
    let SandboxError::BadInput(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(
        msg.contains("install") && msg.contains("boom: setup.py is broken"),
        "{msg}"
    );
    assert_eq!(
        tags_of_key(&sb, "reprobench/instance", &r.instance_key()).await,
        Vec::<String>::new(),
        "a failed install leaves no image"
    );
}

/// Installs a real package from PyPI into an env layer (needs the network): run with
/// `-- --ignored pypi`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "downloads from PyPI"]
async fn packages_install_from_pypi() {
    let Some((sb, _cache)) = sandbox().await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let (mirror, commit) = make_mirror(root.path(), None);
    let python = sb.base_python().await.unwrap();
    let mut r = recipe(mirror, commit, python);
    r.packages = vec!["six==1.16.0".into()];
    let started = Instant::now();
    let prepared = sb.prepare(&r).await.expect("prepare with a package");
    eprintln!("prepare with six: {:?}", started.elapsed());
    let out = sb
        .exec(
            &prepared,
            request(&["python3", "-c", "import six; print(six.__version__)"]),
        )
        .await
        .unwrap();
    assert_ran(&out, 0);
    assert_eq!(out.output, "1.16.0\n");
    let Prepared::Image(instance) = &prepared else {
        unreachable!()
    };
    remove_image(&sb, instance).await;
    for tag in tags_of_key(&sb, "reprobench/env", &r.env_key()).await {
        remove_image(&sb, &tag).await;
    }

    // A version that does not exist is the recipe's fault.
    r.packages = vec!["six==0.0.0.1".into()];
    let err = sb.prepare(&r).await.unwrap_err();
    let SandboxError::BadInput(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(
        msg.contains("pip install of the recipe's packages") && msg.contains("six==0.0.0.1"),
        "{msg}"
    );
}

/// Makes the base image (root, debootstrap, about a minute): run with `-- --ignored bootstrap`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "makes the base image: needs root and debootstrap, takes about a minute"]
async fn bootstrap() {
    let tag = bootstrap_base_image(&BootstrapOptions::default())
        .await
        .expect("bootstrap");
    assert_eq!(tag, DEFAULT_BASE_IMAGE);
    let (sb, _cache) = sandbox().await.expect("the base image exists now");
    let python = sb.base_python().await.unwrap();
    eprintln!("{tag}: Python {python}");
}
