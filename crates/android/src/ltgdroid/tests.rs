use super::guided::{GuidedShape, answer, responder};
use super::prompts::Stage;
use super::*;
use crate::agent::{ScriptedLlm, message_text};
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
            assert_eq!(run.trace.len(), report.ground_truth.len(), "{id}");
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

#[tokio::test]
async fn unreadable_answers_do_not_stop_the_search() {
    let ds = dataset();
    let llm = ScriptedLlm::new(|_| Ok("I am not sure.".to_string()));
    let m = Meter::new(30, Duration::from_secs(3600));
    let (run, _) = run_on(&ds, "skycast-11", "full", 2, &llm, &m).await;
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
