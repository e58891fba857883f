//! The HTML report in a real browser. Headless Chromium loads a report with two tables, all
//! three figures and 51 result rows; the test fails on any JavaScript exception, `console.error`
//! or `console.assert` failure, browser-logged error, or request that leaves the file (the
//! report must be self-contained). It then sorts and filters the per-instance table as a person
//! would and saves a screenshot next to the report (printed at the end).
//!
//! How errors are seen: Chromium runs with `--remote-debugging-pipe` and the test speaks the
//! DevTools protocol to it (NUL-terminated JSON on the browser's fds 3 and 4), with the
//! `Runtime`, `Log` and `Network` domains enabled *before* the page loads, so every
//! `Runtime.exceptionThrown`, `Runtime.consoleAPICalled` and `Log.entryAdded` arrives as a
//! structured event with its level. (Parsing `--enable-logging=stderr` output instead would
//! depend on a log format that changes between versions and logs `console.error` at INFO like
//! `console.log`.) To show the detector works, a canary copy of the report with a broken script
//! and an outside image must first produce a console error, an exception and a request.
//!
//! Without Chromium the test is skipped, or fails when `REPROBENCH_REQUIRE_CHROMIUM=1` (CI).

use reprobench_analysis::html::{ReportInput, render_report};
use reprobench_analysis::plots::{ablation_bars, success_vs_cost, upset};
use reprobench_analysis::table::{Cell, Table};
use reprobench_domain::results::ResultRow;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// Generous: two cores may be busy compiling while the browser starts.
const TIMEOUT: Duration = Duration::from_secs(60);
const WIDTH: u32 = 1280;
const HEIGHT: u32 = 2000;

const APPROACHES: [(&str, &str); 5] = [
    ("ours", "full"),
    ("ours", "no-feedback"),
    ("ours", "no-localization"),
    ("baseline", "default"),
    ("zero-shot", "default"),
];
/// The row whose instance id would run script if the report did not escape it.
const HOSTILE_ID: &str = "x<img src=nowhere onerror=\"console.error('unescaped')\">&";

