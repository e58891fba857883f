//! [`AdbDevice`]: a [`Device`] driven through the `adb` command line and the emulator console.
//!
//! Every adb call goes through a [`Runner`], so tests substitute recorded outputs and check
//! the argv. Crash detection reads the `crash` log buffer, which is cleared on launch, clear
//! and snapshot load so that [`Device::crash`] reports only crashes since then.

use super::commands::{self, Screen};
use super::console::{Console, ConsoleAddress};
use super::{logcat, uiautomator};
use crate::device::{Action, Crash, Device, DeviceError, DeviceFuture, Hierarchy};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::time::Duration;

/// What a finished command printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
}

impl Output {
    /// Standard output as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// A command in flight.
pub type RunFuture<'a> = Pin<Box<dyn Future<Output = Result<Output, DeviceError>> + Send + 'a>>;

/// Runs a program with arguments (the real one spawns processes; tests replay recordings).
pub trait Runner: Send + Sync {
    /// Runs `program args...` to completion within `timeout`.
    fn run<'a>(&'a self, program: &'a Path, args: &'a [String], timeout: Duration)
    -> RunFuture<'a>;
}

/// Spawns real processes with tokio.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessRunner;

impl Runner for ProcessRunner {
    fn run<'a>(
        &'a self,
        program: &'a Path,
        args: &'a [String],
        timeout: Duration,
    ) -> RunFuture<'a> {
        Box::pin(async move {
            let child = tokio::process::Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| {
                    DeviceError::Unavailable(format!(
                        "cannot run {}: {e} (install Android platform-tools or set the adb path)",
                        program.display()
                    ))
                })?;
            let out = tokio::time::timeout(timeout, child.wait_with_output())
                .await
                .map_err(|_| {
                    DeviceError::Unavailable(format!(
                        "{} {} did not finish within {timeout:?}",
                        program.display(),
                        args.join(" ")
                    ))
                })?
                .map_err(|e| DeviceError::Unavailable(format!("{}: {e}", program.display())))?;
            Ok(Output {
                code: out.status.code().unwrap_or(-1),
                stdout: out.stdout,
                stderr: out.stderr,
            })
        })
    }
}

/// Per-call time limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Ordinary shell calls.
    pub shell: Duration,
    /// `adb install`.
    pub install: Duration,
    /// The emulator console.
    pub console: Duration,
    /// Pause between uiautomator retries when the screen is not idle.
    pub dump_retry: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            shell: Duration::from_secs(30),
            install: Duration::from_secs(300),
            console: Duration::from_secs(60),
            dump_retry: Duration::from_millis(500),
        }
    }
}

/// How many times a hierarchy dump is tried before giving up.
pub const DUMP_ATTEMPTS: usize = 3;

/// An emulator or phone reached with `adb -s SERIAL`.
pub struct AdbDevice {
    /// adb serial, e.g. `emulator-5554`.
    pub serial: String,
    /// The `adb` binary.
    pub adb_path: PathBuf,
    /// The emulator console (snapshots).
    pub console: ConsoleAddress,
    /// The app under test (its crashes are reported).
    pub package: String,
    /// Time limits.
    pub timeouts: Timeouts,
    runner: Box<dyn Runner>,
}

impl std::fmt::Debug for AdbDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdbDevice")
            .field("serial", &self.serial)
            .field("adb_path", &self.adb_path)
            .field("console", &self.console)
            .field("package", &self.package)
            .finish()
    }
}

impl AdbDevice {
    /// A device running real `adb` processes.
    pub fn new(serial: &str, adb_path: &Path, console: ConsoleAddress, package: &str) -> AdbDevice {
        AdbDevice::with_runner(serial, adb_path, console, package, Box::new(ProcessRunner))
    }

    /// A device whose commands go through `runner`.
    pub fn with_runner(
        serial: &str,
        adb_path: &Path,
        console: ConsoleAddress,
        package: &str,
        runner: Box<dyn Runner>,
    ) -> AdbDevice {
        AdbDevice {
            serial: serial.to_string(),
            adb_path: adb_path.to_path_buf(),
            console,
            package: package.to_string(),
            timeouts: Timeouts::default(),
            runner,
        }
    }

