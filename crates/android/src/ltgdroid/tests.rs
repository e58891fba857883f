use super::guided::{GuidedShape, answer, responder};
use super::prompts::Stage;
use super::*;
use crate::agent::{ScriptedLlm, message_text};
use crate::device::reported_exceptions;
use crate::sim::{BugKind, Dataset, SimDevice, SimLatency, SimReport, replay, source_dataset_dir};
use std::sync::Arc;
use std::time::Duration;

fn dataset() -> Dataset {
    Dataset::load(&source_dataset_dir()).expect("the android-sim suite loads")
}

fn bug_type(r: &SimReport) -> BugType {
    match r.kind {
        BugKind::Crash => BugType::Crash,
        BugKind::NonCrash => BugType::NonCrash,
    }
}

/// Requests seen by a scripted client, by stage, with the user text.
type Seen = Arc<Mutex<Vec<(Option<Stage>, String)>>>;

/// A guided scripted client that also records each request's stage and user text.
fn recording(gold: Vec<Action>) -> (ScriptedLlm, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let llm = ScriptedLlm::new(move |messages| {
        let system = message_text(&messages[0]);
        log.lock()
            .unwrap()
            .push((Stage::of_system_prompt(&system), message_text(&messages[1])));
        Ok(answer(messages, &gold, GuidedShape::default()))
    });
    (llm, seen)
}

fn count(seen: &Seen, stage: Stage) -> usize {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(s, _)| *s == Some(stage))
        .count()
}

/// Runs ltgdroid on report `id` with `replicas` sim devices and returns the run and whether
/// its trace reproduces the bug on a fresh device.
async fn run_on(
    ds: &Dataset,
    id: &str,
    variant: &str,
    replicas: usize,
    llm: &ScriptedLlm,
    meter: &Meter,
) -> (AndroidRun, bool) {
    let report = &ds.reports[id];
    let (first, package) = ds.device_for(id, SimLatency::ZERO).unwrap();
    let others: Vec<SimDevice> = (1..replicas).map(|_| first.replica()).collect();
    let mut devices: Vec<&dyn Device> = vec![&first];
    devices.extend(others.iter().map(|d| d as &dyn Device));
    let cfg = Config::paper(Variant::parse(variant).unwrap(), bug_type(report));
    let run = super::run(
        llm,
        &devices,
        &package,
        &report.android_report(),
        cfg,
        meter,
    )
    .await
    .unwrap();
    let (fresh, _) = ds.device_for(id, SimLatency::ZERO).unwrap();
    let (screen, crash) = replay(&fresh, &package, &run.trace).await.unwrap();
    let reproduced = report.reproduced(&screen, crash.as_ref());
    (run, reproduced)
}

fn meter() -> Meter {
    Meter::new(100, Duration::from_secs(3600))
}

#[tokio::test]
async fn guided_full_ltgdroid_reproduces_every_sim_report_the_same_with_one_or_four_replicas() {
    let ds = dataset();
    for (id, report) in &ds.reports {
        let mut traces = Vec::new();
        for replicas in [1, 4] {
            let llm = ScriptedLlm::new(responder(
                report.ground_truth.clone(),
                GuidedShape::default(),
            ));
            let m = meter();
            let (run, reproduced) = run_on(&ds, id, "full", replicas, &llm, &m).await;
            assert!(
                run.claimed && reproduced,
                "{id} with {replicas} replicas: {run:?}"
            );
            // A reported crash among the pre-assessed candidates ends the search there:
            // skycast-11's Enter on the empty search field crashes the app at the first level.
            let expected = if id == "skycast-11" {
                1
            } else {
                report.ground_truth.len()
            };
            assert_eq!(run.trace.len(), expected, "{id}");
            assert!(run.actions_executed <= 100 && run.actions_executed >= run.trace.len());
            traces.push((run.trace, run.actions_executed));
        }
        assert_eq!(traces[0], traces[1], "{id}: K changes the search");
    }
}

#[tokio::test]
async fn a_twelve_step_bug_is_reproduced_with_summaries_and_verification() {
    let ds = dataset();
    let id = "pocketbudget-10";
    let gold = ds.reports[id].ground_truth.clone();
    assert!(gold.len() > 10);
    let (llm, seen) = recording(gold);
    let (run, reproduced) = run_on(&ds, id, "full", 4, &llm, &meter()).await;
    assert!(run.claimed && reproduced);
    assert_eq!(count(&seen, Stage::Analyze), 1);
    assert!(count(&seen, Stage::Filter) >= 11);
    // One summary per executed action, one verification (non-crash) for the claimed path.
    assert_eq!(count(&seen, Stage::Summarize), run.actions_executed);
    assert_eq!(count(&seen, Stage::Verify), 1);
    assert!(count(&seen, Stage::Input) >= 3);
    // The specification, not the raw report, is the objective.
    let filters: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(s, _)| *s == Some(Stage::Filter))
        .map(|(_, u)| u.clone())
        .collect();
    assert!(filters[0].contains("Steps to reproduce:"));
    assert!(!filters[0].contains(&ds.reports[id].body));
}