#[test]
fn report_renders_in_chromium_without_console_errors() {
    let Some(chromium) = find_chromium() else {
        assert!(
            std::env::var("REPROBENCH_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "Chromium is not installed but REPROBENCH_REQUIRE_CHROMIUM=1: `apt-get install -y chromium`"
        );
        eprintln!("skipping: no chromium on PATH (`apt-get install -y chromium` to run this test)");
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report_browser");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let html = render_report(&sample_report());
    let report = dir.join("report.html");
    fs::write(&report, &html).unwrap();
    let canary = dir.join("canary.html");
    let broken = "<script>console.error('canary error');</script>\n<script>undefinedCanary();</script>\n\
                  <img src=\"elsewhere.png\" alt=\"\">\n";
    fs::write(
        &canary,
        html.replace("</body>", &format!("{broken}</body>")),
    )
    .unwrap();

    let mut browser = Browser::launch(&chromium, &dir);

    // The detector sees a console.error and an uncaught exception on the canary page.
    let page = browser.open_page();
    browser.load(&page, &file_url(&canary));
    let problems = browser.problems(&page, &file_url(&canary));
    assert!(
        problems.iter().any(|p| p.contains("canary error")),
        "console.error not detected: {problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("undefinedCanary")),
        "exception not detected: {problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("request: file://") && p.contains("elsewhere.png")),
        "{problems:?}"
    );

    // The real report: it loads cleanly and its script ran to the end.
    let page = browser.open_page();
    let url = file_url(&report);
    browser.load(&page, &url);
    let problems = browser.problems(&page, &url);
    assert!(
        problems.is_empty(),
        "the report logged errors or loaded other files: {problems:#?}"
    );
    assert_eq!(
        browser.eval(
            &page,
            "document.documentElement.hasAttribute('data-report-ready')"
        ),
        true
    );
    assert_eq!(
        browser.eval(&page, "document.querySelectorAll('figure svg').length"),
        3
    );
    assert_eq!(
        browser.eval(&page, "document.querySelectorAll('table').length"),
        3
    );
    assert_eq!(
        browser.eval(&page, "document.querySelectorAll('#drill tbody tr').length"),
        51
    );
    assert_eq!(
        browser.eval(
            &page,
            "document.querySelector('#drill tbody td').textContent"
        ),
        HOSTILE_ID
    );

    // Sorting: numbers by value, text in natural order, a second click reverses.
    let cost = "Array.from(document.querySelectorAll('#drill tbody tr')).map(r => Number(r.cells[8].dataset.v))";
    browser.eval(
        &page,
        "document.querySelectorAll('#drill thead button')[8].click()",
    );
    let ascending = numbers(&browser.eval(&page, cost));
    assert!(ascending.windows(2).all(|w| w[0] <= w[1]), "{ascending:?}");
    browser.eval(
        &page,
        "document.querySelectorAll('#drill thead button')[8].click()",
    );
    let descending = numbers(&browser.eval(&page, cost));
    assert!(
        descending.windows(2).all(|w| w[0] >= w[1]),
        "{descending:?}"
    );
    assert_eq!(
        browser.eval(
            &page,
            "document.querySelectorAll('#drill thead th')[8].getAttribute('aria-sort')"
        ),
        "descending"
    );
    browser.eval(
        &page,
        "document.querySelectorAll('#drill thead button')[0].click()",
    );
    let first = "Array.from(document.querySelectorAll('#drill tbody tr')).slice(0, 15).map(r => r.cells[0].textContent)";
    let ids: Vec<String> = browser
        .eval(&page, first)
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let want: Vec<String> = (1..=3).flat_map(|i| vec![format!("inst-{i}"); 5]).collect();
    assert_eq!(ids, want, "natural order puts inst-2 before inst-10");

    // Filtering: every word must match; the count follows.
    let filter = |words: &str| {
        format!(
            "(() => {{ const f = document.getElementById('drill-filter'); f.value = {}; \
             f.dispatchEvent(new Event('input')); \
             return [document.querySelectorAll('#drill tbody tr:not([hidden])').length, \
             document.getElementById('drill-count').textContent]; }})()",
            json!(words)
        )
    };
    assert_eq!(
        browser.eval(&page, &filter("NO-FEEDBACK")),
        json!([10, "10 of 51 rows"])
    );
    assert_eq!(
        browser.eval(&page, &filter("baseline inst-1")),
        json!([2, "2 of 51 rows"]),
        "inst-1 and inst-10"
    );
    assert_eq!(
        browser.eval(&page, &filter("")),
        json!([51, "51 of 51 rows"])
    );

    let problems = browser.problems(&page, &url);
    assert!(
        problems.is_empty(),
        "sorting or filtering logged errors: {problems:#?}"
    );

    let png = browser.screenshot(&page);
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert!(w == WIDTH && h >= HEIGHT, "a {w}x{h} screenshot");
    assert!(
        png.len() > 20_000,
        "a {}-byte screenshot is too small to show the report",
        png.len()
    );
    let shot = dir.join("report.png");
    fs::write(&shot, &png).unwrap();
    browser.close();
    eprintln!(
        "report: {}\nscreenshot: {}",
        report.display(),
        shot.display()
    );
}

/// 5 approaches x 10 instances, plus one row whose text needs escaping (listed first).
fn sample_rows() -> Vec<ResultRow> {
    let mut rows = vec![ResultRow {
        run_id: "run-1".into(),
        dataset: "swt-lite".into(),
        instance_id: HOSTILE_ID.into(),
        agent: "ours".into(),
        variant: "full".into(),
        backbone: "model-a".into(),
        verdict: "error".into(),
        error_class: Some("infra:<lease_expired>".into()),
        ..Default::default()
    }];
    for (a, (agent, variant)) in APPROACHES.iter().enumerate() {
        for i in 1..=10u32 {
            // A fixed pattern: the full agent solves most, the zero-shot baseline least.
            let success = (i * 7 + a as u32 * 3) % 10 < 8 - 2 * a as u32;
            rows.push(ResultRow {
                run_id: "run-1".into(),
                dataset: "swt-lite".into(),
                instance_id: format!("inst-{i}"),
                repo_or_app: "django/django".into(),
                agent: agent.to_string(),
                variant: variant.to_string(),
                backbone: "model-a".into(),
                repeat: i % 2,
                success,
                verdict: if success {
                    "fail_to_pass".into()
                } else {
                    "no_reproduction".into()
                },
                tokens_in: 10_000 + 997 * u64::from(i) * (a as u64 + 1),
                tokens_out: 500 + 37 * u64::from(i),
                cost_usd: 0.02 * (5 - a) as f64 + 0.003 * f64::from(i),
                wall_s: 30.0 + 4.5 * f64::from(i) + 10.0 * a as f64,
                artifact_path: format!("artifacts/run-1/{agent}-{variant}/inst-{i}"),
                ..Default::default()
            });
        }
    }
    rows
}

fn sample_report() -> ReportInput {
    let rows = sample_rows();
    let mut solved: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stats: BTreeMap<String, (f64, f64, f64)> = BTreeMap::new(); // tasks, successes, cost
    for r in rows.iter().filter(|r| r.error_class.is_none()) {
        let name = format!("{}/{}", r.agent, r.variant);
        let s = stats.entry(name.clone()).or_default();
        s.0 += 1.0;
        s.2 += r.cost_usd;
        let set = solved.entry(name).or_default();
        if r.success {
            s.1 += 1.0;
            set.insert(r.instance_id.clone());
        }
    }
    let name = |(agent, variant): &(&str, &str)| format!("{agent}/{variant}");
    let sr = |n: &str| 100.0 * stats[n].1 / stats[n].0;

    let mut main = Table::new(
        "Main results",
        &[
            ("approach", "Approach"),
            ("sr", "SR (%)"),
            ("cost", "Cost ($/task)"),
            ("n", "Tasks"),
        ],
    );
    for a in &APPROACHES {
        let n = name(a);
        main.push(vec![
            Cell::text(&n),
            Cell::MeanStd {
                mean: sr(&n),
                std: Some(2.5),
                decimals: 1,
            },
            Cell::num(stats[&n].2 / stats[&n].0, 3),
            Cell::Int(stats[&n].0 as i64),
        ]);
    }
    main.push(vec![
        Cell::text("published <ref>"),
        Cell::num(41.2, 1),
        Cell::Empty,
        Cell::Empty,
    ]);
    main.note = Some("Mean ± std over 3 repeats; the last row is a published figure.".into());
    let mut ablation = Table::new(
        "Ablation",
        &[
            ("variant", "Variant"),
            ("sr", "SR (%)"),
            ("delta", "Δ vs full"),
        ],
    );
    let full = sr("ours/full");
    for a in APPROACHES.iter().filter(|(agent, _)| *agent == "ours") {
        ablation.push(vec![
            Cell::text(a.1),
            Cell::num(sr(&name(a)), 1),
            Cell::num(sr(&name(a)) - full, 1),
        ]);
    }

    let bars: Vec<(String, f64)> = APPROACHES
        .iter()
        .filter(|(agent, _)| *agent == "ours")
        .map(|a| (a.1.to_string(), sr(&name(a))))
        .collect();
    let sets: Vec<(String, BTreeSet<String>)> = APPROACHES
        .iter()
        .map(|a| (name(a), solved[&name(a)].clone()))
        .collect();
    let points: Vec<(String, f64, f64)> = APPROACHES
        .iter()
        .map(|a| (name(a), stats[&name(a)].2 / stats[&name(a)].0, sr(&name(a))))
        .collect();
    ReportInput {
        title: "reprobench report: swt-lite".into(),
        tables: vec![main, ablation],
        plots: vec![
            (
                "Figure 1: success rate of each ablation.".into(),
                ablation_bars("Ablation", &bars),
            ),
            (
                "Figure 2: instances solved by each approach.".into(),
                upset("Solved instances", &sets),
            ),
            (
                "Figure 3: success against cost.".into(),
                success_vs_cost("Success vs cost", &points),
            ),
        ],
        rows,
    }
}

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|n| n.as_f64().expect("a number"))
        .collect()
}

