//! The android-ltg75 manifest against the LTGDroid paper's Table III, the join with report files,
//! and the GitHub issue → report conversion.

use std::path::{Path, PathBuf};

use reprobench_domain::android::{
    AndroidReport, BugType, github_api_url, load_android_dataset, report_from_github_issue,
};

fn datasets_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets")
}

/// `../shared/data` next to the checkout, or None (with a message) when it is absent.
fn shared_data(what: &str) -> Option<PathBuf> {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    if d.is_dir() {
        Some(d)
    } else {
        assert!(
            std::env::var("REPROBENCH_REQUIRE_SHARED").as_deref() != Ok("1"),
            "REPROBENCH_REQUIRE_SHARED=1 but ../shared is absent"
        );
        eprintln!("skipping {what}: {} is absent", d.display());
        None
    }
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rb-android-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn manifest_has_the_papers_75_rows() {
    let ds = load_android_dataset("android-ltg75", &datasets_dir(), None).unwrap();
    assert_eq!(ds.name, "android-ltg75");
    assert!(ds.errors.is_empty(), "{:?}", ds.errors);
    assert_eq!(ds.instances.len(), 75);
    assert_eq!(ds.count(BugType::Crash), 51);
    assert_eq!(ds.count(BugType::NonCrash), 24);
    for i in &ds.instances {
        assert!(i.ground_truth_actions.is_some_and(|n| n > 0), "{i:?}");
        let url = i.issue_url.as_deref().unwrap();
        assert!(github_api_url(url).is_some(), "{url}");
        let (app, number) = i.report_id.split_once('#').unwrap();
        assert_eq!(app, i.app);
        assert!(url.ends_with(&format!("/{app}/issues/{number}")), "{url}");
        assert!(i.report.is_none(), "no report texts in the repository");
    }
    // The manifest's reports/ is not committed: every row is listed as missing, with the fix.
    if ds.reports_dir.as_ref().is_some_and(|d| !d.is_dir()) {
        assert_eq!(ds.missing_reports.len(), 75);
        let m = &ds.missing_reports[0];
        assert!(
            m.message
                .contains("reprobench datasets fetch android-ltg75"),
            "{m}"
        );
    }
}

#[test]
fn manifest_matches_table3_csv() {
    let Some(data) = shared_data("the Table III comparison") else {
        return;
    };
    let csv = std::fs::read_to_string(data.join("papers/ltgdroid-table3-reports.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("id,report,type,ground_truth_actions"),
        "Table III's columns changed"
    );
    let rows: Vec<Vec<&str>> = lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(',').collect())
        .collect();
    let ds = load_android_dataset("android-ltg75", &datasets_dir(), None).unwrap();
    assert_eq!(rows.len(), ds.instances.len());
    for (row, inst) in rows.iter().zip(&ds.instances) {
        assert_eq!(inst.paper_id, Some(row[0].parse().unwrap()));
        assert_eq!(inst.report_id, row[1]);
        assert_eq!(inst.bug_type.as_str(), row[2]);
        assert_eq!(inst.ground_truth_actions, Some(row[3].parse().unwrap()));
    }
}

#[test]
fn all_75_reports_join_from_shared() {
    let Some(data) = shared_data("the report join") else {
        return;
    };
    let reports = data.join("ltgdroid-reports");
    let ds = load_android_dataset("android-ltg75", &datasets_dir(), Some(&reports)).unwrap();
    assert!(ds.errors.is_empty(), "{:?}", ds.errors);
    assert!(ds.missing_reports.is_empty(), "{:?}", ds.missing_reports);
    assert_eq!(ds.with_reports().count(), 75);
    let mut no_body = Vec::new();
    for i in &ds.instances {
        let r = i.report.as_ref().unwrap();
        assert!(!r.title.trim().is_empty(), "{}", i.report_id);
        assert_eq!(Some(&r.apk_name), i.apk.as_ref());
        assert_eq!(r.repo, i.app);
        if r.body.trim().is_empty() {
            no_body.push(i.report_id.as_str());
        }
    }
    // The one issue on GitHub with no body; its title says it all.
    assert_eq!(no_body, ["LocalMaterialNotes#385"]);
}

/// A dataset directory with `rows` and the given report files.
fn small_dataset(name: &str, reports: &[(&str, &str)]) -> PathBuf {
    let d = scratch(name);
    std::fs::write(
        d.join("manifest.json"),
        r#"{"name":"tiny","track":"android","instances":"rows.jsonl","reports":"reports",
           "source":{"origin":"test","reports":"github-issues"}}"#,
    )
    .unwrap();
    let rows = [
        r#"{"instance_id":"A-1","report_id":"A#1","app":"A","bug_type":"crash","ground_truth_actions":3,"issue_url":"https://github.com/o/A/issues/1"}"#,
        r#"{"instance_id":"B-2","report_id":"B#2","app":"B","bug_type":"non-crash"}"#,
        r#"{"instance_id":"C-3","report_id":"C#3","app":"C","bug_type":"crash"}"#,
    ];
    std::fs::write(d.join("rows.jsonl"), rows.join("\n")).unwrap();
    std::fs::create_dir_all(d.join("reports")).unwrap();
    for (file, text) in reports {
        std::fs::write(d.join("reports").join(file), text).unwrap();
    }
    d
}

