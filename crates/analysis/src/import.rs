//! Imports published per-instance results into the results schema, so that published systems
//! can be tabulated and compared with our own runs by the same code. Pure: the caller reads the
//! file and parses the JSON.

use reprobench_domain::results::ResultRow;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The id lists of an SWT-bench / SWE-bench run report; each listed id is one instance.
const RUN_REPORT_LISTS: [&str; 6] = [
    "resolved_ids",
    "unresolved_ids",
    "error_ids",
    "completed_ids",
    "empty_patch_ids",
    "incomplete_ids",
];

/// The categories of SWE-bench's first report format, in pipeline order.
const FIRST_FORMAT_CATEGORIES: [&str; 10] = [
    "no_generation",
    "generated",
    "with_logs",
    "install_fail",
    "reset_failed",
    "no_apply",
    "applied",
    "test_errored",
    "test_timeout",
    "resolved",
];

/// What the error message offers when a report has neither shape.
const ACCEPTED_SHAPES: &str = "accepted: (1) an SWT-bench/SWE-bench run report, an object with \
    `resolved_ids` and `unresolved_ids` (and optionally `error_ids`, `completed_ids`, \
    `empty_patch_ids`, `incomplete_ids`) listing instance ids; (2) SWE-bench's first report \
    format, an object mapping `no_generation`, `generated`, `with_logs`, `install_fail`, \
    `reset_failed`, `no_apply`, `applied`, `test_errored`, `test_timeout` and `resolved` to lists \
    of instance ids";

/// Why a published report could not be imported. (The messages already include what they wrap,
/// so nothing is exposed as a `source`: a reporter printing the chain would repeat it.)
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The agent or dataset name is blank.
    #[error(
        "agent `{agent}` or dataset `{dataset}` is empty; name the published system and the \
         dataset it ran on, e.g. agent `swe-agent-gpt4` and dataset `swe-bench-lite`"
    )]
    EmptyName {
        /// The agent name given.
        agent: String,
        /// The dataset name given.
        dataset: String,
    },
    /// The report is not a JSON object.
    #[error("the report is a JSON {kind}, not an object; {ACCEPTED_SHAPES}")]
    NotAnObject {
        /// What the report is instead (`array`, `string`, ...).
        kind: &'static str,
    },
    /// The report is an object of neither accepted shape.
    #[error("unrecognised report with keys {}; {ACCEPTED_SHAPES}", key_list(.keys))]
    UnrecognisedShape {
        /// The report's keys.
        keys: Vec<String>,
    },
    /// An id list of the report is not a list.
    #[error("`{key}` is a JSON {kind}, expected a list of instance ids; is this file a report?")]
    NotAList {
        /// The list's key.
        key: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// An element of an id list is not a string.
    #[error(
        "`{key}`[{index}] is a JSON {kind}, expected an instance id string; is this file a \
         report?"
    )]
    NotAnId {
        /// The list's key.
        key: String,
        /// The element's position in the list.
        index: usize,
        /// What it is instead.
        kind: &'static str,
    },
}