    /// Runs `adb -s SERIAL args...`; a non-zero exit becomes an error carrying stderr.
    pub async fn adb(&self, args: &[&str], timeout: Duration) -> Result<Output, DeviceError> {
        let mut argv = vec!["-s".to_string(), self.serial.clone()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let out = self.runner.run(&self.adb_path, &argv, timeout).await?;
        if out.code != 0 {
            let mut err = String::from_utf8_lossy(&out.stderr).trim().to_string();
            if err.is_empty() {
                // Some tools (monkey, pm) explain failures on stdout only.
                err = out.text().trim().to_string();
            }
            let msg = format!("adb {} failed ({}): {err}", args.join(" "), out.code);
            return Err(classify(&err, msg));
        }
        Ok(out)
    }

    /// Runs one device-shell command line.
    pub async fn shell(&self, line: &str) -> Result<String, DeviceError> {
        Ok(self
            .adb(&["shell", line], self.timeouts.shell)
            .await?
            .text())
    }

    /// The raw uiautomator dump, retried while the screen is not idle.
    async fn dump(&self) -> Result<(Hierarchy, u8), DeviceError> {
        let mut last = None;
        for attempt in 0..DUMP_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(self.timeouts.dump_retry).await;
            }
            let out = self
                .adb(
                    &["exec-out", "uiautomator", "dump", "/dev/tty"],
                    self.timeouts.shell,
                )
                .await?
                .text();
            match uiautomator::parse_dump(&out) {
                Ok(h) => return Ok((h, uiautomator::parse_rotation(&out).unwrap_or(0))),
                Err(e @ uiautomator::DumpError::NotXml(_)) => last = Some(e),
                Err(e) => return Err(DeviceError::Unavailable(e.to_string())),
            }
        }
        Err(DeviceError::Unavailable(
            last.map(|e| e.to_string()).unwrap_or_default(),
        ))
    }

    async fn clear_log(&self) -> Result<(), DeviceError> {
        self.adb(&["logcat", "-b", "all", "-c"], self.timeouts.shell)
            .await
            .map(drop)
    }

    async fn console(&self) -> Result<Console, DeviceError> {
        Console::connect(&self.console, self.timeouts.console)
            .await
            .map_err(|e| DeviceError::Unavailable(e.to_string()))
    }
}

/// Transport failures (retry elsewhere) versus refusals.
fn classify(stderr: &str, msg: String) -> DeviceError {
    const TRANSPORT: [&str; 5] = [
        "not found",
        "offline",
        "unauthorized",
        "no devices",
        "cannot connect",
    ];
    if TRANSPORT.iter().any(|t| stderr.contains(t)) {
        DeviceError::Unavailable(msg)
    } else {
        DeviceError::Rejected(msg)
    }
}

/// `adb install` / `pm clear` say `Success` or `Failure [REASON]` on stdout.
fn expect_success(what: &str, out: &str) -> Result<(), DeviceError> {
    if out.lines().any(|l| l.trim() == "Success") {
        Ok(())
    } else {
        Err(DeviceError::Rejected(format!(
            "{what} failed: {}",
            out.trim()
        )))
    }
}

