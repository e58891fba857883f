//! The sim device through the public API only, as the Android harness will use it.

use reprobench_agent_node::android::device::Device;
use reprobench_agent_node::android::sim::{
    Dataset, SimDevice, SimLatency, replay, source_dataset_dir,
};
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