/// Converts a published per-instance report into one result row per instance, sorted by
/// instance id, for `agent` on `dataset`. Two shapes are accepted: an SWT-bench/SWE-bench run
/// report (`resolved_ids`, `unresolved_ids`, …) and SWE-bench's first report format (category →
/// instance ids); anything else is an error naming the keys found.
///
/// Rows are marked as imported (`run_id` `import-<agent>`, sweep `imported`, backbone
/// `published`, variant `full`, repeat 0, one attempt) and carry no cost, time or trace data.
pub fn import_swebench_report(
    json: &Value,
    agent: &str,
    dataset: &str,
) -> Result<Vec<ResultRow>, ImportError> {
    if agent.trim().is_empty() || dataset.trim().is_empty() {
        return Err(ImportError::EmptyName {
            agent: agent.into(),
            dataset: dataset.into(),
        });
    }
    let Some(obj) = json.as_object() else {
        return Err(ImportError::NotAnObject { kind: kind(json) });
    };
    let outcomes = if obj.contains_key("resolved_ids") && obj.contains_key("unresolved_ids") {
        run_report(obj)?
    } else if obj.contains_key("resolved")
        && obj
            .keys()
            .all(|k| FIRST_FORMAT_CATEGORIES.contains(&k.as_str()))
    {
        first_format(obj)?
    } else {
        return Err(ImportError::UnrecognisedShape {
            keys: obj.keys().cloned().collect(),
        });
    };
    Ok(outcomes
        .into_iter()
        .map(|(id, o)| ResultRow {
            run_id: format!("import-{agent}"),
            sweep: "imported".into(),
            track: "swt".into(),
            dataset: dataset.into(),
            repo_or_app: repo_of_instance(id).unwrap_or_default(),
            instance_id: id.into(),
            agent: agent.into(),
            variant: "full".into(),
            backbone: "published".into(),
            repeat: 0,
            success: o.success,
            verdict: o.verdict.into(),
            error_class: o.error_class.map(str::to_string),
            attempts: 1,
            ..Default::default()
        })
        .collect())
}

/// The repository of a SWE-bench-style instance id, `owner__name-number` → `owner/name`
/// (`django__django-11099` → `django/django`); None for ids of another form.
pub fn repo_of_instance(instance_id: &str) -> Option<String> {
    let (owner, rest) = instance_id.split_once("__")?;
    let (name, number) = rest.rsplit_once('-')?;
    let numeric = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
    (numeric && !owner.is_empty() && !name.is_empty()).then(|| format!("{owner}/{name}"))
}

/// One instance's outcome in a report.
struct Outcome {
    success: bool,
    verdict: &'static str,
    error_class: Option<&'static str>,
}

/// SWT-bench / SWE-bench run report: resolved wins, then error, else unresolved (completed,
/// empty-patch and incomplete ids that are not resolved failed to reproduce the bug).
fn run_report(obj: &Map<String, Value>) -> Result<BTreeMap<&str, Outcome>, ImportError> {
    let mut lists = BTreeMap::new();
    for key in RUN_REPORT_LISTS {
        lists.insert(key, id_set(obj, key)?);
    }
    let resolved = &lists["resolved_ids"];
    let errors = &lists["error_ids"];
    let all: BTreeSet<&str> = lists.values().flatten().copied().collect();
    Ok(all
        .into_iter()
        .map(|id| {
            let outcome = if resolved.contains(id) {
                Outcome {
                    success: true,
                    verdict: "resolved",
                    error_class: None,
                }
            } else if errors.contains(id) {
                Outcome {
                    success: false,
                    verdict: "error",
                    error_class: Some("error"),
                }
            } else {
                Outcome {
                    success: false,
                    verdict: "unresolved",
                    error_class: None,
                }
            };
            (id, outcome)
        })
        .collect())
}

/// SWE-bench's first report format. The verdict of an unresolved instance is the category that
/// tells how far it got: a test failure mode if its tests ran, `unresolved` if its patch applied
/// and the tests simply failed, otherwise the step that stopped it (`no_apply`, `reset_failed`,
/// `install_fail`, `no_generation`). Later stages win because an instance can sit in an early
/// category by mistake: SWE-agent's report lists two instances under both `no_generation` and
/// `applied` (each had an empty and a real prediction).
fn first_format(obj: &Map<String, Value>) -> Result<BTreeMap<&str, Outcome>, ImportError> {
    let mut lists = BTreeMap::new();
    for key in FIRST_FORMAT_CATEGORIES {
        lists.insert(key, id_set(obj, key)?);
    }
    const FAILURE_ORDER: [(&str, &str); 7] = [
        ("test_timeout", "test_timeout"),
        ("test_errored", "test_errored"),
        ("applied", "unresolved"),
        ("no_apply", "no_apply"),
        ("reset_failed", "reset_failed"),
        ("install_fail", "install_fail"),
        ("no_generation", "no_generation"),
    ];
    let all: BTreeSet<&str> = lists.values().flatten().copied().collect();
    Ok(all
        .into_iter()
        .map(|id| {
            let verdict = if lists["resolved"].contains(id) {
                "resolved"
            } else {
                FAILURE_ORDER
                    .iter()
                    .find(|(category, _)| lists[category].contains(id))
                    .map_or("unresolved", |(_, verdict)| verdict)
            };
            let outcome = Outcome {
                success: verdict == "resolved",
                verdict,
                error_class: None,
            };
            (id, outcome)
        })
        .collect())
}

