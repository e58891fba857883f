use super::model::{Cond, Op, Value, Vars, expand, holds};
use super::*;
use crate::device::{Direction, Key, WidgetRef};

fn dataset() -> Dataset {
    Dataset::load(&source_dataset_dir()).expect("dataset loads")
}

fn device(ds: &Dataset, app: &str) -> SimDevice {
    SimDevice::new(ds.apps[app].clone(), SimLatency::ZERO)
}

fn by_id(package: &str, id: &str) -> WidgetRef {
    WidgetRef {
        resource_id: format!("{package}:id/{id}"),
        ..WidgetRef::default()
    }
}

#[test]
fn dataset_has_six_apps_and_twelve_reports_with_required_coverage() {
    let ds = dataset();
    assert_eq!(ds.manifest.name, "android-sim");
    assert_eq!(ds.manifest.track, "android");
    assert!(ds.apps.len() >= 6);
    assert!(ds.reports.len() >= 12);
    let all: Vec<&Action> = ds.reports.values().flat_map(|r| &r.ground_truth).collect();
    assert!(ds.reports.values().any(|r| r.ground_truth.len() > 10));
    assert!(all.iter().any(|a| matches!(a, Action::InputText { .. })));
    assert!(all.iter().any(|a| matches!(a, Action::LongClick { .. })));
    assert!(all.iter().any(|a| matches!(a, Action::Swipe { .. })));
    assert!(all.iter().any(|a| matches!(a, Action::Rotate)));
    for (id, r) in &ds.reports {
        match r.kind {
            BugKind::Crash => assert!(r.exception.is_some(), "{id} lacks exception"),
            BugKind::NonCrash => assert!(r.symptom.is_some(), "{id} lacks symptom"),
        }
        assert!(!r.near_miss.is_empty(), "{id} lacks a near miss");
        let (dev, pkg) = ds.device_for(id, SimLatency::ZERO).expect("device");
        assert_eq!(dev.model().package, pkg);
        assert_eq!(r.apk_name, format!("{}.apk", ds.apps[&r.app].package));
    }
}

#[tokio::test]
async fn every_ground_truth_reproduces_and_near_misses_and_short_traces_do_not() {
    let ds = dataset();
    for (id, r) in &ds.reports {
        let pkg = ds.apps[&r.app].package.clone();
        let dev = device(&ds, &r.app);
        let (h, crash) = replay(&dev, &pkg, &r.ground_truth).await.expect(id);
        assert!(
            r.reproduced(&h, crash.as_ref()),
            "{id}: ground truth does not reproduce"
        );
        if r.kind == BugKind::Crash {
            let c = crash.expect("crash");
            assert_eq!(c.process, pkg);
            assert!(
                c.frames.iter().any(|f| f.starts_with("com.example.")),
                "{id}: frames"
            );
            assert_eq!(
                dev.current_activity().await.unwrap(),
                device::LAUNCHER_ACTIVITY
            );
        }
        let dev = device(&ds, &r.app);
        let (h, crash) = replay(&dev, &pkg, &r.near_miss).await.expect(id);
        assert!(
            !r.reproduced(&h, crash.as_ref()),
            "{id}: near miss reproduces"
        );
        assert!(crash.is_none(), "{id}: near miss crashes");
        let short = &r.ground_truth[..r.ground_truth.len() - 1];
        let dev = device(&ds, &r.app);
        let (h, crash) = replay(&dev, &pkg, short).await.expect(id);
        assert!(
            !r.reproduced(&h, crash.as_ref()),
            "{id}: shortened trace reproduces"
        );
    }
}

#[tokio::test]
async fn snapshots_round_trip_and_clear_the_crash_record() {
    let ds = dataset();
    let dev = device(&ds, "quicknotes");
    let pkg = "com.example.quicknotes";
    dev.launch(pkg).await.unwrap();
    dev.save_snapshot("start").await.unwrap();
    let before = dev.hierarchy().await.unwrap();
    let r = &ds.reports["quicknotes-01"];
    for a in &r.ground_truth {
        dev.act(a).await.unwrap();
    }
    assert!(dev.crash().await.unwrap().is_some());
    assert_ne!(dev.hierarchy().await.unwrap(), before);
    dev.load_snapshot("start").await.unwrap();
    assert_eq!(dev.hierarchy().await.unwrap(), before);
    assert_eq!(dev.crash().await.unwrap(), None);
    assert_eq!(
        dev.current_activity().await.unwrap(),
        "com.example.quicknotes/.ui.NotesListActivity"
    );
    assert!(matches!(
        dev.load_snapshot("nope").await,
        Err(DeviceError::Rejected(_))
    ));
}

