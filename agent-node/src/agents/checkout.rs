//! A throwaway checkout of an instance's repository at its base commit, for agents to read.

use std::path::Path;

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

/// Checks `commit` of the bare mirror `mirror` out into a new directory under `parent` (see
/// [`crate::sandbox::tree::checkout`]: a repository of its own whose one commit is that tree).
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
    let (mirror, commit, root) = (
        mirror.to_path_buf(),
        commit.to_string(),
        dir.path().to_path_buf(),
    );
    tokio::task::spawn_blocking(move || crate::sandbox::tree::checkout(&mirror, &commit, &root))
        .await
        .map_err(|e| format!("checkout task: {e}"))??;
    Ok(Checkout { dir })
}
