//! The crash oracle: finds an app's Java crash in `adb logcat -d -v threadtime` text (pure).
//!
//! A crash is the `AndroidRuntime` block the dying process logs:
//!
//! ```text
//! 11-30 13:05:12.345  4321  4321 E AndroidRuntime: FATAL EXCEPTION: main
//! 11-30 13:05:12.345  4321  4321 E AndroidRuntime: Process: com.example.notes, PID: 4321
//! 11-30 13:05:12.345  4321  4321 E AndroidRuntime: java.lang.RuntimeException: Unable to ...
//! 11-30 13:05:12.345  4321  4321 E AndroidRuntime:     at android.app.ActivityThread...
//! 11-30 13:05:12.345  4321  4321 E AndroidRuntime: Caused by: java.lang.NullPointerException: ...
//! ```
//!
//! Only blocks whose `Process:` is the app are reported; other processes' crashes, ANR
//! reports and unrelated lines interleaved by other PIDs are ignored. Any thread's fatal
//! exception counts (a background-thread crash kills the app just the same).
//!
//! **Root cause choice:** [`FatalException`] keeps the whole `Caused by:` chain. Its
//! [`FatalException::to_crash`] reports the *root cause* (the last `Caused by:`) class and
//! message, because that names the bug (a `NullPointerException`, not the framework's
//! `RuntimeException: Unable to start activity` wrapper), and its frames, falling back to the
//! outermost frames when the root cause's were all elided (`... 12 more`).

use crate::device::Crash;
use regex::Regex;
use std::sync::LazyLock;

/// How many frames a [`Crash`] keeps.
pub const MAX_FRAMES: usize = 10;

/// One exception of a chain: class, message and frames (without `at `).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExceptionPart {
    /// Class, e.g. `java.lang.IllegalStateException`.
    pub class: String,
    /// Message ("" when none); continuation lines are joined with `\n`.
    pub message: String,
    /// Stack frames, e.g. `com.example.Main.onCreate(Main.java:12)`.
    pub frames: Vec<String>,
}

/// A whole `FATAL EXCEPTION` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FatalException {
    /// The process name from `Process:`.
    pub process: String,
    /// Its PID.
    pub pid: u32,
    /// The thread name from `FATAL EXCEPTION: <thread>`.
    pub thread: String,
    /// The outermost exception first, then each `Caused by:`.
    pub chain: Vec<ExceptionPart>,
}

impl FatalException {
    /// The innermost exception (the root cause), or the outermost when there is no chain.
    pub fn root_cause(&self) -> Option<&ExceptionPart> {
        self.chain.last()
    }

    /// The crash as the oracle reports it: the root cause's class, message and frames.
    pub fn to_crash(&self) -> Crash {
        let root = self.root_cause().cloned().unwrap_or_default();
        let frames = if root.frames.is_empty() {
            self.chain
                .first()
                .map(|e| e.frames.clone())
                .unwrap_or_default()
        } else {
            root.frames
        };
        Crash {
            process: self.process.clone(),
            exception: root.class,
            message: root.message,
            frames: frames.into_iter().take(MAX_FRAMES).collect(),
        }
    }
}

static THREADTIME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\d\d-\d\d\s+\d\d:\d\d:\d\d\.\d+\s+(\d+)\s+\d+\s+[VDIWEFA]\s+(.*?)\s*: ?(.*)$")
        .expect("valid regex")
});
static PROCESS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^Process: ([^,\s]+), PID: (\d+)").expect("valid regex"));

/// A logcat line's PID, tag and message (`-v threadtime`; `None` for headers and other formats).
fn split_line(line: &str) -> Option<(u32, &str, &str)> {
    let c = THREADTIME.captures(line.trim_end_matches('\r'))?;
    Some((c[1].parse().ok()?, c.get(2)?.as_str(), c.get(3)?.as_str()))
}

/// Every fatal exception in the log, in order, whatever the process.
pub fn fatal_exceptions(log: &str) -> Vec<FatalException> {
    // Group AndroidRuntime lines per PID; a block starts at "FATAL EXCEPTION".
    let mut open: Vec<Open> = Vec::new(); // blocks in progress, one per pid
    let mut done: Vec<FatalException> = Vec::new();
    for line in log.lines() {
        let Some((pid, tag, msg)) = split_line(line) else {
            continue;
        };
        if tag != "AndroidRuntime" {
            continue;
        }
        if let Some(thread) = msg.strip_prefix("FATAL EXCEPTION: ") {
            if let Some(i) = open.iter().position(|b| b.ex.pid == pid) {
                done.push(open.remove(i).ex);
            }
            open.push(Open {
                ex: FatalException {
                    pid,
                    thread: thread.trim().to_string(),
                    ..Default::default()
                },
                in_suppressed: false,
            });
            continue;
        }
        let Some(Open {
            ex: block,
            in_suppressed,
        }) = open.iter_mut().find(|b| b.ex.pid == pid)
        else {
            continue;
        };
        if let Some(c) = PROCESS.captures(msg) {
            block.process = c[1].to_string();
            continue;
        }
        // Java indents enclosed traces: top-level frames are "\tat", a suppressed exception is
        // "\tSuppressed:" with "\t\tat" frames and "\tCaused by:" causes. Only the top level
        // and its (unindented) "Caused by:" chain are kept.
        let indent = msg.len() - msg.trim_start_matches('\t').len();
        let body = msg.trim_start();
        if indent >= 2 || (indent == 1 && !body.starts_with("at ") && !body.starts_with("... ")) {
            *in_suppressed |= body.starts_with("Suppressed: ");
            continue;
        }
        if let Some(frame) = body.strip_prefix("at ") {
            if *in_suppressed {
                continue;
            }
            if let Some(e) = block.chain.last_mut() {
                e.frames.push(frame.trim().to_string());
            }
        } else if body.starts_with("... ") && body.ends_with(" more") {
            // Elided frames shared with the enclosing exception.
        } else if let Some(cause) = msg.strip_prefix("Caused by: ") {
            *in_suppressed = false;
            block.chain.push(exception_header(cause));
        } else if block.chain.is_empty() {
            block.chain.push(exception_header(body));
        } else if let Some(e) = block.chain.last_mut().filter(|e| e.frames.is_empty()) {
            // A multi-line message continues until the first frame.
            e.message.push('\n');
            e.message.push_str(msg);
        }
    }
    done.extend(open.into_iter().map(|o| o.ex));
    done.retain(|b| !b.chain.is_empty());
    done
}

