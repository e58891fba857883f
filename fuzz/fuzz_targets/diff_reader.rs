//! The diff reader: every function that reads a unified diff (test patches, predictions' model
//! patches, golden patches for coverage). Asserts nothing but "no panic, no hang, bounded memory".
#![no_main]

use libfuzzer_sys::fuzz_target;
use reprobench_swt::grading::coverage;
use reprobench_swt::patch;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let files = patch::diff_files(&text);
    let _ = patch::validate(Some(&text));
    for style in ["paths", "modules", reprobench_domain::swt_bench::SWT_BENCH_DIRECTIVES] {
        let _ = patch::test_directives(&files, style);
    }
    let _ = patch::swt_bench_model_patch(&text);
    let _ = patch::swt_bench_directives(&text, "django/django");
    let _ = patch::swt_bench_directives(&text, "psf/requests");
    let _ = coverage::changed_files(&text);
    let _ = coverage::changed_lines(&text);
});