#[tokio::test]
async fn no_ra_uses_the_raw_report() {
    let ds = dataset();
    let id = "tipsplit-03";
    let (llm, seen) = recording(ds.reports[id].ground_truth.clone());
    let (run, reproduced) = run_on(&ds, id, "no-ra", 1, &llm, &meter()).await;
    assert!(run.claimed && reproduced);
    assert_eq!(count(&seen, Stage::Analyze), 0);
    let first = seen.lock().unwrap()[0].1.clone();
    assert!(first.contains(&ds.reports[id].body), "{first}");
}

#[tokio::test]
async fn no_ae_runs_no_pre_assessment() {
    let ds = dataset();
    let id = "habitflow-07";
    let (llm, seen) = recording(ds.reports[id].ground_truth.clone());
    let (run, reproduced) = run_on(&ds, id, "no-ae", 4, &llm, &meter()).await;
    assert!(run.claimed && reproduced, "{run:?}");
    assert_eq!(count(&seen, Stage::Filter), 0);
    assert!(count(&seen, Stage::Choose) >= 1);
    // One chosen action per level: nothing is explored beside the path.
    assert_eq!(run.actions_executed, run.trace.len());
}

/// `no-ae` whose first choice is unreadable goes on from the first k candidates, as `full` does
/// when its filter answer is unreadable, instead of ending the run there.
#[tokio::test]
async fn no_ae_falls_back_to_the_first_candidates_on_an_unreadable_choice() {
    let ds = dataset();
    let id = "habitflow-07";
    let gold = ds.reports[id].ground_truth.clone();
    let unreadable_left = Arc::new(Mutex::new(1));
    let chooses = Arc::new(Mutex::new(0));
    let (left, seen_chooses) = (unreadable_left.clone(), chooses.clone());
    let llm = ScriptedLlm::new(move |messages| {
        let system = message_text(&messages[0]);
        if Stage::of_system_prompt(&system) == Some(Stage::Choose) {
            *seen_chooses.lock().unwrap() += 1;
            let mut left = left.lock().unwrap();
            if *left > 0 {
                *left -= 1;
                return Ok("I cannot tell which element to use here.".into());
            }
        }
        Ok(answer(messages, &gold, GuidedShape::default()))
    });
    let (run, _) = run_on(&ds, id, "no-ae", 4, &llm, &meter()).await;
    assert_eq!(*unreadable_left.lock().unwrap(), 0);
    assert!(run.actions_executed >= 1, "{run:?}");
    assert!(
        *chooses.lock().unwrap() >= 2,
        "the run ended at the unreadable choice"
    );
}

#[tokio::test]
async fn no_ta_passes_no_transition_summaries() {
    let ds = dataset();
    let id = "quicknotes-02";
    let (llm, seen) = recording(ds.reports[id].ground_truth.clone());
    let (run, reproduced) = run_on(&ds, id, "no-ta", 1, &llm, &meter()).await;
    assert!(run.claimed && reproduced, "{run:?}");
    assert_eq!(count(&seen, Stage::Summarize), 0);
    for (stage, user) in seen.lock().unwrap().iter() {
        if *stage == Some(Stage::Evaluate) {
            assert!(!user.contains(" => "), "{user}");
        }
    }
}

/// An evaluator that calls the first path complete at once; other stages are guided.
fn hasty(gold: Vec<Action>) -> (ScriptedLlm, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let llm = ScriptedLlm::new(move |messages| {
        let stage = Stage::of_system_prompt(&message_text(&messages[0]));
        log.lock()
            .unwrap()
            .push((stage, message_text(&messages[1])));
        Ok(match stage {
            Some(Stage::Evaluate) => "{\"complete\": 0, \"keep\": [0, 1, 2]}".to_string(),
            _ => answer(messages, &gold, GuidedShape::default()),
        })
    });
    (llm, seen)
}