/// The ids under `key` (absent or null: none), deduplicated.
fn id_set<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<BTreeSet<&'a str>, ImportError> {
    let items = match obj.get(key) {
        None | Some(Value::Null) => return Ok(BTreeSet::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ImportError::NotAList {
                key: key.into(),
                kind: kind(other),
            });
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(index, v)| {
            v.as_str().ok_or_else(|| ImportError::NotAnId {
                key: key.into(),
                index,
                kind: kind(v),
            })
        })
        .collect()
}

/// An object's keys for an error message, a dozen at most.
fn key_list(keys: &[String]) -> String {
    const SHOWN: usize = 12;
    if keys.is_empty() {
        return "(none: empty object)".into();
    }
    let mut shown: Vec<String> = keys.iter().take(SHOWN).map(|k| format!("`{k}`")).collect();
    if keys.len() > SHOWN {
        shown.push(format!("… ({} keys in all)", keys.len()));
    }
    shown.join(", ")
}

/// A JSON value's kind, for error messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// (instance_id, success, verdict, error_class) of each row, in order.
    fn check(report: Value, expected: &[(&str, bool, &str, Option<&str>)]) {
        let rows = import_swebench_report(&report, "sys", "swt-lite").unwrap();
        let got: Vec<(&str, bool, &str, Option<&str>)> = rows
            .iter()
            .map(|r| {
                (
                    r.instance_id.as_str(),
                    r.success,
                    r.verdict.as_str(),
                    r.error_class.as_deref(),
                )
            })
            .collect();
        assert_eq!(got, expected, "{report}");
    }

    #[test]
    fn imports_run_reports() {
        check(
            json!({
                "total_instances": 5,
                "resolved_ids": ["b__b-2", "a__a-1"],
                "unresolved_ids": ["c__c-3"],
                "error_ids": ["d__d-4"],
                "completed_ids": ["a__a-1", "c__c-3"],
                "empty_patch_ids": ["e__e-5"],
                "unremoved_images": ["exec.eval.x86_64.abc:latest"],
            }),
            &[
                ("a__a-1", true, "resolved", None),
                ("b__b-2", true, "resolved", None),
                ("c__c-3", false, "unresolved", None),
                ("d__d-4", false, "error", Some("error")),
                ("e__e-5", false, "unresolved", None),
            ],
        );
        check(
            json!({"resolved_ids": [], "unresolved_ids": [], "error_ids": null}),
            &[],
        );
    }

    #[test]
    fn imports_the_first_swe_bench_format() {
        check(
            json!({
                "no_generation": ["a__a-1", "a__a-1", "b__b-2"],
                "generated": ["b__b-2", "c__c-3", "d__d-4", "e__e-5", "f__f-6"],
                "with_logs": ["b__b-2", "c__c-3", "d__d-4", "e__e-5", "f__f-6"],
                "install_fail": [],
                "reset_failed": [],
                "no_apply": ["c__c-3"],
                "applied": ["b__b-2", "d__d-4", "e__e-5", "f__f-6"],
                "test_errored": [],
                "test_timeout": ["f__f-6"],
                "resolved": ["e__e-5"],
            }),
            &[
                ("a__a-1", false, "no_generation", None),
                ("b__b-2", false, "unresolved", None), // listed as no_generation too, but applied
                ("c__c-3", false, "no_apply", None),
                ("d__d-4", false, "unresolved", None),
                ("e__e-5", true, "resolved", None),
                ("f__f-6", false, "test_timeout", None),
            ],
        );
        // Older files lack some categories.
        check(
            json!({"resolved": ["x__y-1"], "applied": ["x__y-1"]}),
            &[("x__y-1", true, "resolved", None)],
        );
    }

    #[test]
    fn fills_the_schema_for_imported_rows() {
        let report = json!({"resolved_ids": ["django__django-11099"], "unresolved_ids": []});
        let rows = import_swebench_report(&report, "assertflip", "swt-verified").unwrap();
        let expected = ResultRow {
            run_id: "import-assertflip".into(),
            sweep: "imported".into(),
            track: "swt".into(),
            dataset: "swt-verified".into(),
            instance_id: "django__django-11099".into(),
            repo_or_app: "django/django".into(),
            agent: "assertflip".into(),
            variant: "full".into(),
            backbone: "published".into(),
            success: true,
            verdict: "resolved".into(),
            attempts: 1,
            ..Default::default()
        };
        assert_eq!(rows, vec![expected]);
    }

    #[test]
    fn derives_the_repository_from_the_instance_id() {
        let cases = [
            ("django__django-11099", Some("django/django")),
            (
                "scikit-learn__scikit-learn-13142",
                Some("scikit-learn/scikit-learn"),
            ),
            ("sphinx-doc__sphinx-8475", Some("sphinx-doc/sphinx")),
            ("psf__requests-863", Some("psf/requests")),
            ("django-11099", None),
            ("django__django", None),
            ("django__django-rc1", None),
            ("__x-1", None),
        ];
        for (id, expected) in cases {
            assert_eq!(repo_of_instance(id).as_deref(), expected, "{id}");
        }
    }

    #[test]
    fn rejects_other_shapes_with_what_was_found() {
        let cases = [
            (
                json!([1, 2]),
                vec!["JSON array, not an object", "resolved_ids"],
            ),
            (
                json!({"django__django-1": {"resolved": true}}),
                vec!["keys `django__django-1`", "first report format"],
            ),
            (
                json!({"resolved": ["a"], "patched": ["a"]}),
                vec!["`patched`", "`resolved`"],
            ),
            (json!({}), vec!["(none: empty object)"]),
            (
                json!({"resolved_ids": "a", "unresolved_ids": []}),
                vec!["`resolved_ids` is a JSON string"],
            ),
            (
                json!({"resolved": [1]}),
                vec!["`resolved`[0] is a JSON number"],
            ),
        ];
        for (report, needles) in cases {
            let err = import_swebench_report(&report, "sys", "d")
                .unwrap_err()
                .to_string();
            for needle in needles {
                assert!(err.contains(needle), "{report}: {err}");
            }
        }
        let err = import_swebench_report(&json!({}), "", "d")
            .unwrap_err()
            .to_string();
        assert!(err.contains("is empty"), "{err}");
    }

    #[test]
    fn error_messages_read_as_before() {
        let message = |report: Value, agent: &str| {
            import_swebench_report(&report, agent, "d")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            message(json!({}), " "),
            "agent ` ` or dataset `d` is empty; name the published system and the dataset it ran \
             on, e.g. agent `swe-agent-gpt4` and dataset `swe-bench-lite`"
        );
        assert_eq!(
            message(json!("x"), "sys"),
            format!("the report is a JSON string, not an object; {ACCEPTED_SHAPES}")
        );
        let many: Map<String, Value> = (0..13).map(|i| (format!("k{i:02}"), json!(1))).collect();
        assert_eq!(
            message(Value::Object(many), "sys"),
            format!(
                "unrecognised report with keys `k00`, `k01`, `k02`, `k03`, `k04`, `k05`, `k06`, \
                 `k07`, `k08`, `k09`, `k10`, `k11`, … (13 keys in all); {ACCEPTED_SHAPES}"
            )
        );
        assert_eq!(
            message(json!({"resolved": {}}), "sys"),
            "`resolved` is a JSON object, expected a list of instance ids; is this file a report?"
        );
        assert_eq!(
            message(
                json!({"resolved_ids": ["a", null], "unresolved_ids": []}),
                "sys"
            ),
            "`resolved_ids`[1] is a JSON null, expected an instance id string; is this file a \
             report?"
        );
    }
}