#[tokio::test]
async fn keys_back_stack_home_and_relaunch() {
    let ds = dataset();
    let dev = device(&ds, "skycast");
    let pkg = "com.example.skycast";
    assert_eq!(dev.backend(), "sim");
    assert_eq!(dev.name(), "sim:com.example.skycast");
    assert_eq!(
        dev.current_activity().await.unwrap(),
        device::LAUNCHER_ACTIVITY
    );
    dev.launch(pkg).await.unwrap();
    let open = Action::Click {
        target: by_id(pkg, "open_settings"),
    };
    dev.act(&open).await.unwrap();
    assert_eq!(
        dev.current_activity().await.unwrap(),
        "com.example.skycast/.SettingsActivity"
    );
    dev.act(&Action::Press { key: Key::Home }).await.unwrap();
    assert_eq!(
        dev.current_activity().await.unwrap(),
        device::LAUNCHER_ACTIVITY
    );
    // Tapping the icon resumes where the user was.
    let icon = WidgetRef {
        text: "SkyCast".into(),
        ..WidgetRef::default()
    };
    dev.act(&Action::Click { target: icon }).await.unwrap();
    assert_eq!(
        dev.current_activity().await.unwrap(),
        "com.example.skycast/.SettingsActivity"
    );
    dev.act(&Action::Press { key: Key::Back }).await.unwrap();
    dev.act(&Action::Press { key: Key::Back }).await.unwrap();
    assert_eq!(
        dev.current_activity().await.unwrap(),
        device::LAUNCHER_ACTIVITY
    );
    // A widget that is not on screen is rejected.
    assert!(matches!(
        dev.act(&open).await,
        Err(DeviceError::Rejected(_))
    ));
    assert!(dev.launch("com.other").await.is_err());
    assert!(dev.install(Path::new("/tmp/com.other.apk")).await.is_err());
    dev.install(Path::new("/tmp/com.example.skycast.apk"))
        .await
        .unwrap();
}

#[tokio::test]
async fn swipe_scrolls_lists_and_input_binds_text() {
    let ds = dataset();
    let dev = device(&ds, "shoplist");
    let pkg = "com.example.shoplist";
    dev.launch(pkg).await.unwrap();
    let texts = |h: &Hierarchy| -> Vec<String> {
        h.widgets()
            .iter()
            .filter(|w| w.resource_id.ends_with("item_name"))
            .map(|w| w.text.clone())
            .collect()
    };
    let first = texts(&dev.hierarchy().await.unwrap());
    assert_eq!(first.first().map(String::as_str), Some("Apples"));
    dev.act(&Action::Swipe {
        direction: Direction::Up,
        target: None,
    })
    .await
    .unwrap();
    let second = texts(&dev.hierarchy().await.unwrap());
    assert_ne!(first, second);
    dev.act(&Action::Swipe {
        direction: Direction::Down,
        target: None,
    })
    .await
    .unwrap();
    assert_eq!(texts(&dev.hierarchy().await.unwrap()), first);
    let search = Action::InputText {
        target: by_id(pkg, "search"),
        text: "eggs".into(),
    };
    dev.act(&search).await.unwrap();
    let h = dev.hierarchy().await.unwrap();
    assert!(
        h.widgets()
            .iter()
            .any(|w| w.resource_id.ends_with("/search") && w.text == "eggs")
    );
}