#[tokio::test]
async fn no_bv_takes_the_evaluator_at_its_word_and_full_does_not() {
    let ds = dataset();
    for id in ["habitflow-07", "habitflow-08"] {
        let gold = ds.reports[id].ground_truth.clone();
        let (llm, seen) = hasty(gold.clone());
        let (run, reproduced) = run_on(&ds, id, "no-bv", 1, &llm, &meter()).await;
        assert!(run.claimed && !reproduced, "{id}: premature claim expected");
        assert_eq!(run.trace.len(), 1);
        assert_eq!(count(&seen, Stage::Verify), 0);
        let (llm, seen) = hasty(gold);
        let m = Meter::new(20, Duration::from_secs(3600));
        let (run, _) = run_on(&ds, id, "full", 1, &llm, &m).await;
        assert!(
            run.trace.len() > 1 || !run.claimed,
            "{id}: verification rejected nothing"
        );
        if ds.reports[id].kind == BugKind::NonCrash {
            assert!(count(&seen, Stage::Verify) >= 1);
        }
    }
}

#[tokio::test]
async fn budgets_stop_runs() {
    let ds = dataset();
    let id = "pocketbudget-09";
    let gold = ds.reports[id].ground_truth.clone();
    let llm = ScriptedLlm::new(responder(gold.clone(), GuidedShape::default()));
    let m = Meter::new(5, Duration::from_secs(3600));
    let (run, reproduced) = run_on(&ds, id, "full", 4, &llm, &m).await;
    assert_eq!(run.exhausted, Some(Exhausted::Actions));
    assert_eq!(run.actions_executed, 5);
    assert!(!run.claimed && !reproduced);

    let m = Meter::new(100, Duration::ZERO);
    let (run, _) = run_on(&ds, id, "full", 1, &llm, &m).await;
    assert_eq!(run.exhausted, Some(Exhausted::Time));
    assert_eq!(run.actions_executed, 0);

    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let llm = ScriptedLlm::new(move |messages| {
        if c.fetch_add(1, Ordering::SeqCst) >= 4 {
            return Err(LlmError::Budget("max_calls 4".into()));
        }
        Ok(answer(messages, &gold, GuidedShape::default()))
    });
    let (run, _) = run_on(&ds, id, "full", 1, &llm, &meter()).await;
    assert_eq!(run.exhausted, Some(Exhausted::Llm));
    assert!(!run.claimed);
}

/// (A non-crash report: on skycast-11 the first k candidates include the Enter key that crashes
/// the app, which the crash oracle confirms without the LLM.)
#[tokio::test]
async fn unreadable_answers_do_not_stop_the_search() {
    let ds = dataset();
    let llm = ScriptedLlm::new(|_| Ok("I am not sure.".to_string()));
    let m = Meter::new(30, Duration::from_secs(3600));
    let (run, _) = run_on(&ds, "skycast-12", "full", 2, &llm, &m).await;
    assert!(!run.claimed);
    assert_eq!(run.exhausted, Some(Exhausted::Actions));
}

#[test]
fn candidates_follow_ltgdroid_rules() {
    let ds = dataset();
    let model = ds.apps["skycast"].clone();
    let dev = SimDevice::new(model, SimLatency::ZERO);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let h = rt.block_on(async {
        dev.launch("com.example.skycast").await.unwrap();
        dev.hierarchy().await.unwrap()
    });
    let words: Vec<String> = candidate_actions(&h).iter().map(describe_action).collect();
    assert!(
        words
            .iter()
            .any(|w| w.starts_with("input \"test\" in <EditText resource-id=\"search_city\""))
    );
    assert!(
        words
            .iter()
            .any(|w| w.starts_with("click <EditText resource-id=\"search_city\""))
    );
    // The keys and screen-wide swipes of the paper's action categories, then rotation.
    assert!(words.ends_with(&[
        "press back".to_string(),
        "press enter".to_string(),
        "press delete".to_string(),
        "press home".to_string(),
        "swipe up on the screen".to_string(),
        "swipe down on the screen".to_string(),
        "swipe left on the screen".to_string(),
        "swipe right on the screen".to_string(),
        "rotate the screen".to_string()
    ]));
}

/// Actions in words (traces carry the bounds seen; ground truths do not).
fn words(trace: &[Action]) -> Vec<String> {
    trace.iter().map(describe_action).collect()
}

/// The log entries of one stage.
fn notes<'a>(run: &'a AndroidRun, stage: &str) -> Vec<&'a Value> {
    run.log.iter().filter(|v| v["stage"] == stage).collect()
}

