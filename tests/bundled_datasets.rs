//! The bundled datasets work from any working directory and from the copy built into the binary
//! (`REPROBENCH_DATASETS=bundled`), with no checkout in sight.

mod common;

use common::bin;
use serde_json::Value;
use std::process::Command;

fn in_empty_dir(dir: &std::path::Path) -> Command {
    let mut c = Command::new(bin());
    c.current_dir(dir)
        .env("REPROBENCH_DATASETS", "bundled")
        .env("XDG_CACHE_HOME", dir.join("cache"));
    c
}

#[test]
fn the_built_in_datasets_run_from_an_empty_directory() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let list = in_empty_dir(dir.path())
        .args(["datasets", "list"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    assert!(
        text.contains("swt-mini") && text.contains("android-sim"),
        "{text}"
    );

    let out = in_empty_dir(dir.path())
        .args([
            "eval",
            "--dataset",
            "swt-mini",
            "--predictions",
            "gold",
            "--instance-id",
            "reprobench__textkit-1",
            "--executor",
            "process",
            "--local-nodes",
            "1",
            "--json",
            "--data",
        ])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["resolved"], 1, "{v}");

    let sweep = dir.path().join("sim.toml");
    std::fs::write(
        &sweep,
        "name = 'sim'\ndatasets = ['android-sim']\n[[agents]]\nname = 'gold-trace'\n",
    )
    .unwrap();
    let out = in_empty_dir(dir.path())
        .args(["run", "sim.toml", "--local-nodes", "1", "--json", "--data"])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["succeeded"], 12,
        "gold-trace reproduces every android-sim report: {v}"
    );
}

#[test]
fn datasets_validate_reads_android_datasets_as_android_ones() {
    // It used to read every manifest as an SWT one ("missing field `huggingface_dataset`").
    let dir = tempfile::tempdir().unwrap();
    for name in ["android-ltg75", "android-sim", "swt-mini"] {
        let out = in_empty_dir(dir.path())
            .args(["datasets", "validate", name])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains(" 0 problems"), "{name}: {text}");
    }
}
