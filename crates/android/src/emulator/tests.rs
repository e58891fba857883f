//! The emulator executor against a fake adb: recorded outputs, no emulator.

use super::*;
use crate::adb::adb::Output;
use crate::adb::fixture;
use reprobench_domain::outcome::AttemptRef;
use tokio_util::sync::CancellationToken;

/// A fake adb that answers by command (answers repeat) and remembers the install.
#[derive(Default)]
struct FakeAdb {
    installed: Mutex<bool>,
    calls: Mutex<Vec<String>>,
    /// Output of the boot probe.
    boot: String,
    /// Whether the app crashes (the crash buffer holds a FATAL EXCEPTION of it).
    crashes: bool,
}

impl FakeAdb {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn answer(&self, line: &str) -> Output {
        let ok = |s: &str| Output {
            code: 0,
            stdout: s.as_bytes().to_vec(),
            stderr: vec![],
        };
        if line.ends_with("shell pm list packages -3") {
            let mut s = "package:org.other.app\n".to_string();
            if *self.installed.lock().unwrap() {
                s.push_str("package:com.example.notes\n");
            }
            return ok(&s);
        }
        if line.contains(" install -r ") {
            *self.installed.lock().unwrap() = true;
            return ok("Performing Streamed Install\nSuccess\n");
        }
        if line.ends_with("shell pm clear com.example.notes") {
            return ok("Success\n");
        }
        if line.ends_with("logcat -b all -c") || line.contains(" shell input ") {
            return ok("");
        }
        if line.ends_with("shell monkey -p com.example.notes -c android.intent.category.LAUNCHER 1")
        {
            return ok("Events injected: 1\n");
        }
        if line.ends_with("exec-out uiautomator dump /dev/tty") {
            return ok(&fixture("uiautomator_notes.xml"));
        }
        if line.ends_with("logcat -d -v threadtime -b crash") {
            return ok(&if self.crashes {
                fixture("logcat_crash_threadtime.txt")
            } else {
                String::new()
            });
        }
        if line.contains("getprop sys.boot_completed") {
            return ok(&self.boot);
        }
        Output {
            code: 1,
            stdout: vec![],
            stderr: format!("no recording for `{line}`").into_bytes(),
        }
    }
}

impl Runner for FakeAdb {
    fn run<'a>(&'a self, program: &'a Path, args: &'a [String], _: Duration) -> RunFuture<'a> {
        let line = format!("{} {}", program.display(), args.join(" "));
        self.calls.lock().unwrap().push(line.clone());
        let out = self.answer(&line);
        Box::pin(async move { Ok(out) })
    }
}

/// A dataset directory with one crash and one non-crash row, and an APK directory.
fn dataset(root: &Path, with_apk: bool) -> EmulatorSettings {
    let ds = root.join("datasets/real");
    std::fs::create_dir_all(&ds).unwrap();
    std::fs::write(
        ds.join("manifest.json"),
        r#"{"name": "real", "track": "android", "instances": "instances.jsonl", "reports": "reports"}"#,
    )
    .unwrap();
    std::fs::write(
        ds.join("instances.jsonl"),
        concat!(
            r#"{"instance_id": "Notes-1", "report_id": "Notes#1", "app": "Notes", "bug_type": "crash", "ground_truth_actions": 2, "apk": "notes.apk"}"#,
            "\n",
            r#"{"instance_id": "Notes-2", "report_id": "Notes#2", "app": "Notes", "bug_type": "non-crash", "apk": "notes.apk"}"#,
            "\n"
        ),
    )
    .unwrap();
    let apks = root.join("apks");
    std::fs::create_dir_all(&apks).unwrap();
    if with_apk {
        std::fs::write(apks.join("notes.apk"), b"PK").unwrap();
    }
    let mut s = EmulatorSettings::new(
        "pixel_34",
        apks,
        root.join("datasets"),
        root.join("artifacts"),
    );
    s.emulator = "sh".into();
    s
}

fn spec(instance: &str, agent: &str) -> AttemptSpec {
    let payload = AndroidPayload {
        dataset: "real".into(),
        instance_id: instance.into(),
        agent: agent.into(),
        variant: "default".into(),
        seed: 7,
        max_actions: 5,
        max_minutes: 1.0,
        backbone: None,
        budget: None,
    };
    AttemptSpec {
        attempt: AttemptRef {
            task_id: 3,
            epoch: 1,
        },
        run_id: "run1".into(),
        agent: agent.into(),
        variant: "default".into(),
        instance_id: instance.into(),
        affinity_key: "Notes".into(),
        payload_json: serde_json::to_string(&payload).unwrap(),
        attempt_number: 1,
    }
}

