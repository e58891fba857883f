//! What a sweep's dataset name stands for, decided once for every command: a synthetic dataset
//! (`synthetic:N:MEAN_MS`), an android simulator suite (a manifest of track `android` with
//! `apps`), a real-app android dataset (such a manifest without `apps`), or SWT rows (everything
//! else, loaded by the SWT loaders). The coordinator decides the executor kind of each from this
//! and the attachments (`coordinator::sweep`).

use crate::synthetic::SyntheticDataset;
use std::path::{Path, PathBuf};

/// The kind of a dataset and, for android ones, its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetKind {
    /// `synthetic:N:MEAN_MS`: nothing to read or attach.
    Synthetic,
    /// An android simulator suite (`android-sim`, or a path to one).
    AndroidSim(PathBuf),
    /// A real-app android dataset (e.g. `android-ltg75`).
    AndroidReal(PathBuf),
    /// SWT rows: a bundled or fetched dataset, or a file.
    Swt,
}

/// `path` as given when it is absolute or exists from here, else relative to `base` (a sweep
/// file's directory).
pub fn resolve(base: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() || p.exists() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// The kind of dataset `name` (a name under `datasets_dir`, or a path, relative to `base` when it
/// is not absolute and does not exist from here).
pub fn classify(name: &str, datasets_dir: &Path, base: &Path) -> DatasetKind {
    if SyntheticDataset::parse(name).is_some() {
        return DatasetKind::Synthetic;
    }
    let candidate = resolve(base, name);
    let dir = if candidate.is_dir() {
        candidate
    } else {
        datasets_dir.join(name)
    };
    let manifest: Option<serde_json::Value> = std::fs::read_to_string(dir.join("manifest.json"))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    match manifest {
        Some(m) if m["track"] == "android" && m.get("apps").is_some() => {
            DatasetKind::AndroidSim(dir)
        }
        Some(m) if m["track"] == "android" => DatasetKind::AndroidReal(dir),
        _ => DatasetKind::Swt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_manifests_decide_the_kind() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, manifest: &str| {
            std::fs::create_dir_all(dir.path().join(name)).unwrap();
            std::fs::write(dir.path().join(name).join("manifest.json"), manifest).unwrap();
        };
        write("sim", r#"{"track": "android", "apps": []}"#);
        write("real", r#"{"track": "android"}"#);
        write("swt", r#"{"track": "swt"}"#);
        let here = Path::new("/nonexistent-base");
        let kind = |name: &str| classify(name, dir.path(), here);
        assert_eq!(kind("synthetic:10:5"), DatasetKind::Synthetic);
        assert_eq!(kind("sim"), DatasetKind::AndroidSim(dir.path().join("sim")));
        assert_eq!(
            kind("real"),
            DatasetKind::AndroidReal(dir.path().join("real"))
        );
        assert_eq!(kind("swt"), DatasetKind::Swt);
        assert_eq!(kind("swt-lite"), DatasetKind::Swt, "no manifest: SWT rows");
        // A path to a suite, whichever datasets directory is given.
        let path = dir.path().join("sim");
        assert_eq!(
            classify(path.to_str().unwrap(), Path::new("/elsewhere"), here),
            DatasetKind::AndroidSim(path.clone())
        );
    }
}