#[tokio::test]
async fn screenshots_are_valid_deterministic_pngs() {
    let ds = dataset();
    let dev = device(&ds, "pocketbudget");
    dev.launch("com.example.pocketbudget").await.unwrap();
    let a = dev.screenshot().await.unwrap();
    let b = dev.screenshot().await.unwrap();
    assert_eq!(a, b);
    assert_eq!(&a[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&a[12..16], b"IHDR");
    assert_eq!(u32::from_be_bytes(a[16..20].try_into().unwrap()), 270);
    assert_eq!(u32::from_be_bytes(a[20..24].try_into().unwrap()), 480);
    assert_eq!(&a[a.len() - 8..a.len() - 4], b"IEND");
    // The IHDR CRC covers type and data.
    let crc = u32::from_be_bytes(a[29..33].try_into().unwrap());
    assert_eq!(crc, render::crc32(&a[12..29]));
    dev.act(&Action::Rotate).await.unwrap();
    let c = dev.screenshot().await.unwrap();
    assert_eq!(u32::from_be_bytes(c[16..20].try_into().unwrap()), 480);
}

#[test]
fn guards_and_templates() {
    let mut vars = Vars::new();
    vars.insert("n".into(), Value::Int(3));
    vars.insert("l".into(), Value::List(vec![]));
    vars.insert("s".into(), Value::Str("12,50".into()));
    let c = |var: &str, op, value| Cond {
        var: var.into(),
        op,
        value,
    };
    assert!(holds(
        &[c("n", Op::Gt, Some(Value::Int(2))), c("l", Op::Empty, None)],
        &vars
    ));
    assert!(!holds(&[c("missing", Op::Empty, None)], &vars));
    assert!(holds(
        &[c("s", Op::Contains, Some(Value::Str(",".into())))],
        &vars
    ));
    assert!(holds(
        &[c("s", Op::Matches, Some(Value::Str("^[0-9]+,".into())))],
        &vars
    ));
    assert_eq!(
        expand("{n} of {#l} {$text} {x}", &vars, "hi"),
        "3 of 0 hi {x}"
    );
}

#[test]
fn validation_names_unknown_screens_and_variables() {
    let ds = dataset();
    let mut m = ds.apps["skycast"].clone();
    m.transitions[0].effects.push(model::Effect::Go {
        screen: "nowhere".into(),
    });
    let err = m.validate().unwrap_err().to_string();
    assert!(err.contains("unknown screen `nowhere`"), "{err}");
    let mut m = ds.apps["skycast"].clone();
    m.screens[0].reset_on_rotate.push("ghost".into());
    let err = m.validate().unwrap_err().to_string();
    assert!(err.contains("unknown variable `ghost`"), "{err}");
}

#[test]
fn latency_defaults_follow_anchors_and_scale() {
    let d = SimLatency::default();
    assert_eq!(d.snapshot_load_ms, 650);
    assert_eq!(d.scaled(0.5).action_ms, d.action_ms / 2);
    assert_eq!(d.scaled(0.0), SimLatency::ZERO);
}

#[tokio::test(start_paused = true)]
async fn latency_is_slept_on_the_tokio_clock() {
    let ds = dataset();
    let lat = SimLatency {
        action_ms: 2000,
        snapshot_save_ms: 6000,
        snapshot_load_ms: 650,
        launch_ms: 1500,
    };
    let dev = SimDevice::new(ds.apps["skycast"].clone(), lat);
    let t0 = tokio::time::Instant::now();
    dev.launch("com.example.skycast").await.unwrap();
    assert_eq!(t0.elapsed().as_millis(), 1500);
    dev.act(&Action::Rotate).await.unwrap();
    assert_eq!(t0.elapsed().as_millis(), 3500);
    dev.save_snapshot("a").await.unwrap();
    dev.load_snapshot("a").await.unwrap();
    assert_eq!(t0.elapsed().as_millis(), 3500 + 6000 + 650);
}

#[tokio::test]
async fn coordinates_only_refs_hit_the_deepest_widget_and_landscape_moves_bounds() {
    let ds = dataset();
    let dev = device(&ds, "skycast");
    let pkg = "com.example.skycast";
    dev.launch(pkg).await.unwrap();
    let h = dev.hierarchy().await.unwrap();
    let gear = h
        .widgets()
        .into_iter()
        .find(|w| w.content_desc == "Settings")
        .unwrap()
        .bounds;
    let tap = WidgetRef {
        bounds: gear,
        ..WidgetRef::default()
    };
    dev.act(&Action::Click { target: tap }).await.unwrap();
    assert_eq!(
        dev.current_activity().await.unwrap(),
        "com.example.skycast/.SettingsActivity"
    );
    dev.act(&Action::Rotate).await.unwrap();
    let h = dev.hierarchy().await.unwrap();
    let root = h.roots[0].bounds;
    assert_eq!((root.right, root.bottom), (1920, 1080));
    assert!(
        h.widgets()
            .iter()
            .all(|w| w.bounds.right <= 1920 && w.bounds.bottom <= 1080)
    );
}

#[test]
fn rendering_depends_on_text_and_encodes_any_size() {
    use crate::device::{Bounds, Widget};
    let tree = |text: &str| Hierarchy {
        roots: vec![Widget {
            class: "android.widget.TextView".into(),
            text: text.into(),
            bounds: Bounds {
                left: 0,
                top: 0,
                right: 400,
                bottom: 200,
            },
            ..Widget::default()
        }],
    };
    assert_eq!(
        render::render(&tree("Balance: 12")),
        render::render(&tree("Balance: 12"))
    );
    assert_ne!(
        render::render(&tree("Balance: 12")),
        render::render(&tree("Balance: 13"))
    );
    // More than one stored deflate block (rows of 301 bytes * 300 > 65535).
    let png = render::encode_png(100, 300, &vec![7; 100 * 300 * 3]);
    assert_eq!(&png[png.len() - 8..png.len() - 4], b"IEND");
}

#[tokio::test]
async fn typing_focuses_a_field_and_delete_removes_a_character() {
    let ds = dataset();
    let dev = device(&ds, "skycast");
    let pkg = "com.example.skycast";
    dev.launch(pkg).await.unwrap();
    let field = by_id(pkg, "search_city");
    dev.act(&Action::InputText {
        target: field.clone(),
        text: "Parisx".into(),
    })
    .await
    .unwrap();
    dev.act(&Action::Press { key: Key::Delete }).await.unwrap();
    let h = dev.hierarchy().await.unwrap();
    let w = h
        .widgets()
        .into_iter()
        .find(|w| w.resource_id == field.resource_id)
        .unwrap()
        .clone();
    assert!(w.focused);
    assert_eq!(w.text, "Paris");
    dev.act(&Action::Press { key: Key::Enter }).await.unwrap();
    let h = dev.hierarchy().await.unwrap();
    assert!(
        h.widgets()
            .iter()
            .any(|w| w.resource_id.ends_with("/city_name") && w.text == "Paris")
    );
}