async fn run(exec: &EmulatorExecutor, spec: AttemptSpec) -> Outcome {
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let ctx = AttemptContext {
        cancel: CancellationToken::new(),
        progress: tx,
    };
    match exec.run(spec, ctx).await {
        AttemptEnd::Finished(o) => o,
        AttemptEnd::Cancelled => panic!("cancelled"),
    }
}

fn executor(settings: EmulatorSettings, adb: Arc<FakeAdb>) -> EmulatorExecutor {
    EmulatorExecutor::with_runner(settings, adb).unwrap()
}

#[test]
fn package_diff() {
    let before = "package:org.other.app\npackage:com.a\n";
    assert_eq!(
        installed_package(
            before,
            "package:com.a\r\npackage:org.other.app\npackage:com.new\n"
        )
        .unwrap(),
        Some("com.new".into())
    );
    assert_eq!(installed_package(before, before).unwrap(), None);
    assert!(
        installed_package("", "package:x\npackage:y\n")
            .unwrap_err()
            .to_string()
            .contains("x, y")
    );
    assert_eq!(
        parse_packages("WARNING: linker\npackage:a\n\npackage: \n").len(),
        1
    );
}

#[test]
fn grading_rules() {
    let none = BTreeSet::new();
    let crash = |exception: &str, message: &str| Crash {
        process: "org.example".into(),
        exception: exception.into(),
        message: message.into(),
        frames: vec![],
    };
    let npe = crash("java.lang.NullPointerException", "boom");
    assert_eq!(
        grade(BugType::Crash, Some(&npe), &none, Claim::NotAsked),
        (true, "reproduced")
    );
    assert_eq!(
        grade(BugType::Crash, Some(&npe), &none, Claim::Made),
        (true, "reproduced")
    );
    // No claim, or a claim past the budget: a failure even when the replay crashes.
    assert_eq!(
        grade(BugType::Crash, Some(&npe), &none, Claim::NotMade),
        (false, "not_reproduced")
    );
    assert_eq!(
        grade(BugType::Crash, None, &none, Claim::Made),
        (false, "not_reproduced")
    );
    // The report names its exception: another crash is not the reported one.
    let named = crate::device::named_exceptions(
        "App crashes with java.lang.IllegalStateException when rotating",
    );
    assert_eq!(
        grade(BugType::Crash, Some(&npe), &named, Claim::Made),
        (false, "not_reproduced")
    );
    let wrapped = crash(
        "java.lang.RuntimeException",
        "Unable to start activity: java.lang.IllegalStateException: no view",
    );
    assert_eq!(
        grade(BugType::Crash, Some(&wrapped), &named, Claim::Made),
        (true, "reproduced")
    );
    assert_eq!(
        grade(BugType::NonCrash, None, &none, Claim::Made),
        (true, "needs_review")
    );
    assert_eq!(
        grade(BugType::NonCrash, None, &none, Claim::NotMade),
        (false, "not_reproduced")
    );
}

#[test]
fn named_exceptions_are_the_simple_names_a_report_gives() {
    let named = crate::device::named_exceptions(
        "Crash: java.lang.NullPointerException at Foo; also an OutOfMemoryError, an Error and an Exception",
    );
    assert_eq!(
        named.into_iter().collect::<Vec<_>>(),
        ["NullPointerException", "OutOfMemoryError"]
    );
}

