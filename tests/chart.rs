//! The Helm chart (`charts/reprobench`): `tests/chart/test_chart.py` lints it and renders it with
//! real Helm (PyPI's helm-python-sdk, which carries Helm v4's Go SDK), validates every rendered
//! object strictly with PyPI's kubernetes-validate, and checks the objects per values
//! combination. This test gives it a virtualenv of pinned packages from PyPI, kept outside the
//! checkout and keyed by those pins, and runs it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the chart's tests use, pinned.
const PACKAGES: &[&str] = &[
    "helm-python-sdk==0.2.2",
    "kubernetes-validate==1.37.0",
    "pytest==9.2.0",
    "PyYAML==6.0.4",
];

fn required() -> bool {
    std::env::var("REPROBENCH_REQUIRE_CHART").as_deref() == Ok("1")
}

/// The virtualenv with [`PACKAGES`], made once per set of pins; `Err` says why it cannot be.
fn venv() -> Result<PathBuf, String> {
    let root = std::env::var_os("REPROBENCH_TEST_VENVS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/reprobench-test-venvs"));
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in PACKAGES.join("\n").bytes() {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let dir = root.join(format!("chart-{hash:016x}"));
    let ready = dir.join(".ready");
    if ready.exists() {
        return Ok(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let run = |cmd: &mut Command, what: &str| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{what} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&dir),
        "python3 -m venv",
    )?;
    run(
        Command::new(dir.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(PACKAGES),
        "pip install (needs PyPI)",
    )?;
    std::fs::write(&ready, b"").map_err(|e| format!("{}: {e}", ready.display()))?;
    Ok(dir)
}

#[test]
fn the_chart_lints_renders_and_validates_with_real_helm() {
    let venv = match venv() {
        Ok(v) => v,
        Err(e) => {
            assert!(
                !required(),
                "REPROBENCH_REQUIRE_CHART=1 but the chart's test environment cannot be made: {e}"
            );
            eprintln!("skipped: {e}");
            return;
        }
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(venv.join("bin/python"))
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root.join("tests/chart"))
        .current_dir(root)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    // pytest ran the chart's tests, not none of them.
    assert!(
        text.contains(" passed") && !text.contains("no tests ran"),
        "{text}"
    );
}