fn find_chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|p| p.is_file())
}

fn file_url(path: &Path) -> String {
    format!("file://{}", path.canonicalize().unwrap().display())
}

/// Headless Chromium driven over the DevTools protocol on a pipe.
struct Browser {
    child: Child,
    to_browser: ChildStdin,
    from_browser: Receiver<Value>,
    next_id: u64,
    /// Events received so far (answers to calls are consumed by `call`).
    events: Vec<Value>,
}

impl Browser {
    /// Starts Chromium with a fresh profile in `dir` and its log in `dir/chromium.log`.
    fn launch(chromium: &Path, dir: &Path) -> Browser {
        let profile = dir.join("profile");
        // The browser reads commands from fd 3 and writes answers to fd 4: bash puts our two
        // pipes there before it execs Chromium (std cannot map arbitrary fds).
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>&2"#)
            .arg(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                "--no-first-run",
            ])
            .args([
                "--no-default-browser-check",
                "--hide-scrollbars",
                "--mute-audio",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(File::create(dir.join("chromium.log")).unwrap())
            .spawn()
            .expect("start chromium");
        let mut answers = BufReader::new(child.stdout.take().unwrap());
        let to_browser = child.stdin.take().unwrap();
        let (tx, from_browser) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            while answers.read_until(0, &mut buf).is_ok_and(|n| n > 0) {
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                let msg = serde_json::from_slice(&buf).expect("DevTools sends JSON");
                if tx.send(msg).is_err() {
                    break;
                }
                buf.clear();
            }
        });
        Browser {
            child,
            to_browser,
            from_browser,
            next_id: 0,
            events: Vec::new(),
        }
    }

    /// Sends a command (to a page when `session` is set) and returns its result.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to_browser
            .write_all(&bytes)
            .expect("write to chromium");
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let msg = self
                .receive(deadline)
                .unwrap_or_else(|| panic!("no answer to {method} in {TIMEOUT:?}"));
            if msg["id"] == id {
                assert!(
                    msg.get("error").is_none(),
                    "{method} failed: {}",
                    msg["error"]
                );
                return msg["result"].clone();
            }
            self.events.push(msg);
        }
    }

    fn receive(&mut self, deadline: Instant) -> Option<Value> {
        self.from_browser
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .ok()
    }

    /// A new blank page with the domains that report errors and requests already enabled.
    fn open_page(&mut self) -> String {
        let target = self.call(None, "Target.createTarget", json!({ "url": "about:blank" }));
        let attached = self.call(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target["targetId"], "flatten": true }),
        );
        let session = attached["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        for domain in ["Page", "Runtime", "Log", "Network"] {
            self.call(Some(&session), &format!("{domain}.enable"), json!({}));
        }
        let size =
            json!({ "width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": false });
        self.call(Some(&session), "Emulation.setDeviceMetricsOverride", size);
        session
    }

    /// Navigates the page and waits for its load event.
    fn load(&mut self, session: &str, url: &str) {
        let nav = self.call(Some(session), "Page.navigate", json!({ "url": url }));
        assert!(
            nav.get("errorText").is_none(),
            "cannot open {url}: {}",
            nav["errorText"]
        );
        let loaded = |e: &Value| e["method"] == "Page.loadEventFired" && e["sessionId"] == session;
        let deadline = Instant::now() + TIMEOUT;
        while !self.events.iter().any(loaded) {
            let event = self
                .receive(deadline)
                .unwrap_or_else(|| panic!("{url} did not load in {TIMEOUT:?}"));
            self.events.push(event);
        }
    }

    /// Evaluates a JavaScript expression in the page and returns its value as JSON.
    fn eval(&mut self, session: &str, expression: &str) -> Value {
        let params =
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true });
        let out = self.call(Some(session), "Runtime.evaluate", params);
        assert!(
            out.get("exceptionDetails").is_none(),
            "`{expression}` threw: {}",
            out["exceptionDetails"]
        );
        out["result"].get("value").cloned().unwrap_or(Value::Null)
    }

    /// Errors the page logged or threw so far, and requests for anything but `own_url`.
    fn problems(&mut self, session: &str, own_url: &str) -> Vec<String> {
        // Anything already sent arrives before the answer to a command.
        self.call(
            Some(session),
            "Runtime.evaluate",
            json!({ "expression": "0" }),
        );
        let mut out = Vec::new();
        for e in self.events.iter().filter(|e| e["sessionId"] == session) {
            let p = &e["params"];
            match e["method"].as_str().unwrap_or_default() {
                "Runtime.exceptionThrown" => {
                    let d = &p["exceptionDetails"];
                    out.push(format!(
                        "exception: {}",
                        d["exception"]["description"]
                            .as_str()
                            .unwrap_or(&d["text"].to_string())
                    ));
                }
                "Runtime.consoleAPICalled"
                    if matches!(p["type"].as_str(), Some("error" | "assert")) =>
                {
                    out.push(format!(
                        "console.{}: {}",
                        p["type"].as_str().unwrap(),
                        p["args"]
                    ));
                }
                "Log.entryAdded" if p["entry"]["level"] == "error" => {
                    out.push(format!(
                        "log: {} ({})",
                        p["entry"]["text"], p["entry"]["url"]
                    ));
                }
                "Network.requestWillBeSent" => {
                    let requested = p["request"]["url"].as_str().unwrap_or_default();
                    if requested != own_url && !requested.starts_with("data:") {
                        out.push(format!("request: {requested}"));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// A PNG of the whole page, WIDTH pixels wide and at least the viewport's HEIGHT tall.
    fn screenshot(&mut self, session: &str) -> Vec<u8> {
        let metrics = self.call(Some(session), "Page.getLayoutMetrics", json!({}));
        let height = metrics["cssContentSize"]["height"]
            .as_f64()
            .expect("a content height")
            .max(f64::from(HEIGHT));
        let clip = json!({ "x": 0, "y": 0, "width": WIDTH, "height": height.ceil(), "scale": 1 });
        let params = json!({ "format": "png", "captureBeyondViewport": true, "clip": clip });
        let shot = self.call(Some(session), "Page.captureScreenshot", params);
        base64_decode(shot["data"].as_str().expect("base64 data"))
    }

    /// Asks the browser to quit and waits for it.
    fn close(mut self) {
        let _ = self
            .to_browser
            .write_all(b"{\"id\":0,\"method\":\"Browser.close\"}\0");
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("chromium did not quit in {TIMEOUT:?}");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // After a failed assertion: do not leave the browser running.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = s.bytes().filter(|&c| c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &d)| n | u32::from(d) << (18 - 6 * i));
        out.extend(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}
