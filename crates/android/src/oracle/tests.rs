use super::*;
use crate::agent::{AndroidRun, Meter};
use crate::baselines::{ADBGPT_RULES, REBL_RULES};
use crate::device::Device;
use crate::executor::counts_as_reproduced;
use crate::explore::ActionRules;
use crate::llm_agents::run_agent;
use crate::ltgdroid::LTGDROID_RULES;
use crate::sim::{SimDevice, SimLatency, replay, source_dataset_dir};
use reprobench_domain::android::BugType;
use reprobench_domain::registry::{AGENTS, AgentKind, Track};
use reprobench_gateway::llm::{AssistantTurn, Llm, LlmError, ToolCall, request_body};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn dataset() -> Dataset {
    Dataset::load(&source_dataset_dir()).expect("the android-sim suite loads")
}

/// Request bodies sent and the oracle's answers, in the order they were asked.
type Exchanges = Arc<Mutex<Vec<(Value, Value)>>>;

/// An [`Llm`] whose answers are the oracle's, on the very body the gateway would receive (built
/// by the gateway client's own [`request_body`] and sent through JSON text); it records every
/// exchange.
#[derive(Clone)]
struct OracleLlm {
    oracle: Arc<AndroidOracle>,
    exchanges: Exchanges,
}

impl OracleLlm {
    fn new(oracle: Arc<AndroidOracle>) -> OracleLlm {
        OracleLlm {
            oracle,
            exchanges: Arc::default(),
        }
    }
}

impl Llm for OracleLlm {
    async fn chat(
        &mut self,
        messages: &[Value],
        tools: &[Value],
    ) -> Result<AssistantTurn, LlmError> {
        let wire = request_body(messages, tools, &serde_json::Map::new()).to_string();
        let body: Value = serde_json::from_str(&wire).expect("the body is JSON");
        let answer = self.oracle.answer(&body).ok_or_else(|| {
            LlmError::Failed(format!("the oracle does not answer this request: {wire}"))
        })?;
        self.exchanges.lock().unwrap().push((body, answer.clone()));
        let tool_calls = answer["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: format!("call_{i}"),
                name: c["name"].as_str().unwrap_or_default().to_string(),
                arguments: c["arguments"].as_str().unwrap_or("{}").to_string(),
            })
            .collect();
        Ok(AssistantTurn {
            content: answer["content"].as_str().map(str::to_string),
            tool_calls,
        })
    }
}

/// The android LLM agents and their variants, as the registry lists them.
fn agents() -> Vec<(&'static str, AgentKind, &'static str)> {
    AGENTS
        .iter()
        .filter(|a| a.track == Track::Android && a.calls_llm)
        .flat_map(|a| a.variants.iter().map(move |v| (a.name, a.kind, *v)))
        .collect()
}

/// The action space an agent offers its model.
fn rules_of(kind: AgentKind) -> &'static ActionRules {
    match kind {
        AgentKind::LtgDroid => &LTGDROID_RULES,
        AgentKind::Rebl | AgentKind::ReblVisual => &REBL_RULES,
        AgentKind::AdbGpt => &ADBGPT_RULES,
        other => panic!("{other:?} is not an android LLM agent"),
    }
}

/// Runs `agent`/`variant` on report `id` (ltgdroid on two replicas, so its requests interleave)
/// with the oracle as its backbone, and grades the run as the `sim` executor does: the trace
/// replayed on a fresh device, counted when claimed within the budget.
async fn run_graded(
    ds: &Dataset,
    llm: &OracleLlm,
    agent: &str,
    variant: &str,
    id: &str,
) -> (AndroidRun, bool) {
    let report = &ds.reports[id];
    let (first, package) = ds
        .device_for(id, SimLatency::ZERO)
        .expect("the report's app");
    let replica = first.replica();
    let devices: Vec<&dyn Device> = vec![&first, &replica];
    let bug_type = match report.kind {
        BugKind::Crash => BugType::Crash,
        BugKind::NonCrash => BugType::NonCrash,
    };
    // The papers' budget: 100 UI actions.
    let meter = Meter::new(100, Duration::from_secs(3600));
    let run = run_agent(
        llm,
        agent,
        variant,
        &report.android_report(),
        bug_type,
        &devices,
        &package,
        &meter,
    )
    .await
    .unwrap_or_else(|e| panic!("{agent}/{variant} on {id}: {e}"));
    let (fresh, _): (SimDevice, _) = ds.device_for(id, SimLatency::ZERO).expect("device");
    let (screen, crash) = replay(&fresh, &package, &run.trace).await.expect("replay");
    let reproduced = counts_as_reproduced(report.reproduced(&screen, crash.as_ref()), &run);
    (run, reproduced)
}

