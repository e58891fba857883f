//! The datasets built into the binary (swt-mini, android-sim, SWT-bench's env specs, the
//! manifests), and where the binary finds its datasets: `REPROBENCH_DATASETS` (a directory, or
//! `bundled` for the built-in copy), `./datasets`, the checkout the binary was built from, and
//! otherwise the built-in copy, unpacked once into the cache directory.

mod files {
    include!(concat!(env!("OUT_DIR"), "/bundled_datasets.rs"));
}

use std::path::{Path, PathBuf};

/// Where the datasets come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A directory: `REPROBENCH_DATASETS`, `./datasets`, or the checkout's.
    Dir(PathBuf),
    /// The built-in copy.
    Bundled,
}

/// The datasets directory a user means (pure): `REPROBENCH_DATASETS` first (`bundled` names the
/// built-in copy), then `./datasets` when it holds datasets, then the checkout's.
pub fn choose(env: Option<&str>, cwd_datasets: Option<&Path>, checkout: Option<&Path>) -> Source {
    match env {
        Some("bundled") => Source::Bundled,
        Some(d) if !d.is_empty() => Source::Dir(PathBuf::from(d)),
        _ => cwd_datasets
            .or(checkout)
            .map_or(Source::Bundled, |d| Source::Dir(d.to_path_buf())),
    }
}

fn has_datasets(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.path().join("manifest.json").is_file())
    })
}

/// The cache directory of unpacked copies: `$XDG_CACHE_HOME/reprobench`, `~/.cache/reprobench`.
fn cache_root() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("reprobench")
}

/// The built-in datasets' files: (path under `datasets/`, contents).
pub fn files() -> &'static [(&'static str, &'static [u8])] {
    files::FILES
}

/// Unpacks the built-in datasets (once per content) and returns their directory.
pub fn unpack() -> std::io::Result<PathBuf> {
    let dir = cache_root().join(format!("datasets-{}", files::HASH));
    if dir.join(".reprobench-complete").is_file() {
        return Ok(dir);
    }
    let tmp = dir.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    for (rel, bytes) in files::FILES {
        let p = tmp.join(rel);
        std::fs::create_dir_all(p.parent().expect("a file has a parent"))?;
        std::fs::write(&p, bytes)?;
    }
    std::fs::write(tmp.join(".reprobench-complete"), b"")?;
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        // Another process unpacked the same content first.
        Err(_) if dir.join(".reprobench-complete").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => Err(e),
    }
}

/// Makes `REPROBENCH_DATASETS` name the datasets this process (and the node processes it starts)
/// use. Call before any thread starts.
pub fn settle_datasets_dir() {
    let env = std::env::var("REPROBENCH_DATASETS").ok();
    let cwd = Path::new("datasets");
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets");
    let source = choose(
        env.as_deref(),
        has_datasets(cwd).then_some(cwd),
        has_datasets(&checkout).then_some(checkout.as_path()),
    );
    let dir = match source {
        Source::Dir(d) => d,
        Source::Bundled => match unpack() {
            Ok(d) => d,
            Err(e) => {
                eprintln!(
                    "warning: cannot unpack the built-in datasets into {}: {e}; pass --datasets DIR or set REPROBENCH_DATASETS",
                    cache_root().display()
                );
                return;
            }
        },
    };
    let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    // SAFETY: called from main before the runtime or any other thread starts.
    unsafe { std::env::set_var("REPROBENCH_DATASETS", dir) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_then_the_working_directory_then_the_checkout_then_the_built_in_copy() {
        let (cwd, co) = (Path::new("datasets"), Path::new("/src/datasets"));
        assert_eq!(
            choose(Some("bundled"), Some(cwd), Some(co)),
            Source::Bundled
        );
        assert_eq!(
            choose(Some("/d"), Some(cwd), Some(co)),
            Source::Dir("/d".into())
        );
        assert_eq!(choose(None, Some(cwd), Some(co)), Source::Dir(cwd.into()));
        assert_eq!(choose(Some(""), None, Some(co)), Source::Dir(co.into()));
        assert_eq!(choose(None, None, None), Source::Bundled);
    }

    #[test]
    fn the_built_in_copy_holds_the_small_datasets_and_no_mirrors() {
        let names: Vec<&str> = files::FILES.iter().map(|(n, _)| *n).collect();
        for want in [
            "swt-mini/manifest.json",
            "android-sim/manifest.json",
            "swt-bench/env-specs.json",
            "swt-lite/manifest.json",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        assert!(!names.iter().any(|n| n.starts_with("repos/")));
    }
}