#[test]
fn only_the_reported_crash_of_a_crash_report_reproduces_it() {
    let crash = |exception: &str, message: &str| Crash {
        exception: exception.into(),
        message: message.into(),
        ..Crash::default()
    };
    let npe = crash("java.lang.NullPointerException", "");
    let wrapped = crash(
        "java.lang.RuntimeException",
        "caused by NullPointerException",
    );
    let other = crash("java.lang.IllegalStateException", "");
    let named: BTreeSet<String> = ["NullPointerException".to_string()].into();
    let cfg = |variant: &str, bug_type| Config::paper(Variant::parse(variant).unwrap(), bug_type);
    let full = cfg("full", BugType::Crash);
    assert!(crash_reproduces(&full, &npe, &named));
    assert!(crash_reproduces(&full, &wrapped, &named));
    assert!(!crash_reproduces(&full, &other, &named));
    // A report that names no exception: any crash of the app is the reported one.
    assert!(crash_reproduces(&full, &other, &BTreeSet::new()));
    // Without bug verification the crash is taken as it is; on a non-crash report no crash is
    // the bug.
    assert!(crash_reproduces(
        &cfg("no-bv", BugType::Crash),
        &other,
        &named
    ));
    for variant in VARIANTS {
        let cfg = cfg(variant, BugType::NonCrash);
        assert!(!crash_reproduces(&cfg, &npe, &BTreeSet::new()), "{variant}");
    }
}

/// The guided policy steered by a plan one step longer than the ground truth (a Back after the
/// last step): the evaluator never calls the crashed path complete, as the crash comes in the
/// middle of the path it expects.
fn longer_plan(gold: &[Action]) -> Vec<Action> {
    let mut plan = gold.to_vec();
    plan.push(Action::Press { key: Key::Back });
    plan
}

#[tokio::test]
async fn a_crash_before_the_evaluator_calls_the_path_complete_is_verified_and_kept() {
    let ds = dataset();
    let crash_reports = ds.reports.iter().filter(|(_, r)| r.kind == BugKind::Crash);
    for (id, report) in crash_reports {
        let (llm, seen) = recording(longer_plan(&report.ground_truth));
        let (run, reproduced) = run_on(&ds, id, "full", 2, &llm, &meter()).await;
        assert!(run.claimed && reproduced, "{id}: {run:?}");
        assert!(run.exhausted.is_none() && run.crash.is_some(), "{id}");
        // The crash oracle confirmed it: no evaluator named it, no LLM verified it.
        assert!(
            notes(&run, "evaluate")
                .iter()
                .all(|n| n["complete"].is_null())
        );
        assert_eq!(count(&seen, Stage::Verify), 0, "{id}");
        let crashes = notes(&run, "crash");
        let last = crashes.last().expect("a crash note");
        assert_eq!(last["confirmed"], true, "{id}");
        assert_eq!(last["path_len"], run.trace.len(), "{id}");
    }
}

/// skycast with a second crash, not the reported one: a long-click on the search field throws
/// an `IllegalStateException`; the report names the `StringIndexOutOfBoundsException` the
/// Enter key throws.
fn with_a_decoy_crash() -> Dataset {
    let mut ds = dataset();
    let decoy = serde_json::from_value(json!({
        "screen": "main", "on": "long_click", "target": "search_city",
        "exception": "java.lang.IllegalStateException", "message": "no suggestions yet",
        "frames": ["com.example.skycast.search.Suggestions.show(Suggestions.java:40)"],
    }))
    .expect("a crash trigger");
    let app = ds.apps.get_mut("skycast").expect("skycast");
    app.crashes.push(decoy);
    let mut report = ds.reports["skycast-11"].clone();
    report.title = "Keyboard search crashes with StringIndexOutOfBoundsException".into();
    ds.reports.insert("skycast-decoy".into(), report);
    ds
}

fn long_click_search(ds: &Dataset) -> Action {
    let gold = &ds.reports["skycast-11"].ground_truth;
    let Action::Click { target } = &gold[0] else {
        panic!("skycast-11 starts with a click on the search field");
    };
    Action::LongClick {
        target: target.clone(),
    }
}

