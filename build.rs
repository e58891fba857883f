//! Embeds the small datasets that ship with the checkout (`datasets/`, without mirrors and
//! fetched rows), so an installed binary runs `quickstart` and `eval --dataset swt-mini` from
//! any directory: `src/bundled.rs` unpacks them on first use.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Built or downloaded into `datasets/`, never shipped (see datasets/.gitignore).
fn skipped(rel: &str) -> bool {
    rel.starts_with("repos/")
        || rel.ends_with("/instances.jsonl")
            && (rel.starts_with("swt-lite/") || rel.starts_with("swt-verified/"))
        || rel.ends_with("/env.json")
            && (rel.starts_with("swt-lite/") || rel.starts_with("swt-verified/"))
        || rel.starts_with("android-ltg75/reports/")
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let rel = p
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if p.is_dir() {
            if !skipped(&format!("{rel}/")) {
                walk(root, &p, out);
            }
        } else if !skipped(&rel) && std::fs::metadata(&p).is_ok_and(|m| m.len() < 4 << 20) {
            out.push((rel, p));
        }
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets");
    let mut files = Vec::new();
    walk(&root, &root, &mut files);
    let mut code = String::from(
        "/// The datasets shipped with this build: (path under datasets/, contents).\npub static FILES: &[(&str, &[u8])] = &[\n",
    );
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (rel, path) in &files {
        println!("cargo:rerun-if-changed={}", path.display());
        let bytes = std::fs::read(path).unwrap();
        for b in rel.bytes().chain(bytes.iter().copied()) {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        writeln!(
            code,
            "    ({rel:?}, include_bytes!({:?})),",
            path.display().to_string()
        )
        .unwrap();
    }
    code.push_str("];\n");
    writeln!(code, "/// A content hash of [`FILES`], naming the directory they are unpacked to.\npub const HASH: &str = \"{hash:016x}\";").unwrap();
    println!("cargo:rerun-if-changed={}", root.display());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("bundled_datasets.rs");
    std::fs::write(out, code).unwrap();
}
