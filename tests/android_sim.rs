//! The android track on the simulator through the cluster: `gold-trace` validates the
//! `android-sim` suite (every report reproduced from its ground truth), and `monkey` with fixed
//! seeds reproduces some crash reports and no non-crash one. The device is the `sim` executor's
//! simulator, never an emulator.

mod common;

use serde_json::Value;

#[test]
fn gold_trace_reproduces_every_sim_report_and_monkey_no_non_crash_one() {
    let dir = tempfile::tempdir().unwrap();
    let rows = common::LocalRun::start(
        dir.path(),
        "android",
        "name = \"android-sim\"\ndatasets = [\"android-sim\"]\nseed = 3\n[[agents]]\nname = \"gold-trace\"\n[[agents]]\nname = \"monkey\"\n",
        1,
        &[],
    )
    .rows();
    let of = |agent: &'static str| rows.iter().filter(move |r| r["agent"] == agent);
    assert_eq!(of("gold-trace").count(), 12);
    for r in of("gold-trace") {
        assert_eq!(r["track"], "android");
        assert_eq!(r["verdict"], "reproduced", "{r}");
        assert_eq!(r["trace_len"], r["ground_truth_actions"], "{r}");
        let details: Value = serde_json::from_slice(
            &std::fs::read(
                std::path::Path::new(r["artifact_path"].as_str().unwrap()).join("trace.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(details["simulator"], true);
    }
    assert_eq!(of("monkey").count(), 12);
    for r in of("monkey") {
        assert!(r["actions"].as_u64().unwrap() <= 100, "{r}");
        if r["bug_type"] == "non-crash" {
            assert_eq!(r["verdict"], "not_reproduced", "{r}");
        }
    }
}

/// A copy of android-sim holding only report `id`, so a scripted server knows which ground
/// truth to follow.
fn one_report_suite(dir: &std::path::Path, id: &str) -> std::path::PathBuf {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/android-sim");
    let dst = dir.join("sim-suite");
    std::fs::create_dir_all(dst.join("apps")).unwrap();
    std::fs::create_dir_all(dst.join("reports")).unwrap();
    std::fs::copy(src.join("manifest.json"), dst.join("manifest.json")).unwrap();
    for e in std::fs::read_dir(src.join("apps")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join("apps").join(p.file_name().unwrap())).unwrap();
    }
    let report = format!("{id}.json");
    std::fs::copy(
        src.join("reports").join(&report),
        dst.join("reports").join(&report),
    )
    .unwrap();
    dst
}

#[test]
fn ltgdroid_variants_and_baselines_run_through_the_gateway_against_a_scripted_server() {
    use reprobench_android::device::Action;
    use reprobench_android::ltgdroid::guided::{GuidedShape, answer};
    use reprobench_android::ltgdroid::prompts::Stage;
    use reprobench_gateway::scripted::{ScriptedReply, ScriptedUpstream};

    let id = "pocketbudget-10";
    let dir = tempfile::tempdir().unwrap();
    let suite = one_report_suite(dir.path(), id);
    let report: Value = serde_json::from_slice(
        &std::fs::read(suite.join("reports").join(format!("{id}.json"))).unwrap(),
    )
    .unwrap();
    let gold: Vec<Action> = serde_json::from_value(report["ground_truth"].clone()).unwrap();
    assert!(gold.len() > 10, "a multi-step bug");
    // The scripted server (not a model): ltgdroid's prompts get the ground-truth-following
    // answers; the baselines' prompts get an answer that ends their run at once.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = rt.block_on(ScriptedUpstream::start(move |req| {
        let messages = req.body["messages"].as_array().cloned().unwrap_or_default();
        let system = messages
            .first()
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        let text = if Stage::of_system_prompt(system).is_some() {
            answer(&messages, &gold, GuidedShape::default())
        } else {
            r#"{"status": "give_up", "steps": []}"#.to_string()
        };
        ScriptedReply::text(&text)
    }));
    let toml = format!(
        r#"name = "ltgdroid-scripted"
datasets = ["{suite}"]
[[agents]]
name = "ltgdroid"
variants = ["full", "no-ra", "no-ae", "no-ta", "no-bv"]
[[agents]]
name = "rebl"
[[agents]]
name = "rebl-visual"
[[agents]]
name = "adbgpt"
[[backbones]]
name = "scripted"
base_url = "{url}"
model = "scripted-model"
api_key_env = "RB_TEST_LLM_KEY"
[budget]
max_actions = 100
max_llm_calls = 400
"#,
        suite = suite.display(),
        url = upstream.base_url()
    );
    let rows = common::LocalRun::start_with_env(
        dir.path(),
        "ltgdroid",
        &toml,
        1,
        &[],
        &[("RB_TEST_LLM_KEY", "sk-test")],
    )
    .rows();
    assert_eq!(rows.len(), 8, "5 ltgdroid variants and 3 baselines");
    let row = |agent: &str, variant: &str| {
        rows.iter()
            .find(|r| r["agent"] == agent && r["variant"] == variant)
            .unwrap_or_else(|| panic!("no row for {agent}/{variant}"))
            .clone()
    };
    let stages = |r: &Value| -> String {
        std::fs::read_to_string(
            std::path::Path::new(r["artifact_path"].as_str().unwrap()).join("transcript.jsonl"),
        )
        .unwrap()
    };
    for v in ["full", "no-ra", "no-ae", "no-ta", "no-bv"] {
        let r = row("ltgdroid", v);
        assert_eq!(r["verdict"], "reproduced", "{v}: {r}");
        assert_eq!(r["trace_len"], r["ground_truth_actions"], "{v}: {r}");
        assert!(r["llm_calls"].as_u64().unwrap() > 0 && r["tokens_in"].as_u64().unwrap() > 0);
        assert_eq!(r["backbone"], "scripted");
    }
    let full = row("ltgdroid", "full");
    assert!(
        full["actions"].as_u64() > full["trace_len"].as_u64(),
        "pre-assessment explores"
    );
    let t = stages(&full);
    for stage in ["analyze", "filter", "summarize", "evaluate", "verify"] {
        assert!(
            t.contains(&format!("ltgdroid stage: {stage}")),
            "full runs {stage}"
        );
    }
    assert!(!stages(&row("ltgdroid", "no-ra")).contains("ltgdroid stage: analyze"));
    let no_ae = row("ltgdroid", "no-ae");
    assert!(!stages(&no_ae).contains("ltgdroid stage: filter"));
    assert_eq!(
        no_ae["actions"], no_ae["trace_len"],
        "no-ae explores nothing beside its path"
    );
    assert!(!stages(&row("ltgdroid", "no-ta")).contains("ltgdroid stage: summarize"));
    assert!(!stages(&row("ltgdroid", "no-bv")).contains("ltgdroid stage: verify"));
    for agent in ["rebl", "rebl-visual", "adbgpt"] {
        let r = row(agent, "full");
        assert!(r["error_class"].is_null(), "{agent}: {r}");
        assert_eq!(r["verdict"], "not_reproduced", "{agent}: {r}");
        assert!(r["llm_calls"].as_u64().unwrap() >= 1, "{agent}: {r}");
    }
}