#[tokio::test]
async fn a_crash_that_is_not_the_reported_one_is_not_a_reproduction() {
    let ds = with_a_decoy_crash();
    let id = "skycast-decoy";
    let decoy = vec![long_click_search(&ds)];
    // Grading: the decoy's crash is not the reported one.
    let (fresh, package) = ds.device_for(id, SimLatency::ZERO).unwrap();
    let (screen, crash) = replay(&fresh, &package, &decoy).await.unwrap();
    let crash = crash.expect("the decoy crashes the app");
    assert!(!ds.reports[id].reproduced(&screen, Some(&crash)));
    let reported = reported_exceptions(&ds.reports[id].android_report());
    assert!(!crash.is_reported(&reported));

    // A model that leads to the decoy alone: the crash ends the path and nothing is claimed
    // (an evaluator that called it complete would have been taken at its word before).
    let only_next = GuidedShape {
        on_track_keep: 1,
        off_track_keep: 1,
    };
    let llm = ScriptedLlm::new(responder(decoy.clone(), only_next));
    let (run, reproduced) = run_on(&ds, id, "full", 1, &llm, &meter()).await;
    assert!(!run.claimed && !reproduced, "{run:?}");
    let crashes = notes(&run, "crash");
    assert_eq!(crashes.len(), 1);
    assert_eq!(crashes[0]["reported"], false);
    assert_eq!(crashes[0]["confirmed"], false);

    // With more candidates kept, the reported crash (Enter on the empty field) is found at the
    // same level, after the decoy, and is the one claimed.
    let llm = ScriptedLlm::new(responder(decoy.clone(), GuidedShape::default()));
    let (run, reproduced) = run_on(&ds, id, "full", 4, &llm, &meter()).await;
    assert!(run.claimed && reproduced, "{run:?}");
    assert_eq!(run.trace, [Action::Press { key: Key::Enter }]);
    let confirmed: Vec<bool> = notes(&run, "crash")
        .iter()
        .map(|n| n["confirmed"] == true)
        .collect();
    assert_eq!(confirmed, [false, true]);

    // `no-bv` takes a crash as it is: it claims the decoy, which grading does not count.
    let llm = ScriptedLlm::new(responder(decoy.clone(), only_next));
    let (run, reproduced) = run_on(&ds, id, "no-bv", 1, &llm, &meter()).await;
    assert!(run.claimed && !reproduced, "{run:?}");
    assert_eq!(words(&run.trace), words(&decoy));
}

#[tokio::test]
async fn a_crash_on_the_last_action_of_the_budget_still_counts() {
    let ds = dataset();
    let id = "habitflow-07";
    let gold = ds.reports[id].ground_truth.clone();
    let llm = ScriptedLlm::new(responder(gold.clone(), GuidedShape::default()));
    let (run, reproduced) = run_on(&ds, id, "full", 1, &llm, &meter()).await;
    assert!(run.claimed && reproduced);
    // The actions before the last level; its first job (the ground truth's next action, kept
    // first) crashes the app.
    let levels = notes(&run, "level");
    let before_last = levels[levels.len() - 2]["actions_used"].as_u64().unwrap() as usize;
    let m = Meter::new(before_last + 1, Duration::from_secs(3600));
    let (run, reproduced) = run_on(&ds, id, "full", 1, &llm, &m).await;
    assert_eq!(run.actions_executed, before_last + 1);
    assert!(run.claimed && reproduced, "{run:?}");
    assert_eq!(run.exhausted, None);
    assert_eq!(words(&run.trace), words(&gold));
}

/// A path that comes back to a screen it has shown (the settings screen, then Back to the
/// first screen) is a new state, not merged into the first screen's: Enter there crashes the
/// app at the third level.
#[tokio::test]
async fn a_revisited_screen_is_a_new_state() {
    let ds = dataset();
    let id = "skycast-11";
    let report = &ds.reports[id];
    let Action::Click { target } = &report.ground_truth[0] else {
        panic!("skycast-11 starts with a click");
    };
    let settings = Action::Click {
        target: WidgetRef {
            resource_id: target.resource_id.replace("search_city", "open_settings"),
            ..WidgetRef::default()
        },
    };
    let plan = vec![
        settings,
        Action::Press { key: Key::Back },
        Action::Press { key: Key::Enter },
    ];
    let (fresh, package) = ds.device_for(id, SimLatency::ZERO).unwrap();
    let (first_screen, _) = replay(&fresh, &package, &[]).await.unwrap();
    let (fresh, _) = ds.device_for(id, SimLatency::ZERO).unwrap();
    let (revisited, crash) = replay(&fresh, &package, &plan[..2]).await.unwrap();
    assert!(crash.is_none());
    assert_eq!(
        revisited, first_screen,
        "Back returns to the very same screen"
    );
    let only_next = GuidedShape {
        on_track_keep: 1,
        off_track_keep: 1,
    };
    let llm = ScriptedLlm::new(responder(plan.clone(), only_next));
    let (run, reproduced) = run_on(&ds, id, "full", 1, &llm, &meter()).await;
    assert!(run.claimed && reproduced, "{run:?}");
    assert_eq!(run.trace.len(), 3);
    assert_eq!(run.actions_executed, 3);
    let levels = notes(&run, "level");
    assert_eq!(
        levels[1]["children"], 1,
        "the revisited screen's path was dropped"
    );
}
