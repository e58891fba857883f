//! `reprobench images self`: the image the Helm chart runs, built from this binary with no
//! registry, runs as an installed binary would (its bundled datasets included).

mod common;

use std::process::Command;

#[test]
fn the_self_image_runs_the_binary_with_its_bundled_datasets() {
    if !common::docker_ready() {
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