/// Every android agent and variant with the oracle as its backbone, on every android-sim
/// report: each reproduces exactly the reports whose ground truth its action space can
/// perform, with the ground truth's own number of actions. No ablation fails: a perfect model
/// keeps only the ground truth's path, so analysis (`no-ra`: the report itself is the
/// objective), enumeration (`no-ae`: the model names the action), transition summaries
/// (`no-ta`) and verification (`no-bv`: the evaluator is never wrong) are never what decides.
/// ReBL (no Enter key) and AdbGPT (no Back, Enter or rotation) miss the reports that need what
/// their methods do not offer.
#[tokio::test]
async fn every_agent_reproduces_every_report_its_action_space_can() {
    let ds = dataset();
    let oracle = Arc::new(AndroidOracle::new(&ds));
    let mut table = Vec::new();
    for (agent, kind, variant) in agents() {
        let rules = rules_of(kind);
        let mut reproduced_count = 0;
        let mut missed = Vec::new();
        for (id, report) in &ds.reports {
            let llm = OracleLlm::new(oracle.clone());
            let (run, reproduced) = run_graded(&ds, &llm, agent, variant, id).await;
            let performable = report.ground_truth.iter().all(|a| rules.covers(a));
            assert_eq!(
                reproduced, performable,
                "{agent}/{variant} on {id}: reproduced {reproduced}, ground truth performable \
                 {performable}: {run:?}"
            );
            if reproduced {
                reproduced_count += 1;
                assert_eq!(
                    run.trace.len(),
                    report.ground_truth.len(),
                    "{agent}/{variant} {id}"
                );
                assert_eq!(
                    run.actions_executed,
                    run.trace.len(),
                    "{agent}/{variant} {id}"
                );
            } else {
                missed.push(id.as_str());
            }
        }
        table.push(format!(
            "{agent}/{variant}: {reproduced_count}/{} (not: {})",
            ds.reports.len(),
            missed.join(", ")
        ));
    }
    eprintln!("{}", table.join("\n"));
    // ltgdroid's action space covers every ground truth of the suite: all five variants
    // reproduce all of it.
    assert!(
        ds.reports
            .values()
            .all(|r| r.ground_truth.iter().all(|a| LTGDROID_RULES.covers(a)))
    );
}

/// The answers depend on the request alone: the requests of runs of different agents, asked
/// again in another order of a fresh oracle, get the same answers.
#[tokio::test]
async fn answers_depend_on_the_request_alone() {
    let ds = dataset();
    let oracle = Arc::new(AndroidOracle::new(&ds));
    let llm = OracleLlm::new(oracle.clone());
    for (agent, variant, id) in [
        ("ltgdroid", "full", "pocketbudget-10"),
        ("rebl", "full", "tipsplit-04"),
        ("adbgpt", "full", "shoplist-05"),
        ("ltgdroid", "no-ae", "quicknotes-02"),
    ] {
        let (_, reproduced) = run_graded(&ds, &llm, agent, variant, id).await;
        assert!(reproduced, "{agent}/{variant} on {id}");
    }
    let exchanges = llm.exchanges.lock().unwrap().clone();
    assert!(exchanges.len() > 40, "{}", exchanges.len());
    let fresh = AndroidOracle::new(&ds);
    for (body, answer) in exchanges.iter().rev() {
        assert_eq!(fresh.answer(body).as_ref(), Some(answer), "{body}");
    }
}

fn request(system: &str, user: &str) -> Value {
    json!({"model": "default", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]})
}

#[test]
fn only_the_android_agents_requests_about_known_reports_are_answered() {
    let ds = dataset();
    let oracle = AndroidOracle::new(&ds);
    let report = report_text(&ds.reports["skycast-11"].android_report());
    // Another agent's request, a request without a system prompt, and no request at all.
    assert_eq!(
        oracle.answer(&request(
            "reproagent stage: localization\nFind the bug.",
            &report
        )),
        None
    );
    assert_eq!(
        oracle.answer(&json!({"messages": [{"role": "user", "content": report}]})),
        None
    );
    assert_eq!(oracle.answer(&json!({"prompt": "hi"})), None);
    // ReBL's request about a report the oracle does not know.
    assert_eq!(
        oracle.answer(&request(
            &format!("{REBL_MARKER}\nYou are testing an app."),
            "The bug report:\n\nTitle: Something else entirely",
        )),
        None
    );
    // A transition is described without any report, from the prompt's text.
    let (sys, user) = prompts::summarize(
        "click <Button resource-id=\"save\"/>",
        "com.example/.EditActivity",
        "com.example/.ListActivity",
        None,
    );
    let answer = oracle.answer(&request(&sys, &user)).expect("answered");
    assert_eq!(answer["tool_calls"], json!([]));
    let summary = prompts::summary_of(answer["content"].as_str().unwrap());
    assert!(
        summary.contains("switches from com.example/.EditActivity to com.example/.ListActivity"),
        "{summary}"
    );
}

