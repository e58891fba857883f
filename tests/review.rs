//! `reprobench review` end to end: an android-sim run (gold-trace and monkey), its non-crash
//! review queue, two agreeing reviews that overturn one automatic verdict, a tie broken by a
//! third reviewer on another, and the refusals (a fourth review, a repeated reviewer, an item
//! that is not in the queue, a store held by a coordinator).

mod common;

use common::bin;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn review(data: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .arg("review")
        .args(args)
        .arg("--data")
        .arg(data)
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn refused(out: Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted, expected `{needle}`");
    assert!(err.contains(needle), "expected `{needle}` in: {err}");
}

#[test]
fn two_reviewers_agree_or_a_third_decides_and_results_follow() {
    let dir = tempfile::tempdir().unwrap();
    let local = common::LocalRun::start(
        dir.path(),
        "android",
        "name = \"android-review\"\ndatasets = [\"android-sim\"]\nseed = 3\n[[agents]]\nname = \"gold-trace\"\n[[agents]]\nname = \"monkey\"\n",
        1,
        &[],
    );
    let data = local.data.clone();
    let run = local.run_id();

    let queue: Vec<Value> =
        serde_json::from_str(&ok(review(&data, &["list", run, "--json"]))).unwrap();
    assert_eq!(queue.len(), 12, "6 non-crash reports × 2 agents");
    for item in &queue {
        assert_eq!(item["state"], "pending");
        assert!(
            item["artifact_path"]
                .as_str()
                .is_some_and(|p| !p.is_empty())
        );
    }
    let monkey_items = ok(review(&data, &["list", run, "--agent", "monkey"]));
    assert!(monkey_items.contains("quicknotes-02") && !monkey_items.contains("gold-trace"));

    // Item A: monkey's automatic not_reproduced, overturned by two agreeing reviewers.
    let a = [
        "submit",
        run,
        "--instance",
        "quicknotes-02",
        "--agent",
        "monkey",
    ];
    let with = |base: &[&str], more: &[&str]| -> Vec<String> {
        base.iter().chain(more).map(|s| s.to_string()).collect()
    };
    let run_with = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        review(&data, &refs)
    };
    ok(run_with(with(
        &a,
        &[
            "--reviewer",
            "ann",
            "--verdict",
            "reproduced",
            "--note",
            "list not refreshed",
        ],
    )));
    refused(
        run_with(with(
            &a,
            &["--reviewer", "ann", "--verdict", "not-reproduced"],
        )),
        "already reviewed",
    );
    let agreed = ok(run_with(with(
        &a,
        &["--reviewer", "bob", "--verdict", "reproduced"],
    )));
    assert!(agreed.contains("agreed"), "{agreed}");
    refused(
        run_with(with(
            &a,
            &["--reviewer", "cat", "--verdict", "not-reproduced"],
        )),
        "already agreed",
    );

    // Item B: gold-trace's automatic reproduced; the first two disagree, the third decides.
    let b = [
        "submit",
        run,
        "--instance",
        "tipsplit-04",
        "--agent",
        "gold-trace",
    ];
    ok(run_with(with(
        &b,
        &["--reviewer", "ann", "--verdict", "reproduced"],
    )));
    ok(run_with(with(
        &b,
        &["--reviewer", "bob", "--verdict", "not-reproduced"],
    )));
    let ties: Vec<Value> = serde_json::from_str(&ok(review(
        &data,
        &["list", run, "--state", "tie", "--json"],
    )))
    .unwrap();
    assert_eq!(ties.len(), 1);
    assert_eq!(ties[0]["instance_id"], "tipsplit-04");
    let decided: Value = serde_json::from_str(&ok(run_with(with(
        &b,
        &["--reviewer", "cat", "--verdict", "not-reproduced", "--json"],
    ))))
    .unwrap();
    assert_eq!(decided["state"], "decided");
    assert_eq!(decided["auto_verdict"], "reproduced");
    assert_eq!(decided["verdict"], "not_reproduced");
    refused(
        run_with(with(&b, &["--reviewer", "dan", "--verdict", "reproduced"])),
        "already decided",
    );

    // Ill-formed or misplaced reviews.
    refused(
        review(
            &data,
            &[
                "submit",
                run,
                "--instance",
                "quicknotes-02",
                "--reviewer",
                "x",
                "--verdict",
                "reproduced",
            ],
        ),
        "2 items match",
    );
    refused(
        review(
            &data,
            &[
                "submit",
                run,
                "--instance",
                "quicknotes-01",
                "--agent",
                "monkey",
                "--reviewer",
                "x",
                "--verdict",
                "reproduced",
            ],
        ),
        "no item",
    );
    refused(
        review(
            &data,
            &[
                "submit",
                run,
                "--instance",
                "quicknotes-02",
                "--agent",
                "monkey",
                "--reviewer",
                "x",
                "--verdict",
                "maybe",
            ],
        ),
        "invalid value",
    );

    // While a coordinator holds the data directory, it is the only writer.
    {
        use std::os::fd::AsRawFd;
        let lock = std::fs::File::create(data.join("coordinator.lock")).unwrap();
        // SAFETY: flock on a descriptor we own; released when `lock` drops.
        assert_eq!(
            unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
            0
        );
        refused(
            review(
                &data,
                &[
                    "submit",
                    run,
                    "--instance",
                    "skycast-12",
                    "--agent",
                    "monkey",
                    "--reviewer",
                    "x",
                    "--verdict",
                    "reproduced",
                ],
            ),
            "only writer",
        );
    }

    let status: Value =
        serde_json::from_str(&ok(review(&data, &["status", run, "--json"]))).unwrap();
    assert_eq!(status["items"], 12);
    assert_eq!(status["agreed"], 1);
    assert_eq!(status["decided"], 1);
    assert_eq!(status["pending"], 10);
    assert_eq!(status["changed"], 2);
    assert_eq!(status["changed_to_reproduced"], 1);
    assert_eq!(status["changed_to_not_reproduced"], 1);

    let rows = local.rows();
    let row = |instance: &str, agent: &str| {
        rows.iter()
            .find(|r| r["instance_id"] == instance && r["agent"] == agent)
            .unwrap()
            .clone()
    };
    let a = row("quicknotes-02", "monkey");
    assert_eq!(
        (a["success"].clone(), a["verdict"].clone()),
        (Value::Bool(true), "reproduced".into())
    );
    let b = row("tipsplit-04", "gold-trace");
    assert_eq!(
        (b["success"].clone(), b["verdict"].clone()),
        (Value::Bool(false), "not_reproduced".into())
    );
    let untouched = row("skycast-12", "gold-trace");
    assert_eq!(untouched["verdict"], "reproduced");
}
