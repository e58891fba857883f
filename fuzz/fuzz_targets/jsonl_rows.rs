//! The JSON/JSONL row loaders: SWT-bench instance rows, predictions, android rows and reports,
//! and the coverage tracer's JSON lines. Errors are fine; asserts nothing but "no panic, no hang,
//! bounded memory".
#![no_main]

use libfuzzer_sys::fuzz_target;
use reprobench_domain::android::{AndroidInstance, AndroidRow, parse_android_report};
use reprobench_domain::swt::{Parsed, Prediction, SwtInstance, parse_rows};
use reprobench_swt::grading::coverage;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _: Parsed<SwtInstance> = parse_rows("fuzz.jsonl", &text);
    let _: Parsed<Prediction> = parse_rows("fuzz.jsonl", &text);
    let _: Parsed<AndroidInstance> = parse_rows("fuzz.jsonl", &text);
    let _: Parsed<AndroidRow> = parse_rows("fuzz.jsonl", &text);
    let _ = parse_android_report("fuzz.json", &text);
    let _ = coverage::from_tracer_lines(&text);
    let _ = coverage::from_swt_bench_log(&text);
});