impl Device for AdbDevice {
    fn backend(&self) -> &'static str {
        "adb"
    }

    fn hierarchy(&self) -> DeviceFuture<'_, Hierarchy> {
        Box::pin(async move { Ok(self.dump().await?.0) })
    }

    fn screenshot(&self) -> DeviceFuture<'_, Vec<u8>> {
        Box::pin(async move {
            let out = self
                .adb(&["exec-out", "screencap", "-p"], self.timeouts.shell)
                .await?;
            if !out.stdout.starts_with(b"\x89PNG\r\n\x1a\n") {
                return Err(DeviceError::Unavailable(format!(
                    "screencap returned no PNG ({} bytes): {}",
                    out.stdout.len(),
                    String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(80)])
                )));
            }
            Ok(out.stdout)
        })
    }

    fn act<'a>(&'a self, action: &'a Action) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            let (h, rotation) = match action {
                Action::Press { .. } => (Hierarchy::default(), 0),
                _ => self.dump().await?,
            };
            let cmds = commands::action_commands(
                action,
                &Screen {
                    hierarchy: &h,
                    rotation,
                },
            )?;
            for c in cmds {
                self.shell(&c).await?;
            }
            Ok(())
        })
    }

    fn current_activity(&self) -> DeviceFuture<'_, String> {
        Box::pin(async move {
            let out = self.shell("dumpsys activity activities").await?;
            commands::parse_resumed_activity(&out).ok_or_else(|| {
                DeviceError::Rejected(
                    "no resumed activity in `dumpsys activity activities` (screen off, locked, or between activities; retry)".into(),
                )
            })
        })
    }

    fn crash(&self) -> DeviceFuture<'_, Option<Crash>> {
        Box::pin(async move {
            let out = self
                .adb(
                    &["logcat", "-d", "-v", "threadtime", "-b", "crash"],
                    self.timeouts.shell,
                )
                .await?;
            Ok(logcat::find_crash(&out.text(), &self.package))
        })
    }

    fn save_snapshot<'a>(&'a self, name: &'a str) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            self.console()
                .await?
                .snapshot_save(name)
                .await
                .map_err(|e| DeviceError::Rejected(e.to_string()))
        })
    }

    fn load_snapshot<'a>(&'a self, name: &'a str) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            self.console()
                .await?
                .snapshot_load(name)
                .await
                .map_err(|e| DeviceError::Rejected(e.to_string()))?;
            // A snapshot load resets adbd; wait until the transport is back.
            self.adb(&["wait-for-device"], self.timeouts.console)
                .await?;
            self.clear_log().await
        })
    }

    fn install<'a>(&'a self, apk: &'a Path) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            let path = apk.to_string_lossy();
            let out = self
                .adb(&["install", "-r", &path], self.timeouts.install)
                .await?;
            expect_success(&format!("installing {path}"), &out.text())
        })
    }

    fn launch<'a>(&'a self, package: &'a str) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            self.clear_log().await?;
            let line = format!(
                "monkey -p {} -c android.intent.category.LAUNCHER 1",
                commands::shell_quote(package)
            );
            let out = self.shell(&line).await?;
            if out.contains("Events injected: 1") {
                Ok(())
            } else {
                Err(DeviceError::Rejected(format!(
                    "cannot launch {package}: {} (is it installed and has a launcher activity?)",
                    out.trim()
                )))
            }
        })
    }

    fn clear<'a>(&'a self, package: &'a str) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            let out = self
                .shell(&format!("pm clear {}", commands::shell_quote(package)))
                .await?;
            expect_success(&format!("clearing {package}"), &out)?;
            self.clear_log().await
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::adb::fixture;
    use crate::device::{Key, WidgetRef};
    use std::sync::{Arc, Mutex};

    /// Replays outputs keyed by the argv after `-s SERIAL`, and records every argv.
    #[derive(Clone, Default)]
    pub(crate) struct Replay {
        pub(crate) outputs: Arc<Mutex<Vec<(String, Output)>>>,
        pub(crate) calls: Arc<Mutex<Vec<String>>>,
    }

    impl Replay {
        pub(crate) fn on(&self, argv: &str, stdout: &str) -> &Self {
            self.on_output(
                argv,
                Output {
                    code: 0,
                    stdout: stdout.as_bytes().to_vec(),
                    stderr: vec![],
                },
            )
        }
        pub(crate) fn on_output(&self, argv: &str, out: Output) -> &Self {
            self.outputs.lock().unwrap().push((argv.to_string(), out));
            self
        }
        pub(crate) fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Runner for Replay {
        fn run<'a>(&'a self, program: &'a Path, args: &'a [String], _: Duration) -> RunFuture<'a> {
            let line = format!("{} {}", program.display(), args.join(" "));
            self.calls.lock().unwrap().push(line.clone());
            let mut outs = self.outputs.lock().unwrap();
            // First matching recording wins and is consumed (so sequences replay in order).
            let found = outs
                .iter()
                .position(|(k, _)| line.ends_with(k.as_str()))
                .map(|i| outs.remove(i).1);
            Box::pin(async move {
                found.ok_or_else(|| DeviceError::Unavailable(format!("no recording for `{line}`")))
            })
        }
    }

    fn device(r: &Replay) -> AdbDevice {
        let mut d = AdbDevice::with_runner(
            "emulator-5554",
            Path::new("adb"),
            ConsoleAddress::local(5554),
            "com.example.notes",
            Box::new(r.clone()),
        );
        d.timeouts.dump_retry = Duration::ZERO;
        d
    }

    const DUMP: &str = "exec-out uiautomator dump /dev/tty";

    #[tokio::test]
    async fn hierarchy_retries_until_idle() {
        let r = Replay::default();
        r.on(DUMP, &fixture("uiautomator_idle_error.txt"))
            .on(DUMP, &fixture("uiautomator_notes.xml"));
        let h = device(&r).hierarchy().await.unwrap();
        assert_eq!(h.widgets().len(), 10);
        assert_eq!(r.calls(), vec![format!("adb -s emulator-5554 {DUMP}"); 2]);
    }

    #[tokio::test]
    async fn act_resolves_then_runs_input() {
        let r = Replay::default();
        r.on(DUMP, &fixture("uiautomator_notes.xml"))
            .on("shell input tap 540 1673", "")
            .on("shell input keyevent KEYCODE_BACK", "");
        let d = device(&r);
        let save = crate::device::Widget {
            resource_id: "com.example.notes:id/save".into(),
            text: "Save & close".into(),
            class: "android.widget.Button".into(),
            ..Default::default()
        };
        d.act(&Action::Click {
            target: WidgetRef::of(&save),
        })
        .await
        .unwrap();
        d.act(&Action::Press { key: Key::Back }).await.unwrap();
        assert_eq!(
            r.calls(),
            [
                format!("adb -s emulator-5554 {DUMP}"),
                "adb -s emulator-5554 shell input tap 540 1673".into(),
                "adb -s emulator-5554 shell input keyevent KEYCODE_BACK".into(),
            ]
        );
    }

    #[tokio::test]
    async fn crash_activity_and_app_management() {
        let r = Replay::default();
        r.on("logcat -d -v threadtime -b crash", &fixture("logcat_crash_threadtime.txt"))
            .on("shell dumpsys activity activities", &fixture("dumpsys_activities_api34.txt"))
            .on("install -r /tmp/app.apk", "Performing Streamed Install\nSuccess\n")
            .on("install -r /tmp/bad.apk", "Performing Streamed Install\nadb: failed to install /tmp/bad.apk: Failure [INSTALL_FAILED_OLDER_SDK: Requires newer sdk version #34 (current version is #29)]\n")
            .on("logcat -b all -c", "")
            .on("shell monkey -p com.example.notes -c android.intent.category.LAUNCHER 1", "  bash arg: -p\n  bash arg: com.example.notes\nEvents injected: 1\n## Network stats: elapsed time=38ms (0ms mobile, 0ms wifi, 38ms not connected)\n")
            .on("logcat -b all -c", "")
            .on("shell pm clear com.example.notes", "Success\n");
        let d = device(&r);
        let c = d.crash().await.unwrap().unwrap();
        assert_eq!(c.exception, "java.lang.NullPointerException");
        assert_eq!(
            d.current_activity().await.unwrap(),
            "com.example.notes/.EditActivity"
        );
        d.install(Path::new("/tmp/app.apk")).await.unwrap();
        let e = d.install(Path::new("/tmp/bad.apk")).await.unwrap_err();
        assert!(matches!(&e, DeviceError::Rejected(m) if m.contains("INSTALL_FAILED_OLDER_SDK")));
        d.launch("com.example.notes").await.unwrap();
        d.clear("com.example.notes").await.unwrap();
        let calls = r.calls();
        assert_eq!(calls[4], "adb -s emulator-5554 logcat -b all -c");
        assert_eq!(calls.len(), 8);
        assert_eq!(calls[7], "adb -s emulator-5554 logcat -b all -c");
    }

    #[tokio::test]
    async fn transport_errors_are_unavailable() {
        let r = Replay::default();
        r.on_output(
            "exec-out screencap -p",
            Output {
                code: 1,
                stdout: vec![],
                stderr: b"error: device 'emulator-5554' not found\n".to_vec(),
            },
        )
        .on("exec-out screencap -p", "\u{89}not a png");
        let d = device(&r);
        assert!(
            matches!(d.screenshot().await, Err(DeviceError::Unavailable(m)) if m.contains("not found"))
        );
        assert!(
            matches!(d.screenshot().await, Err(DeviceError::Unavailable(m)) if m.contains("no PNG"))
        );
        r.on_output(
            "exec-out screencap -p",
            Output {
                code: 0,
                stdout: b"\x89PNG\r\n\x1a\nDATA".to_vec(),
                stderr: vec![],
            },
        );
        assert_eq!(d.screenshot().await.unwrap().len(), 12);
    }

    #[tokio::test]
    async fn launch_failures_explain_themselves() {
        let r = Replay::default();
        r.on("logcat -b all -c", "")
            .on(
                "shell monkey -p com.missing -c android.intent.category.LAUNCHER 1",
                "  bash arg: -p\n  bash arg: com.missing\n** No activities found to run, monkey aborted.\n",
            )
            .on("logcat -b all -c", "")
            .on_output(
                "shell pm clear com.missing",
                Output { code: 1, stdout: b"Failed\n".to_vec(), stderr: vec![] },
            );
        let d = device(&r);
        let e = d.launch("com.missing").await.unwrap_err();
        assert!(
            matches!(&e, DeviceError::Rejected(m) if m.contains("No activities found") && m.contains("installed"))
        );
        let e = d.clear("com.missing").await.unwrap_err();
        assert!(
            matches!(&e, DeviceError::Rejected(m) if m.contains("Failed")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn snapshots_go_through_the_console() {
        let (port, seen) = crate::adb::console::fake::serve("tok").await;
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("t");
        std::fs::write(&token_file, "tok").unwrap();
        let r = Replay::default();
        r.on("wait-for-device", "").on("logcat -b all -c", "");
        let mut d = device(&r);
        d.console = ConsoleAddress {
            host: "127.0.0.1".into(),
            port,
            token_file,
        };
        d.save_snapshot("base").await.unwrap();
        d.load_snapshot("base").await.unwrap();
        assert!(
            matches!(d.load_snapshot("nope").await, Err(DeviceError::Rejected(m)) if m.contains("does not exist"))
        );
        assert_eq!(
            seen.lock()
                .unwrap()
                .iter()
                .filter(|l| l.starts_with("auth"))
                .count(),
            3
        );
        assert_eq!(
            r.calls(),
            [
                "adb -s emulator-5554 wait-for-device",
                "adb -s emulator-5554 logcat -b all -c"
            ]
        );
    }
}