const REPORT_A: &str = r#"{"apk_name":"a.apk","url":"https://github.com/o/A/issues/1","repo":"A",
    "title":"Crash on open","body":"Open it.","comments":["seen"]}"#;

#[test]
fn a_missing_report_is_listed_per_row() {
    let d = small_dataset("missing", &[("A#1.json", REPORT_A), ("C#3.json", REPORT_A)]);
    let ds = load_android_dataset(d.to_str().unwrap(), Path::new("unused"), None).unwrap();
    assert_eq!(ds.instances.len(), 3, "rows stay even without a report");
    assert_eq!(ds.with_reports().count(), 2);
    assert_eq!(ds.missing_reports.len(), 1);
    let m = &ds.missing_reports[0];
    assert_eq!(m.instance_id.as_deref(), Some("B-2"));
    assert!(m.location.ends_with("B#2.json"), "{m}");
    assert!(m.message.contains("reprobench datasets fetch tiny"), "{m}");
    assert!(ds.errors.is_empty(), "{:?}", ds.errors);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn bad_report_json_names_the_file() {
    let d = small_dataset(
        "bad",
        &[
            ("A#1.json", "{not json"),
            ("B#2.json", REPORT_A),
            ("C#3.json", "[]"),
        ],
    );
    let ds = load_android_dataset(d.to_str().unwrap(), Path::new("unused"), None).unwrap();
    assert_eq!(ds.instances.len(), 3);
    assert_eq!(ds.with_reports().count(), 1);
    assert_eq!(ds.errors.len(), 2, "{:?}", ds.errors);
    for (e, file) in ds.errors.iter().zip(["A#1.json", "C#3.json"]) {
        assert!(e.location.ends_with(file), "{e}");
        assert!(e.message.contains(file), "{e}");
        assert!(e.message.contains("not a bug report"), "{e}");
    }
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_report_for_another_issue_is_refused() {
    let other = REPORT_A.replace("issues/1", "issues/9");
    let d = small_dataset("other", &[("A#1.json", &other)]);
    let ds = load_android_dataset(d.to_str().unwrap(), Path::new("unused"), None).unwrap();
    assert_eq!(ds.with_reports().count(), 0);
    assert_eq!(ds.errors.len(), 1);
    assert!(
        ds.errors[0].message.contains("issues/9"),
        "{}",
        ds.errors[0]
    );
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn clear_errors_for_unknown_inputs() {
    let e = load_android_dataset("no-such-dataset", &datasets_dir(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no-such-dataset") && e.contains("datasets list"),
        "{e}"
    );
    let e = load_android_dataset(
        "android-ltg75",
        &datasets_dir(),
        Some(Path::new("/nonexistent")),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("/nonexistent"), "{e}");
    let e = load_android_dataset("swt-mini", &datasets_dir(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("manifest.json"), "{e}");
}

/// Trimmed from a GitHub issues API response (issue and comments endpoints).
const ISSUE: &str = r#"{
  "url": "https://api.github.com/repos/k3b/APhotoManager/issues/116",
  "html_url": "https://github.com/k3b/APhotoManager/issues/116",
  "number": 116,
  "title": "App crashes on settings",
  "user": {"login": "someone"},
  "state": "closed",
  "body": "Steps:\r\n1. Open the menu\r\n2. Tap Settings",
  "comments": 3
}"#;
const COMMENTS: &str = r#"[
  {"id": 1, "user": {"login": "k3b"}, "body": "Looking into it."},
  {"id": 2, "user": {"login": "k3b"}, "body": null},
  {"id": 3, "user": {"login": "k3b"}, "body": "Fixed in the next release."}
]"#;

#[test]
fn github_issue_becomes_a_report() {
    let issue: serde_json::Value = serde_json::from_str(ISSUE).unwrap();
    let comments: serde_json::Value = serde_json::from_str(COMMENTS).unwrap();
    let r = report_from_github_issue(&issue, &comments, "APhotoManager_v0.6.4.apk").unwrap();
    assert_eq!(
        r,
        AndroidReport {
            apk_name: "APhotoManager_v0.6.4.apk".into(),
            url: "https://github.com/k3b/APhotoManager/issues/116".into(),
            repo: "APhotoManager".into(),
            title: "App crashes on settings".into(),
            body: "Steps:\r\n1. Open the menu\r\n2. Tap Settings".into(),
            comments: vec![
                "Looking into it.".into(),
                "Fixed in the next release.".into()
            ],
        }
    );
    assert_eq!(
        github_api_url(&r.url).as_deref(),
        issue.get("url").and_then(|u| u.as_str())
    );
    // Stored in LTGDroid's form, it reads back the same.
    let text = serde_json::to_string(&r).unwrap();
    let back = reprobench_domain::android::parse_android_report("r.json", &text).unwrap();
    assert_eq!(back, r);
    // The comments array as GitHub serves it reads as a report's comments too.
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["comments"] = comments;
    let lenient: AndroidReport = serde_json::from_value(v).unwrap();
    assert_eq!(lenient.comments, r.comments);
}

#[test]
fn github_error_answers_are_named() {
    let not_found =
        serde_json::json!({"message": "Not Found", "documentation_url": "https://docs.github.com"});
    let e = report_from_github_issue(&not_found, &serde_json::json!([]), "x.apk")
        .unwrap_err()
        .to_string();
    assert!(e.contains("Not Found") && e.contains("issue URL"), "{e}");
    let issue: serde_json::Value = serde_json::from_str(ISSUE).unwrap();
    let limited = serde_json::json!({"message": "API rate limit exceeded for 1.2.3.4."});
    let e = report_from_github_issue(&issue, &limited, "x.apk")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rate limit") && e.contains("GITHUB_TOKEN"),
        "{e}"
    );
}

#[test]
fn a_plain_rows_file_with_inline_reports() {
    let d = scratch("plain");
    let rows = d.join("mine.jsonl");
    let row = format!(
        r#"{{"instance_id":"A-1","report_id":"A#1","app":"A","bug_type":"crash","report":{}}}"#,
        REPORT_A.replace('\n', " ")
    );
    let second = r#"{"instance_id":"B-2","report_id":"B#2","app":"B","bug_type":"hang"}"#;
    std::fs::write(&rows, format!("{row}\n{second}\n")).unwrap();
    let ds = load_android_dataset(rows.to_str().unwrap(), Path::new("unused"), None).unwrap();
    assert_eq!(ds.name, "mine");
    assert_eq!(ds.instances.len(), 1);
    assert_eq!(ds.with_reports().count(), 1, "an inline report is kept");
    assert!(ds.missing_reports.is_empty());
    assert_eq!(
        ds.errors.len(),
        1,
        "the bad bug type is rejected with its line"
    );
    let e = &ds.errors[0];
    assert!(
        e.location.ends_with("mine.jsonl:2") && e.message.contains("hang"),
        "{e}"
    );
    std::fs::remove_dir_all(d).unwrap();
}
