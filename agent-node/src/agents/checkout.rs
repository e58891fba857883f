//! A throwaway checkout of an instance's repository at its base commit, for agents to read.

use std::path::Path;
use tokio::process::Command;

/// A checkout in a temporary directory, removed when dropped.
pub struct Checkout {
    dir: tempfile::TempDir,
}

impl Checkout {
    /// The repository root.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

async fn git(args: &[&str], cwd: &Path) -> Result<(), String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(cwd)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .await
        .map_err(|e| format!("cannot run git (is it installed?): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Checks `commit` of the bare mirror `mirror` out into a new directory under `parent`.
pub async fn checkout(mirror: &Path, commit: &str, parent: &Path) -> Result<Checkout, String> {
    if !mirror.exists() {
        return Err(format!(
            "no mirror of the repository at {}; run `reprobench datasets prepare` for the dataset",
            mirror.display()
        ));
    }
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let dir = tempfile::Builder::new()
        .prefix("checkout-")
        .tempdir_in(parent)
        .map_err(|e| format!("{}: {e}", parent.display()))?;
    let root = dir.path();
    let mirror_s = mirror.to_string_lossy();
    git(
        &["clone", "-q", "--shared", "--no-checkout", &mirror_s, "."],
        root,
    )
    .await?;
    git(&["checkout", "-q", "--detach", commit], root).await?;
    Ok(Checkout { dir })
}
