//! The Parquet row loader (`swt::load_rows` on a `.parquet` file, with the `parquet` feature):
//! the input's bytes are written to a file it then loads as instance and prediction rows.
//! Errors are fine; asserts nothing but "no panic, no hang, bounded memory".
//!
//! The loader catches the panics of the parquet crate on malformed files (its footer decoder
//! has `unwrap`s) and reports them as errors, so this target sets a hook that only prints
//! in place of libfuzzer-sys's, which aborts on every panic, caught or not. A panic that gets
//! out of the loader still aborts: libfuzzer-sys aborts when the target unwinds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reprobench_domain::swt::{Prediction, SwtInstance, load_rows};
use std::path::PathBuf;
use std::sync::OnceLock;

/// One file per fuzzing process, in memory where the machine has /dev/shm.
fn path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        dir.join(format!("reprobench-fuzz-{}.parquet", std::process::id()))
    })
}

fuzz_target!(
    init: {
        std::panic::set_hook(Box::new(|info| eprintln!("{info}")));
    },
    |data: &[u8]| {
        let path = path();
        std::fs::write(path, data).expect("write the fuzz input");
        let _ = load_rows::<SwtInstance>(path);
        let _ = load_rows::<Prediction>(path);
    }
);