#[tokio::test]
async fn monkey_on_a_crash_report_installs_runs_and_replays() {
    let root = tempfile::tempdir().unwrap();
    let settings = dataset(root.path(), true);
    let adb = Arc::new(FakeAdb {
        crashes: true,
        ..Default::default()
    });
    let exec = executor(settings, adb.clone());
    assert_eq!(exec.kind(), ExecutorKind::Emulator);
    // An emulator already booted in slot 0: no launch, no boot poll.
    assert_eq!(exec.record(0, HealthEvent::Booted), Decision::Keep);
    let o = run(&exec, spec("Notes-1", "monkey")).await;
    assert_eq!(o.verdict, "reproduced", "{o:?}");
    assert!(o.success);
    assert_eq!(exec.busy(), 0, "the slot is released");
    let calls = adb.calls();
    let pos = |needle: &str| {
        calls
            .iter()
            .position(|c| c.ends_with(needle))
            .unwrap_or_else(|| panic!("no `{needle}` in {calls:#?}"))
    };
    assert!(calls.iter().all(|c| c.starts_with("adb -s emulator-5554 ")));
    assert!(!calls.iter().any(|c| c.contains("getprop")), "no boot poll");
    assert!(pos("shell pm list packages -3") < pos("notes.apk"));
    assert!(pos("notes.apk") < pos("shell pm clear com.example.notes"));
    // The replay: clear and launch again after the agent's run, then the crash oracle.
    let clears: Vec<usize> = (0..calls.len())
        .filter(|&i| calls[i].ends_with("pm clear com.example.notes"))
        .collect();
    assert_eq!(clears.len(), 2, "{calls:#?}");
    assert!(calls[clears[1]..].iter().any(|c| c.ends_with("LAUNCHER 1")));
    assert!(calls.last().unwrap().ends_with("-b crash"));
    let trace: serde_json::Value = serde_json::from_slice(
        &std::fs::read(Path::new(&o.artifact_path).join("trace.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(trace["device"], "emulator");
    assert_eq!(trace["simulator"], false);
    assert_eq!(trace["package"], "com.example.notes");
    assert_eq!(
        trace["crash"]["exception"],
        "java.lang.NullPointerException"
    );
    assert_eq!(o.trace_len, Some(1));

    // A second attempt reinstalls (nothing new is listed) and knows the package from the first.
    let o = run(&exec, spec("Notes-1", "monkey")).await;
    assert_eq!(o.verdict, "reproduced", "{o:?}");
    assert_eq!(exec.busy(), 0);
}

#[tokio::test]
async fn non_crash_reports_wait_for_review() {
    let root = tempfile::tempdir().unwrap();
    let adb = Arc::new(FakeAdb::default());
    let exec = executor(dataset(root.path(), true), adb.clone());
    exec.record(0, HealthEvent::Booted);
    // monkey claims nothing, so a non-crash report is not reproduced (and not replayed).
    let o = run(&exec, spec("Notes-2", "monkey")).await;
    assert_eq!((o.success, o.verdict.as_str()), (false, "not_reproduced"));
    assert_eq!(exec.busy(), 0);
}

#[tokio::test]
async fn missing_apk_and_gold_trace_are_bad_input() {
    let root = tempfile::tempdir().unwrap();
    let adb = Arc::new(FakeAdb::default());
    let exec = executor(dataset(root.path(), false), adb.clone());
    exec.record(0, HealthEvent::Booted);
    let o = run(&exec, spec("Notes-1", "monkey")).await;
    assert_eq!(o.failure_class, FailureClass::BadInput);
    assert!(
        o.error_message.contains("notes.apk") && o.error_message.contains("--apks"),
        "{}",
        o.error_message
    );
    assert_eq!(exec.busy(), 0, "the slot is free");
    let o = run(&exec, spec("Notes-1", "gold-trace")).await;
    assert_eq!(o.failure_class, FailureClass::BadInput);
    let o = run(&exec, spec("Nope-9", "monkey")).await;
    assert_eq!(o.error_class, "bad_input:instance");
    assert!(adb.calls().is_empty(), "no device was touched");
}

#[tokio::test]
async fn no_free_emulator_is_an_infra_error() {
    let root = tempfile::tempdir().unwrap();
    let adb = Arc::new(FakeAdb::default());
    let mut settings = dataset(root.path(), true);
    settings.emulators = 1;
    let exec = executor(settings, adb);
    // The one slot fails until it is retired (2 restarts).
    for _ in 0..3 {
        exec.record(0, HealthEvent::Exited);
    }
    let o = run(&exec, spec("Notes-1", "monkey")).await;
    assert_eq!(o.failure_class, FailureClass::Infra);
    assert!(o.error_message.contains("no emulator free"), "{o:?}");
}

#[tokio::test]
async fn boots_the_emulator_or_reports_the_timeout() {
    // `sh` stands in for the emulator binary; the fake adb answers the boot probe.
    let root = tempfile::tempdir().unwrap();
    let adb = Arc::new(FakeAdb {
        boot: "1\nstopped\n".into(),
        crashes: true,
        ..Default::default()
    });
    let exec = executor(dataset(root.path(), true), adb.clone());
    let o = run(&exec, spec("Notes-1", "monkey")).await;
    assert_eq!(o.verdict, "reproduced", "{o:?}");
    assert!(adb.calls()[0].contains("getprop sys.boot_completed"));
    assert_eq!(exec.busy(), 0);

    let root = tempfile::tempdir().unwrap();
    let adb = Arc::new(FakeAdb {
        boot: "0\n\n".into(),
        ..Default::default()
    });
    let mut settings = dataset(root.path(), true);
    settings.boot_timeout = Duration::ZERO;
    let exec = executor(settings, adb.clone());
    let o = run(&exec, spec("Notes-1", "monkey")).await;
    assert_eq!(o.failure_class, FailureClass::Infra);
    assert_eq!(o.error_class, "emulator_boot");
    assert!(
        o.error_message.contains("restart it"),
        "{}",
        o.error_message
    );
    assert_eq!(exec.busy(), 0, "the slot is released");
    assert_eq!(adb.calls().len(), 1);
}

#[test]
fn without_an_avd_the_executor_refuses() {
    let s = EmulatorSettings::new("", "a".into(), "d".into(), "x".into());
    let e = EmulatorExecutor::new(s).err().unwrap();
    assert!(e.to_string().contains("--avd"));
}