#[test]
fn ltgdroid_stages_are_answered_from_the_ground_truth() {
    let ds = dataset();
    let oracle = AndroidOracle::new(&ds);
    let r = &ds.reports["skycast-11"];
    let report = report_text(&r.android_report());
    let content = |(sys, user): (String, String)| {
        oracle.answer(&request(&sys, &user)).expect("answered")["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // The analysis: the ground truth as steps, the symptom under the report's title.
    let spec = prompts::specification_of(&content(prompts::analyze(&report))).unwrap();
    assert!(spec.contains("1. click <EditText resource-id=\"search_city\"/>\n2. press enter\n"));
    assert!(spec.contains(
        "- Keyboard search crashes: the app crashes with java.lang.StringIndexOutOfBoundsException"
    ));
    // The filter keeps the next ground-truth action only; the raw report identifies too.
    let candidates = [
        "click <ImageButton resource-id=\"open_settings\" content-desc=\"Settings\"/>".to_string(),
        "press enter".to_string(),
    ];
    let step = |action: &str| prompts::PathStep {
        action: action.into(),
        effect: Some("it did something".into()),
    };
    let path = [step("click <EditText resource-id=\"search_city\"/>")];
    let screen = prompts::ScreenText::default();
    for objective in [spec.clone(), prompts::raw_objective(&report)] {
        let kept = content(prompts::filter(&objective, &path, &screen, &candidates, 6));
        assert_eq!(prompts::kept_indices(&kept, 2, 6, "keep"), [1]);
    }
    // An off-track path keeps nothing.
    let off = [step(
        "click <ImageButton resource-id=\"open_settings\" content-desc=\"Settings\"/>",
    )];
    let kept = content(prompts::filter(&spec, &off, &screen, &candidates, 6));
    assert_eq!(
        prompts::kept_indices(&kept, 2, 6, "keep"),
        Vec::<usize>::new()
    );
    // The evaluator keeps on-track paths and names the complete one; the verifier confirms it.
    let done = [path[0].clone(), step("press enter")];
    let eval = content(prompts::evaluate(
        &spec,
        &[off.to_vec(), done.to_vec(), path.to_vec()],
        3,
    ));
    let eval = prompts::evaluation_of(&eval, 3, 3);
    assert_eq!((eval.complete, eval.keep), (Some(1), vec![1, 2]));
    assert_eq!(
        prompts::verdict_of(&content(prompts::verify(&spec, &done, "x"))),
        Some(true)
    );
    assert_eq!(
        prompts::verdict_of(&content(prompts::verify(&spec, &path, "x"))),
        Some(false)
    );
}

#[test]
fn rebl_progress_is_read_from_its_last_answer_and_the_feedback() {
    let gold = dataset().reports["habitflow-07"].ground_truth.clone();
    let user = |feedback: &str| {
        let text = format!(
            "Step 2.\nFeedback on your previous answer: {feedback}\n\n\
             Candidate actions:\n  [0] rotate the screen\n"
        );
        json!({"role": "user", "content": text})
    };
    let thought = format!("{REBL_PROGRESS}3 of 5 steps done; next: x");
    let answer = json!({"role": "assistant",
        "content": json!({"thought": thought, "action": 4}).to_string()});
    let done = format!(
        "you did `{}`. The screen changed.",
        describe_action(&gold[3])
    );
    let refused = format!(
        "you did `{}`. The action could not be performed (gone): no. Nothing was done.",
        describe_action(&gold[3])
    );
    let messages = |feedback: &str| {
        vec![
            json!({"role": "system", "content": "s"}),
            answer.clone(),
            user(feedback),
        ]
    };
    assert_eq!(rebl_progress(&messages(&done), &gold), 4);
    assert_eq!(rebl_progress(&messages(&refused), &gold), 3);
    assert_eq!(
        rebl_progress(&messages("your answer was not valid JSON"), &gold),
        3
    );
    // Without a stated progress, every visible step's feedback is replayed.
    let first = format!(
        "you did `{}`. The screen changed.",
        describe_action(&gold[0])
    );
    let second = format!(
        "you did `{}`. The screen changed.",
        describe_action(&gold[1])
    );
    let replayed = [
        json!({"role": "system", "content": "s"}),
        user(&first),
        json!({"role": "assistant", "content": "{\"action\": 1}"}),
        user(&second),
    ];
    assert_eq!(rebl_progress(&replayed, &gold), 2);
}
