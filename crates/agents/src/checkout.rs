//! A throwaway checkout of an instance's repository at its base commit, for agents to read.

use std::path::{Path, PathBuf};

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

/// Why a checkout could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    /// The dataset's bare mirror of the repository is not there.
    #[error(
        "no mirror of the repository at {}; run `reprobench datasets prepare` for the dataset",
        .mirror.display()
    )]
    NoMirror { mirror: PathBuf },
    /// The directory to check out under could not be made or written.
    // The io error is in the message, not `source()`, so `{:#}` does not print it twice.
    #[error("{}: {error}", .parent.display())]
    Scratch {
        parent: PathBuf,
        error: std::io::Error,
    },
    /// The blocking checkout task panicked or was cancelled.
    #[error("checkout task: {0}")]
    Task(tokio::task::JoinError),
    /// Writing the commit's tree failed.
    #[error("{0}")]
    Tree(String),
}

/// Checks `commit` of the bare mirror `mirror` out into a new directory under `parent` (see
/// [`reprobench_sandbox::tree::checkout`]: a repository of its own whose one commit is that tree).
pub async fn checkout(
    mirror: &Path,
    commit: &str,
    parent: &Path,
) -> Result<Checkout, CheckoutError> {
    if !mirror.exists() {
        return Err(CheckoutError::NoMirror {
            mirror: mirror.to_path_buf(),
        });
    }
    let scratch = |error: std::io::Error| CheckoutError::Scratch {
        parent: parent.to_path_buf(),
        error,
    };
    std::fs::create_dir_all(parent).map_err(scratch)?;
    let dir = tempfile::Builder::new()
        .prefix("checkout-")
        .tempdir_in(parent)
        .map_err(scratch)?;
    let (mirror, commit, root) = (
        mirror.to_path_buf(),
        commit.to_string(),
        dir.path().to_path_buf(),
    );
    tokio::task::spawn_blocking(move || {
        reprobench_sandbox::tree::checkout(&mirror, &commit, &root)
    })
    .await
    .map_err(CheckoutError::Task)?
    .map_err(|message| CheckoutError::Tree(message.to_string()))?;
    Ok(Checkout { dir })
}
