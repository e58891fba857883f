//! `datasets fetch` of an android dataset against a local stand-in for the GitHub issues API
//! (a std::net server started here): report files in LTGDroid's form, a 404 row reported by
//! name without stopping the others, resumption that keeps existing files, and the offline
//! message when the API cannot be reached.

mod common;

use common::bin;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

/// Serves issues 1 and 2 of o/App (with comments) and 404 for anything else; records paths.
fn github_stand_in() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
                continue; // a reachability probe: connected and closed
            }
            let mut headers = Vec::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                headers.push(line.to_ascii_lowercase());
            }
            let path = request_line.split(' ').nth(1).unwrap_or("").to_string();
            let with_agent = headers
                .iter()
                .any(|h| h.starts_with("user-agent: reprobench/"));
            log.lock().unwrap().push(if with_agent {
                path.clone()
            } else {
                format!("{path} (no user-agent)")
            });
            let issue = |n: u32| {
                json!({"title": format!("Bug {n}"), "body": format!("Steps for {n}"),
                       "html_url": format!("https://github.com/o/App/issues/{n}"), "number": n})
            };
            let (status, body) = match path.as_str() {
                "/repos/o/App/issues/1" => ("200 OK", issue(1)),
                "/repos/o/App/issues/2" => ("200 OK", issue(2)),
                "/repos/o/App/issues/1/comments?per_page=100" => (
                    "200 OK",
                    json!([{"body": "me too"}, {"body": "fixed in 1.2"}]),
                ),
                "/repos/o/App/issues/2/comments?per_page=100" => ("200 OK", json!([])),
                _ => ("404 Not Found", json!({"message": "Not Found"})),
            };
            let body = body.to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (base, seen)
}

fn dataset(dir: &Path) {
    let ds = dir.join("ltg-mini");
    std::fs::create_dir_all(&ds).unwrap();
    std::fs::write(
        ds.join("manifest.json"),
        json!({"name": "ltg-mini", "track": "android", "instances": "instances.jsonl", "reports": "reports",
               "source": {"origin": "test", "reports": "github-issues"}})
        .to_string(),
    )
    .unwrap();
    let rows: String = [1, 2, 3]
        .iter()
        .map(|n| {
            json!({"instance_id": format!("App-{n}"), "report_id": format!("App#{n}"), "app": "App",
                   "bug_type": "crash", "issue_url": format!("https://github.com/o/App/issues/{n}"),
                   "apk": "App_1.0.apk"})
            .to_string()
                + "\n"
        })
        .collect();
    std::fs::write(ds.join("instances.jsonl"), rows).unwrap();
}

fn fetch(datasets: &Path, base: &str) -> Output {
    Command::new(bin())
        .args(["datasets", "fetch", "ltg-mini", "--datasets"])
        .arg(datasets)
        .env("REPROBENCH_GITHUB_API", base)
        .env_remove("GITHUB_TOKEN")
        .output()
        .unwrap()
}

#[test]
fn fetches_reports_reports_the_bad_row_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path());
    let (base, seen) = github_stand_in();
    let out = fetch(dir.path(), &base);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a failed row fails the fetch: {err}");
    assert!(err.contains("App-3") && err.contains("Not Found"), "{err}");
    assert!(!err.contains("App-1:") && !err.contains("App-2:"), "{err}");
    let reports = dir.path().join("ltg-mini/reports");
    let one: Value =
        serde_json::from_slice(&std::fs::read(reports.join("App#1.json")).unwrap()).unwrap();
    assert_eq!(
        one,
        json!({"apk_name": "App_1.0.apk", "url": "https://github.com/o/App/issues/1", "repo": "App",
               "title": "Bug 1", "body": "Steps for 1", "comments": ["me too", "fixed in 1.2"]})
    );
    let two: Value =
        serde_json::from_slice(&std::fs::read(reports.join("App#2.json")).unwrap()).unwrap();
    assert_eq!(two["comments"], json!([]));
    assert!(!reports.join("App#3.json").exists());
    assert_eq!(seen.lock().unwrap().len(), 5, "{:?}", seen.lock().unwrap());

    // Resuming keeps the files that are there and asks only for the missing row.
    std::fs::write(reports.join("App#1.json"), "{\"title\": \"kept\"}").unwrap();
    seen.lock().unwrap().clear();
    let out = fetch(dir.path(), &base);
    assert!(!out.status.success());
    assert_eq!(*seen.lock().unwrap(), ["/repos/o/App/issues/3"]);
    assert_eq!(
        std::fs::read_to_string(reports.join("App#1.json")).unwrap(),
        "{\"title\": \"kept\"}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 already in"));
}

#[test]
fn offline_stops_at_once_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path());
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let out = fetch(dir.path(), &format!("http://{closed}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("offline for the GitHub API"), "{err}");
    assert!(err.contains("LTGDroid replication package"), "{err}");
    assert!(err.contains("reports"), "{err}");
    assert!(
        std::fs::read_dir(dir.path().join("ltg-mini/reports"))
            .unwrap()
            .next()
            .is_none()
    );
}
