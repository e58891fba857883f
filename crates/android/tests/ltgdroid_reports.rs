//! The 75 real bug reports of the LTGDroid replication package, joined with the android-ltg75
//! manifest, go through ltgdroid's Report Analyzer prompt (and the `no-ra` objective) without
//! error. Skipped, with a message, when `../shared/data` is absent.

use reprobench_android::agent::report_text;
use reprobench_android::ltgdroid::prompts::{self, Stage};
use reprobench_domain::android::load_android_dataset;
use std::path::Path;

#[test]
fn the_75_real_reports_build_the_report_analyzer_prompt() {
    let shared =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/ltgdroid-reports");
    if !shared.is_dir() {
        assert!(
            std::env::var("REPROBENCH_REQUIRE_SHARED").as_deref() != Ok("1"),
            "REPROBENCH_REQUIRE_SHARED=1 but ../shared is absent"
        );
        eprintln!("skipping: {} is absent", shared.display());
        return;
    }
    let datasets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets");
    let ds = load_android_dataset("android-ltg75", &datasets, Some(&shared)).unwrap();
    assert!(ds.errors.is_empty(), "{:?}", ds.errors);
    assert!(ds.missing_reports.is_empty(), "{:?}", ds.missing_reports);
    let mut built = 0;
    for inst in &ds.instances {
        let report = inst.report.as_ref().expect("joined");
        let text = report_text(report);
        let (system, user) = prompts::analyze(&text);
        assert_eq!(Stage::of_system_prompt(&system), Some(Stage::Analyze));
        assert!(user.starts_with("## Bug report\n"), "{}", inst.instance_id);
        assert!(user.contains(report.title.trim()), "{}", inst.instance_id);
        for c in &report.comments {
            assert!(
                user.contains(c.trim()),
                "{}: a comment is missing",
                inst.instance_id
            );
        }
        assert!(prompts::raw_objective(&text).contains(report.body.trim()));
        built += 1;
    }
    assert_eq!(built, 75);
}