/// A block being read, and whether it is inside a suppressed exception's trace.
struct Open {
    ex: FatalException,
    in_suppressed: bool,
}

fn exception_header(s: &str) -> ExceptionPart {
    // "pkg.Class: message" or just "pkg.Class"; a message may itself contain ": ".
    let (class, message) = match s.split_once(": ") {
        Some((c, m)) if !c.contains(' ') => (c, m),
        _ => (s, ""),
    };
    ExceptionPart {
        class: class.trim().to_string(),
        message: message.to_string(),
        frames: Vec::new(),
    }
}

/// The app's first crash in the log, as the oracle reports it (see the module docs).
pub fn find_crash(log: &str, package: &str) -> Option<Crash> {
    fatal_exceptions(log)
        .into_iter()
        .find(|b| process_matches(&b.process, package))
        .map(|b| b.to_crash())
}

/// Whether `process` belongs to `package` (the package itself or one of its `:name` processes).
fn process_matches(process: &str, package: &str) -> bool {
    process == package
        || process
            .strip_prefix(package)
            .is_some_and(|rest| rest.starts_with(':'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adb::fixture;

    #[test]
    fn finds_app_crash_with_root_cause() {
        let log = fixture("logcat_crash_threadtime.txt");
        let all = fatal_exceptions(&log);
        // The other app's crash is parsed but not reported for our package.
        assert_eq!(all.len(), 2);
        let ours = all
            .iter()
            .find(|b| b.process == "com.example.notes")
            .unwrap();
        assert_eq!(ours.pid, 4321);
        assert_eq!(ours.thread, "main");
        assert_eq!(ours.chain.len(), 2);
        assert_eq!(ours.chain[0].class, "java.lang.RuntimeException");
        assert!(
            ours.chain[0]
                .message
                .starts_with("Unable to start activity")
        );
        let c = find_crash(&log, "com.example.notes").unwrap();
        assert_eq!(c.process, "com.example.notes");
        assert_eq!(c.exception, "java.lang.NullPointerException");
        assert_eq!(
            c.message,
            "Attempt to invoke virtual method 'int java.lang.String.length()' on a null object reference"
        );
        assert_eq!(
            c.frames[0],
            "com.example.notes.EditActivity.onCreate(EditActivity.kt:42)"
        );
        assert!(c.frames.iter().all(|f| !f.starts_with("at ")));
        assert!(c.frames.len() <= MAX_FRAMES);
    }

    #[test]
    fn ignores_other_processes_and_anr() {
        let log = fixture("logcat_crash_threadtime.txt");
        assert!(find_crash(&log, "com.example").is_none());
        let c = find_crash(&log, "org.other.app").unwrap();
        assert_eq!(c.exception, "java.lang.IllegalStateException");
        assert_eq!(c.message, "boom\nsecond line");
        assert!(find_crash(&fixture("logcat_anr_only.txt"), "com.example.notes").is_none());
    }

    #[test]
    fn crash_buffer_and_truncation() {
        let c = find_crash(&fixture("logcat_crash_buffer.txt"), "com.example.notes").unwrap();
        assert_eq!(c.exception, "java.lang.IndexOutOfBoundsException");
        assert_eq!(c.message, "Index: 3, Size: 3");
        assert_eq!(c.frames.len(), MAX_FRAMES);
        assert_eq!(c.frames[0], "java.util.ArrayList.get(ArrayList.java:437)");
    }

    #[test]
    fn suppressed_traces_are_skipped() {
        let l = |m: &str| format!("11-30 14:00:00.000   700   700 E AndroidRuntime: {m}\n");
        let log = [
            l("FATAL EXCEPTION: main"),
            l("Process: com.a, PID: 700"),
            l("java.io.IOException: write failed"),
            l("\tat com.a.Store.save(Store.kt:10)"),
            l("\tSuppressed: java.io.IOException: close failed"),
            l("\t\tat com.a.Store.close(Store.kt:20)"),
            l("\tCaused by: java.lang.Error: inner of suppressed"),
            l("\t\t... 3 more"),
            l("Caused by: android.system.ErrnoException: write failed: ENOSPC (No space left on device)"),
            l("\tat libcore.io.Linux.writeBytes(Native Method)"),
        ]
        .concat();
        let all = fatal_exceptions(&log);
        assert_eq!(all[0].chain.len(), 2);
        assert_eq!(all[0].chain[0].frames, ["com.a.Store.save(Store.kt:10)"]);
        let c = find_crash(&log, "com.a").unwrap();
        assert_eq!(c.exception, "android.system.ErrnoException");
        assert_eq!(c.message, "write failed: ENOSPC (No space left on device)");
        assert_eq!(c.frames, ["libcore.io.Linux.writeBytes(Native Method)"]);
    }

    #[test]
    fn secondary_process_matches_package() {
        assert!(process_matches("com.a:remote", "com.a"));
        assert!(!process_matches("com.ab", "com.a"));
    }
}
