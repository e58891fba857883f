//! `reprobench images self`: the image the Helm chart runs, built from this binary with no
//! registry, runs as an installed binary would (its bundled datasets included).

mod common;

use std::process::Command;

fn docker_ready() -> bool {
    let ok = Command::new("docker")
        .args(["image", "inspect", "reprobench/python-base:bookworm"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("REPROBENCH_REQUIRE_DOCKER").as_deref() != Ok("1"),
            "REPROBENCH_REQUIRE_DOCKER=1 but the Docker engine or the base image is missing: run `reprobench images bootstrap`"
        );
        eprintln!(
            "skipped: no Docker engine or no reprobench/python-base:bookworm image (`reprobench images bootstrap` builds it)"
        );
    }
    ok
}

#[test]
fn the_self_image_runs_the_binary_with_its_bundled_datasets() {
    if !docker_ready() {
        return;
    }
    let tag = format!("reprobench/reprobench:test-{}", std::process::id());
    let built = Command::new(common::bin())
        .args(["images", "self", "--tag", &tag])
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&built.stdout).trim(), tag);
    let run = |args: &[&str]| {
        Command::new("docker")
            .args(["run", "--rm", "--network", "none", &tag])
            .args(args)
            .output()
            .unwrap()
    };
    let version = run(&["--version"]);
    let datasets = run(&["datasets", "list"]);
    let _ = Command::new("docker").args(["rmi", "-f", &tag]).output();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("reprobench {}", env!("CARGO_PKG_VERSION"))
    );
    let listed = String::from_utf8_lossy(&datasets.stdout);
    assert!(
        datasets.status.success() && listed.contains("swt-mini") && listed.contains("android-sim"),
        "{listed}{}",
        String::from_utf8_lossy(&datasets.stderr)
    );
}
