//! Cluster behaviour with real processes on loopback: a coordinator (`serve`), agent nodes
//! (`node`) and the CLI, killed, stopped and restarted the way real machines fail.

mod common;

use common::{Cluster, assert_one_result_per_task, bin, poll, send};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(120);

#[test]
fn three_local_nodes_run_synthetic_200_with_one_result_per_task() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("sweep.toml");
    std::fs::write(&sweep, "name = \"three-nodes\"\ndatasets = [\"synthetic:200:20\"]\n[[agents]]\nname = \"synthetic\"\n").unwrap();
    let data = dir.path().join("data");
    let out = Command::new(bin())
        .args([
            "run",
            sweep.to_str().unwrap(),
            "--local-nodes",
            "3",
            "--data",
            data.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
    assert_eq!(v["tasks"], 200);
    let finished = v["succeeded"].as_u64().unwrap()
        + v["failed"].as_u64().unwrap()
        + v["errored"].as_u64().unwrap();
    assert_eq!(finished, 200, "{v}");
    assert!(
        v["succeeded"].as_u64().unwrap() > 0 && v["failed"].as_u64().unwrap() > 0,
        "seeded outcomes vary: {v}"
    );
    let run = v["run_id"].as_str().unwrap();

    let rows: Vec<Value> = String::from_utf8(
        Command::new(bin())
            .args(["results", run, "--data", data.to_str().unwrap()])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    assert_one_result_per_task(&rows, 200);
    let nodes: std::collections::BTreeSet<&str> = rows
        .iter()
        .map(|r| r["node_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        nodes.len(),
        3,
        "all three nodes delivered results: {nodes:?}"
    );
    assert!(
        rows.iter()
            .all(|r| r["attempts"] == 1 && r["track"] == "synthetic")
    );

    let csv = Command::new(bin())
        .args([
            "results",
            run,
            "--data",
            data.to_str().unwrap(),
            "--format",
            "csv",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(csv.stdout).unwrap();
    assert_eq!(text.lines().count(), 201, "header plus one line per task");
    // Every row says which version of the results schema wrote it.
    assert!(text.starts_with("schema_version,run_id,sweep,track,dataset,instance_id"));
    assert!(text.lines().nth(1).unwrap().starts_with("1,"));
}

#[test]
fn a_killed_node_loses_its_leases_and_its_tasks_run_elsewhere() {
    let mut c = Cluster::start(1_000, 200);
    for n in ["n0", "n1", "n2"] {
        c.start_node(n, "synthetic=2");
    }
    let run = c.submit("synthetic:200:100");
    // Kill n1 while it holds work.
    poll(
        LONG,
        "n1 to be running tasks",
        || c.logs(),
        || {
            let s = c.status(&run);
            let on_n1 = s["attempts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["node_id"] == "n1" && a["status"] == "running");
            (on_n1 && Cluster::done(&s) >= 20).then_some(())
        },
    );
    c.node_mut("n1").kill().unwrap();
    c.node_mut("n1").wait().unwrap();

    let s = c.wait_finished(&run, LONG);
    assert_eq!(s["state"], "finished");
    let rows = c.results(&run);
    assert_one_result_per_task(&rows, 200);
    let attempts = s["attempts"].as_array().unwrap();
    let expired: Vec<&Value> = attempts
        .iter()
        .filter(|a| a["node_id"] == "n1" && a["status"] == "lease_expired")
        .collect();
    assert!(
        !expired.is_empty(),
        "n1's running attempts expired: {attempts:?}"
    );
    for a in expired {
        assert!(
            a["reason"].as_str().unwrap().contains("lease expired"),
            "{a}"
        );
        let row = rows
            .iter()
            .find(|r| r["instance_id"] == a["instance_id"])
            .unwrap();
        assert_ne!(row["node_id"], "n1", "the result came from another node");
        assert!(row["attempts"].as_u64().unwrap() >= 2, "{row}");
    }
    assert!(s["retried_attempts"].as_u64().unwrap() >= 1);
}

#[test]
fn a_restarted_coordinator_resumes_and_nodes_reconnect_by_themselves() {
    let mut c = Cluster::start(2_000, 200);
    c.start_node("a", "synthetic=2");
    c.start_node("b", "synthetic=2");
    let run = c.submit("synthetic:150:60");
    poll(
        LONG,
        "some results before the crash",
        || c.logs(),
        || (Cluster::done(&c.status(&run)) >= 20).then_some(()),
    );
    c.kill_serve();
    let before = Cluster::done(&c.status(&run));
    assert!(before < 150, "the crash happened mid-run");
    c.start_serve();

    let s = c.wait_finished(&run, LONG);
    assert_eq!(s["state"], "finished");
    assert_one_result_per_task(&c.results(&run), 150);
    for n in ["a", "b"] {
        assert!(
            c.node_mut(n).try_wait().unwrap().is_none(),
            "node {n} stayed up and reconnected"
        );
    }
    let after_restart = c
        .results(&run)
        .iter()
        .filter(|r| r["node_id"] == "a" || r["node_id"] == "b")
        .count();
    assert_eq!(after_restart, 150);
}

#[test]
fn a_stopped_nodes_late_result_is_rejected() {
    let mut c = Cluster::start(1_000, 100);
    c.start_node("sleepy", "synthetic=1");
    // One task of exactly 2.5 s (sigma 0).
    let run = c.submit("synthetic:1:2500:0");
    poll(
        LONG,
        "the task to start on sleepy",
        || c.logs(),
        || {
            let s = c.status(&run);
            s["attempts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["node_id"] == "sleepy" && a["epoch"] == 1)
                .then_some(())
        },
    );
    let sleepy = c.node_pid("sleepy");
    send(sleepy, libc::SIGSTOP);
    c.start_node("fresh", "synthetic=1");
    // The lease expires, the task goes to `fresh` as attempt 2 and finishes there, all while
    // `sleepy` is stopped; by then sleepy's own 2.5 s have passed too.
    let s = c.wait_finished(&run, LONG);
    send(sleepy, libc::SIGCONT);
    assert_eq!(s["state"], "finished");

    let s = poll(
        LONG,
        "sleepy's late result to arrive and be rejected",
        || c.logs(),
        || {
            let s = c.status(&run);
            let first = s["attempts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["epoch"] == 1)
                .cloned()?;
            (!first["late_result_rejected_at_ms"].is_null()).then_some(s)
        },
    );
    let first = s["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["epoch"] == 1)
        .unwrap()
        .clone();
    assert_eq!(first["node_id"], "sleepy");
    assert_eq!(first["status"], "lease_expired");
    let rows = c.results(&run);
    assert_one_result_per_task(&rows, 1);
    assert_eq!(rows[0]["node_id"], "fresh");
    assert_eq!(rows[0]["attempts"], 2);
}

#[test]
fn sigterm_drains_a_node_after_its_running_work() {
    let mut c = Cluster::start(2_000, 200);
    c.start_node("drainer", "synthetic=2");
    let run = c.submit("synthetic:2:1500:0");
    poll(
        LONG,
        "both tasks to run",
        || c.logs(),
        || (c.status(&run)["running"] == 2).then_some(()),
    );
    send(c.node_pid("drainer"), libc::SIGTERM);
    let dir = c.dir.path().to_path_buf();
    let status = poll(
        LONG,
        "the node to exit",
        || common::logs_in(&dir),
        || c.node_mut("drainer").try_wait().unwrap(),
    );
    assert!(status.success(), "a drained node exits cleanly: {status}");
    let s = c.status(&run);
    assert_eq!(
        s["state"], "finished",
        "the draining node finished its work first"
    );
    let rows = c.results(&run);
    assert_one_result_per_task(&rows, 2);
    assert!(
        rows.iter()
            .all(|r| r["node_id"] == "drainer" && r["attempts"] == 1)
    );
}

#[test]
fn cancel_withdraws_pending_work_and_stops_running_attempts() {
    let mut c = Cluster::start(2_000, 200);
    c.start_node("worker", "synthetic=1");
    let run = c.submit("synthetic:20:2000:0");
    poll(
        LONG,
        "the first task to run",
        || c.logs(),
        || (c.status(&run)["running"] == 1).then_some(()),
    );
    let data = c.data();
    let out = c.cli(&["cancel", &run, "--data", data.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = c.status(&run);
    assert_eq!(s["state"], "cancelled");
    assert_eq!(s["cancelled"], 20);
    assert!(c.results(&run).is_empty());
}

#[test]
fn a_run_whose_local_nodes_all_exit_ends_with_their_error_instead_of_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("sweep.toml");
    std::fs::write(
        &sweep,
        "name = \"no-nodes\"\ndatasets = [\"synthetic:4:10\"]\n[[agents]]\nname = \"synthetic\"\n",
    )
    .unwrap();
    // `emulator` slots without `--avd`: the node refuses to start (the sweep's own kind is
    // offered too, or the run would be refused before any node starts).
    let mut child = Command::new(bin())
        .args(["run", sweep.to_str().unwrap(), "--local-nodes", "1"])
        .args([
            "--node-slots",
            "synthetic=1",
            "--node-slots",
            "emulator=1",
            "--data",
        ])
        .arg(dir.path().join("data"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = poll(
        LONG,
        "the run to end once its only node exited",
        String::new,
        || child.try_wait().unwrap(),
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("--avd NAME"),
        "the node's reason reaches the user: {stderr}"
    );
}

#[test]
fn a_run_no_connected_node_can_serve_names_the_kind_it_waits_for_until_one_joins() {
    let mut c = Cluster::start(2_000, 200);
    // A node that offers another kind only: the synthetic tasks cannot go anywhere.
    c.start_node("other", "emulator=1");
    let run = c.submit("synthetic:3:10:0");
    let unserved = |c: &Cluster| {
        serde_json::from_str::<Value>(&c.live_status(Some(&run))).unwrap()["unserved_kinds"].clone()
    };
    poll(
        LONG,
        "status to name the kind the run waits for",
        || c.logs(),
        || (unserved(&c) == serde_json::json!(["synthetic"])).then_some(()),
    );
    let text = c.live_status(None);
    assert!(text.contains("--slots synthetic=N"), "{text}");
    c.start_node("worker", "synthetic=1");
    let s = c.wait_finished(&run, LONG);
    assert_eq!(
        s["succeeded"].as_u64().unwrap() + s["failed"].as_u64().unwrap(),
        3
    );
    assert_eq!(unserved(&c), serde_json::json!([]));
}
