//! The sim device through the public API only, as the Android harness will use it.

use reprobench_android::device::Device;
use reprobench_android::sim::{Dataset, SimDevice, SimLatency, replay, source_dataset_dir};
use std::sync::Arc;

#[tokio::test]
async fn all_reports_reproduce_through_a_dyn_device() {
    let ds = Dataset::load(&source_dataset_dir()).expect("android-sim loads");
    let mut crashes = 0;
    for (id, report) in &ds.reports {
        let model = ds.apps[&report.app].clone();
        let package = model.package.clone();
        let dev: Arc<dyn Device> =
            Arc::new(SimDevice::new(model, SimLatency::default().scaled(0.0)));
        assert_eq!(dev.backend(), "sim");
        dev.clear(&package).await.unwrap();
        let (hierarchy, crash) = replay(dev.as_ref(), &package, &report.ground_truth)
            .await
            .unwrap();
        assert!(report.reproduced(&hierarchy, crash.as_ref()), "{id}");
        crashes += usize::from(crash.is_some());
        let png = dev.screenshot().await.unwrap();
        assert_eq!(&png[1..4], b"PNG");
    }
    assert_eq!(crashes, 6);
}

/// `monkey` with fixed seeds: random actions find some crash bugs, and never a non-crash bug
/// (it has no verifier and no intent; its "reproduced" means the crash oracle fired with the
/// report's exception).
#[tokio::test]
async fn monkey_with_fixed_seeds_reproduces_some_crashes_and_no_non_crash_bug() {
    use reprobench_android::explore::monkey;
    use reprobench_android::sim::BugKind;
    let ds = Dataset::load(&source_dataset_dir()).expect("android-sim loads");
    let mut crash_hits = 0;
    for (id, report) in &ds.reports {
        let model = ds.apps[&report.app].clone();
        let package = model.package.clone();
        let mut hit = false;
        for seed in 0..5 {
            let dev = SimDevice::new(model.clone(), SimLatency::ZERO);
            dev.clear(&package).await.unwrap();
            let out = monkey(&dev, &package, seed, 100).await.unwrap();
            assert!(out.trace.len() <= 100, "{id}");
            let crash_matches = match (&report.exception, &out.crash) {
                (Some(want), Some(c)) => &c.exception == want,
                _ => false,
            };
            if report.kind == BugKind::NonCrash {
                assert!(out.crash.is_none() || !crash_matches, "{id}");
            }
            hit |= crash_matches;
        }
        crash_hits += usize::from(hit);
    }
    assert!(
        crash_hits >= 1,
        "monkey found no crash at all in 5 seeds × 6 crash reports"
    );
    assert!(
        crash_hits < 6,
        "monkey found every crash: the sim's crash bugs are too shallow"
    );
}
