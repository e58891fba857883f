//! The stage outputs (localization, root cause, test plan, review verdict) and their lenient
//! deserialization from model-written JSON: missing fields default, a list may be given as a
//! single item, scalars of the wrong type are converted, and a confidence may be a number
//! (`0.8`, `80`) or a word (`"high"`).

use serde::{Deserialize, Deserializer, Serialize, de::DeserializeOwned};
use serde_json::Value;

/// A suspicious file, or a function/class within one, with the reason and a confidence in 0..1.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "SuspectRepr")]
pub struct Suspect {
    /// Path relative to the repository root.
    pub path: String,
    /// Function or class name (`Class.method`); empty for a file.
    pub name: String,
    /// Why it is suspicious.
    pub rationale: String,
    /// Confidence in 0..1.
    pub confidence: f64,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SuspectRepr {
    Path(String),
    Fields(SuspectFields),
}

#[derive(Deserialize)]
struct SuspectFields {
    #[serde(default, alias = "file", alias = "file_path", alias = "filename")]
    #[serde(deserialize_with = "lenient_string")]
    path: String,
    #[serde(default, alias = "function", alias = "class", alias = "symbol")]
    #[serde(alias = "qualified_name", deserialize_with = "lenient_string")]
    name: String,
    #[serde(
        default,
        alias = "reason",
        alias = "why",
        deserialize_with = "lenient_string"
    )]
    rationale: String,
    #[serde(default, alias = "score", deserialize_with = "lenient_confidence")]
    confidence: f64,
}

impl From<SuspectRepr> for Suspect {
    fn from(repr: SuspectRepr) -> Self {
        match repr {
            SuspectRepr::Path(path) => Suspect {
                path,
                ..Suspect::default()
            },
            SuspectRepr::Fields(f) => Suspect {
                path: f.path,
                name: f.name,
                rationale: f.rationale,
                confidence: f.confidence,
            },
        }
    }
}

/// A suspicious line range in a file, with the reason and a confidence in 0..1.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "SuspectLinesFields")]
pub struct SuspectLines {
    /// Path relative to the repository root.
    pub path: String,
    /// First line (1-based; 0 when the model gave none).
    pub start_line: u32,
    /// Last line (inclusive; equals `start_line` for a single line).
    pub end_line: u32,
    /// Why these lines are suspicious.
    pub rationale: String,
    /// Confidence in 0..1.
    pub confidence: f64,
}

#[derive(Deserialize)]
struct SuspectLinesFields {
    #[serde(default, alias = "file", alias = "file_path", alias = "filename")]
    #[serde(deserialize_with = "lenient_string")]
    path: String,
    #[serde(default, alias = "start", deserialize_with = "lenient_line")]
    start_line: u32,
    #[serde(default, alias = "end", deserialize_with = "lenient_line")]
    end_line: u32,
    /// `"12-20"`, `"12"`, `12` or `[12, 20]`.
    #[serde(default, alias = "line", alias = "line_range")]
    lines: Value,
    #[serde(
        default,
        alias = "reason",
        alias = "why",
        deserialize_with = "lenient_string"
    )]
    rationale: String,
    #[serde(default, alias = "score", deserialize_with = "lenient_confidence")]
    confidence: f64,
}

impl From<SuspectLinesFields> for SuspectLines {
    fn from(f: SuspectLinesFields) -> Self {
        let (mut start, mut end) = (f.start_line, f.end_line);
        if start == 0
            && let Some((s, e)) = line_range(&f.lines)
        {
            start = s;
            end = end.max(e);
        }
        if end < start {
            end = start;
        }
        SuspectLines {
            path: f.path,
            start_line: start,
            end_line: end,
            rationale: f.rationale,
            confidence: f.confidence,
        }
    }
}

/// Reads a line range from `12`, `"12"`, `"12-20"`, `"L12-L20"` or `[12, 20]`.
fn line_range(value: &Value) -> Option<(u32, u32)> {
    match value {
        Value::Array(items) => {
            let start = items.first().and_then(line_number)?;
            let end = items.last().and_then(line_number).unwrap_or(start);
            Some((start, end))
        }
        Value::String(s) => {
            let mut parts = s.splitn(2, ['-', ':', '–']);
            let start = parts.next().and_then(leading_number)?;
            let end = parts.next().and_then(leading_number).unwrap_or(start);
            Some((start, end))
        }
        other => line_number(other).map(|n| (n, n)),
    }
}

fn line_number(value: &Value) -> Option<u32> {
    match value {
        Value::Number(n) => n.as_f64().filter(|x| *x >= 0.0).map(|x| x as u32),
        Value::String(s) => leading_number(s),
        _ => None,
    }
}

/// The first run of digits in `s` (skipping a prefix such as `L` or `line `).
fn leading_number(s: &str) -> Option<u32> {
    let digits: String = s
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// The localization stage's output: files, then functions/classes, then lines, each ranked from
/// most to least suspicious.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Localization {
    /// Suspicious files.
    #[serde(alias = "suspicious_files", deserialize_with = "lenient_list")]
    pub files: Vec<Suspect>,
    /// Suspicious functions or classes.
    #[serde(alias = "suspicious_functions", alias = "classes", alias = "symbols")]
    #[serde(alias = "functions_or_classes", deserialize_with = "lenient_list")]
    pub functions: Vec<Suspect>,
    /// Suspicious line ranges.
    #[serde(alias = "suspicious_lines", alias = "regions", alias = "code_regions")]
    #[serde(deserialize_with = "lenient_list")]
    pub lines: Vec<SuspectLines>,
}

impl Localization {
    /// Whether the model named at least one location.
    pub fn is_informative(&self) -> bool {
        !(self.files.is_empty() && self.functions.is_empty() && self.lines.is_empty())
    }

    /// Distinct file paths in rank order: the files list first, then files only named by a
    /// function or line entry.
    pub fn ranked_files(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let named = self
            .files
            .iter()
            .map(|s| &s.path)
            .chain(self.functions.iter().map(|s| &s.path))
            .chain(self.lines.iter().map(|l| &l.path));
        for path in named {
            let path = normalize_repo_path(path);
            if !path.is_empty() && !out.contains(&path) {
                out.push(path);
            }
        }
        out
    }
}

/// The root-cause analysis stage's output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RootCause {
    /// The fault mechanism in a few sentences.
    #[serde(alias = "root_cause_summary", alias = "root_cause")]
    #[serde(deserialize_with = "lenient_string")]
    pub summary: String,
    /// Defect type, e.g. logic error, boundary handling, API misuse.
    #[serde(alias = "category", alias = "issue_category", alias = "defect_type")]
    #[serde(deserialize_with = "lenient_string")]
    pub error_category: String,
    /// Key steps from the entry point to the failure point, with locations.
    #[serde(alias = "path", deserialize_with = "lenient_strings")]
    pub execution_path: Vec<String>,
    /// Conditions needed to trigger the failure.
    #[serde(alias = "triggers", alias = "trigger_condition")]
    #[serde(deserialize_with = "lenient_strings")]
    pub trigger_conditions: Vec<String>,
    /// Confidence in 0..1.
    #[serde(alias = "confidence_score", deserialize_with = "lenient_confidence")]
    pub confidence: f64,
}

impl RootCause {
    /// Whether the model gave a summary.
    pub fn is_informative(&self) -> bool {
        !self.summary.trim().is_empty()
    }
}

/// The planning stage's output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TestPlan {
    /// Setup and initial state the test needs.
    #[serde(alias = "environment", alias = "setup", alias = "preconditions")]
    #[serde(deserialize_with = "lenient_strings")]
    pub environment_constraints: Vec<String>,
    /// Minimal inputs and parameter values that trigger the bug.
    #[serde(
        alias = "inputs",
        alias = "test_inputs",
        alias = "test_input_construction"
    )]
    #[serde(deserialize_with = "lenient_strings")]
    pub minimal_inputs: Vec<String>,
    /// How buggy and intended behaviour differ, and what to assert.
    #[serde(alias = "assertions", alias = "expected_assertion")]
    #[serde(deserialize_with = "lenient_strings")]
    pub expected_assertions: Vec<String>,
    /// Where the new test file should go, relative to the repository root.
    #[serde(alias = "path", alias = "file", deserialize_with = "lenient_string")]
    pub test_path: String,
    /// The test function's name.
    #[serde(alias = "name", deserialize_with = "lenient_string")]
    pub test_name: String,
}

impl TestPlan {
    /// Whether any field is filled.
    pub fn is_informative(&self) -> bool {
        !(self.environment_constraints.is_empty()
            && self.minimal_inputs.is_empty()
            && self.expected_assertions.is_empty()
            && self.test_path.trim().is_empty()
            && self.test_name.trim().is_empty())
    }
}

/// The triadic review of a failing candidate test: issue, test and execution result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReviewVerdict {
    /// The test targets the functionality, trigger conditions and assertions of the issue.
    #[serde(alias = "aligned", alias = "semantic_alignment", alias = "aligns")]
    #[serde(deserialize_with = "lenient_bool")]
    pub aligns_with_issue: bool,
    /// The failure comes from the test's logic, not a setup, import or fixture error.
    #[serde(alias = "failure_consistent_with_test_logic", alias = "valid_failure")]
    #[serde(alias = "failure_from_logic", deserialize_with = "lenient_bool")]
    pub failure_from_test_logic: bool,
    /// The failure matches the reported error message, exception type or failure pattern.
    #[serde(alias = "matches_symptom", alias = "matches_issue_symptom")]
    #[serde(alias = "symptom_match", deserialize_with = "lenient_bool")]
    pub matches_reported_symptom: bool,
    /// What to change when a check fails.
    #[serde(alias = "suggestions", alias = "comments", alias = "reason")]
    #[serde(deserialize_with = "lenient_string")]
    pub feedback: String,
}

impl ReviewVerdict {
    /// All three checks hold.
    pub fn passed(&self) -> bool {
        self.aligns_with_issue && self.failure_from_test_logic && self.matches_reported_symptom
    }
}

/// Object keys by which a review verdict is recognised (any one suffices).
const VERDICT_KEYS: &[&str] = &[
    "aligns_with_issue",
    "aligned",
    "semantic_alignment",
    "aligns",
    "failure_from_test_logic",
    "failure_consistent_with_test_logic",
    "valid_failure",
    "failure_from_logic",
    "matches_reported_symptom",
    "matches_symptom",
    "matches_issue_symptom",
    "symptom_match",
];

/// A stage output parsed from a model's JSON object.
pub trait StageOutput: DeserializeOwned {
    /// Whether `object` carries this stage's answer (not just any JSON).
    fn recognises(object: &serde_json::Map<String, Value>) -> bool;
    /// Whether the parsed answer says anything.
    fn informative(&self) -> bool;

    /// Parses `value`, or the single object nested in it (`{"localization": {...}}`).
    fn from_json(value: &Value) -> Option<Self> {
        let object = value.as_object()?;
        let candidate = if Self::recognises(object) {
            value
        } else {
            let mut values = object.values();
            match (values.next(), values.next()) {
                (Some(inner @ Value::Object(map)), None) if Self::recognises(map) => inner,
                _ => return None,
            }
        };
        serde_json::from_value::<Self>(candidate.clone())
            .ok()
            .filter(Self::informative)
    }
}

fn has_any_key(object: &serde_json::Map<String, Value>, keys: &[&str]) -> bool {
    keys.iter().any(|k| object.contains_key(*k))
}

impl StageOutput for Localization {
    fn recognises(object: &serde_json::Map<String, Value>) -> bool {
        has_any_key(
            object,
            &[
                "files",
                "suspicious_files",
                "functions",
                "suspicious_functions",
                "classes",
                "symbols",
                "functions_or_classes",
                "lines",
                "suspicious_lines",
                "regions",
                "code_regions",
            ],
        )
    }
    fn informative(&self) -> bool {
        self.is_informative()
    }
}

impl StageOutput for RootCause {
    fn recognises(object: &serde_json::Map<String, Value>) -> bool {
        has_any_key(object, &["summary", "root_cause_summary"])
            || object.get("root_cause").is_some_and(Value::is_string)
    }
    fn informative(&self) -> bool {
        self.is_informative()
    }
}

impl StageOutput for TestPlan {
    fn recognises(object: &serde_json::Map<String, Value>) -> bool {
        has_any_key(
            object,
            &[
                "environment_constraints",
                "environment",
                "setup",
                "preconditions",
                "minimal_inputs",
                "inputs",
                "test_inputs",
                "test_input_construction",
                "expected_assertions",
                "assertions",
                "expected_assertion",
                "test_path",
                "test_name",
            ],
        )
    }
    fn informative(&self) -> bool {
        self.is_informative()
    }
}

impl StageOutput for ReviewVerdict {
    fn recognises(object: &serde_json::Map<String, Value>) -> bool {
        has_any_key(object, VERDICT_KEYS)
    }
    fn informative(&self) -> bool {
        true
    }
}

/// Strips decorations models put around repository paths: quotes, backticks, `./`, a leading
/// `/`, the `/testbed/` checkout prefix of SWE-bench images, and `a/` or `b/` diff prefixes.
pub fn normalize_repo_path(path: &str) -> String {
    let mut p = path
        .trim()
        .trim_matches(|c| matches!(c, '`' | '"' | '\'' | '*'))
        .trim();
    for prefix in ["/testbed/", "testbed/"] {
        if let Some(rest) = p.strip_prefix(prefix) {
            p = rest;
        }
    }
    while let Some(rest) = p.strip_prefix("./") {
        p = rest;
    }
    p = p.trim_start_matches('/');
    p.to_string()
}

/// A confidence in 0..1 from a number (`0.8`; `80` read as percent), a numeric string (`"0.8"`,
/// `"80%"`) or a word (`"high"`, `"medium"`, `"low"`); anything else is 0.
pub fn confidence_from_value(value: &Value) -> f64 {
    let raw = match value {
        Value::Number(n) => n.as_f64().unwrap_or(0.0),
        Value::String(s) => confidence_from_text(s),
        _ => 0.0,
    };
    let scaled = if raw > 1.0 && raw <= 100.0 {
        raw / 100.0
    } else {
        raw
    };
    if scaled.is_finite() {
        scaled.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

fn confidence_from_text(text: &str) -> f64 {
    let t = text.trim().to_ascii_lowercase();
    let numeric = t.trim_end_matches('%').trim();
    if let Ok(x) = numeric.parse::<f64>() {
        return if t.ends_with('%') { x / 100.0 } else { x };
    }
    if let Some(x) = t
        .split_whitespace()
        .next()
        .and_then(|w| w.trim_end_matches('%').parse::<f64>().ok())
    {
        return if t
            .split_whitespace()
            .next()
            .is_some_and(|w| w.ends_with('%'))
        {
            x / 100.0
        } else {
            x
        };
    }
    let words: &[(&str, f64)] = &[
        ("very high", 0.95),
        ("very low", 0.1),
        ("medium-high", 0.75),
        ("medium-low", 0.4),
        ("high", 0.9),
        ("certain", 0.95),
        ("medium", 0.6),
        ("moderate", 0.6),
        ("low", 0.3),
    ];
    words
        .iter()
        .find(|(w, _)| t.starts_with(w))
        .map_or(0.0, |(_, x)| *x)
}

fn lenient_confidence<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(confidence_from_value(&Value::deserialize(d)?))
}

fn lenient_line<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    Ok(line_range(&Value::deserialize(d)?).map_or(0, |(start, _)| start))
}

/// A string from any JSON value (`null` is empty; numbers and objects are rendered).
fn lenient_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(value_to_text(&Value::deserialize(d)?))
}

/// A boolean from `true`, `"yes"`, `"pass"`, `1` and the like; anything else is false.
fn lenient_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Bool(b) => b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => matches!(
            s.trim().to_ascii_lowercase().as_str(),
            "true" | "yes" | "y" | "pass" | "passed" | "ok" | "1"
        ),
        _ => false,
    })
}

/// A list of strings from an array of anything, a single string, or `null`.
fn lenient_strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Null => Vec::new(),
        Value::Array(items) => items
            .iter()
            .map(value_to_text)
            .filter(|s| !s.trim().is_empty())
            .collect(),
        other => vec![value_to_text(&other)]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect(),
    })
}

/// A list of `T` from an array (items that do not parse are dropped), a single item, or `null`.
fn lenient_list<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Vec<T>, D::Error> {
    let items = match Value::deserialize(d)? {
        Value::Null => Vec::new(),
        Value::Array(items) => items,
        other => vec![other],
    };
    Ok(items
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect())
}

/// Text for a JSON value: strings as they are, objects as `key: value; …`, the rest as JSON.
fn value_to_text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| format!("{k}: {}", value_to_text(v)))
            .collect::<Vec<_>>()
            .join("; "),
        Value::Array(items) => items
            .iter()
            .map(value_to_text)
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn confidence_accepts_numbers_percent_numeric_strings_and_words() {
        assert_eq!(confidence_from_value(&json!(0.8)), 0.8);
        assert_eq!(confidence_from_value(&json!(80)), 0.8);
        assert_eq!(confidence_from_value(&json!("0.7")), 0.7);
        assert_eq!(confidence_from_value(&json!("85%")), 0.85);
        assert_eq!(confidence_from_value(&json!("high")), 0.9);
        assert_eq!(confidence_from_value(&json!("Medium")), 0.6);
        assert_eq!(confidence_from_value(&json!("low")), 0.3);
        assert_eq!(confidence_from_value(&json!("very high")), 0.95);
        assert_eq!(confidence_from_value(&json!("unsure")), 0.0);
        assert_eq!(confidence_from_value(&json!(null)), 0.0);
        assert_eq!(confidence_from_value(&json!(-3)), 0.0);
        assert_eq!(confidence_from_value(&json!(1000)), 1.0);
    }

    #[test]
    fn localization_parses_with_missing_fields_aliases_and_bare_paths() {
        let v = json!({
            "suspicious_files": ["pkg/a.py", {"file": "pkg/b.py", "confidence": "high"}, 42],
            "functions": {"path": "pkg/a.py", "function": "A.run", "rationale": "raises"},
            "lines": [
                {"path": "pkg/a.py", "lines": "10-14", "confidence": "0.5"},
                {"path": "pkg/a.py", "start_line": "20"}
            ]
        });
        let loc = Localization::from_json(&v).unwrap();
        assert_eq!(loc.files.len(), 2, "the number 42 is not a suspect");
        assert_eq!(loc.files[0].path, "pkg/a.py");
        assert_eq!(loc.files[1].confidence, 0.9);
        assert_eq!(loc.functions[0].name, "A.run");
        assert_eq!(loc.functions[0].confidence, 0.0);
        assert_eq!((loc.lines[0].start_line, loc.lines[0].end_line), (10, 14));
        assert_eq!(loc.lines[0].confidence, 0.5);
        assert_eq!((loc.lines[1].start_line, loc.lines[1].end_line), (20, 20));
        assert_eq!(loc.ranked_files(), vec!["pkg/a.py", "pkg/b.py"]);
    }

    #[test]
    fn stage_outputs_reject_unrelated_or_empty_objects_and_unwrap_one_level() {
        assert!(Localization::from_json(&json!({"files": []})).is_none());
        assert!(RootCause::from_json(&json!({"answer": 42})).is_none());
        assert!(TestPlan::from_json(&json!([1, 2])).is_none());
        let wrapped = json!({"root_cause": {"summary": "off by one", "confidence": "low"}});
        let rc = RootCause::from_json(&wrapped).unwrap();
        assert_eq!(rc.summary, "off by one");
        assert_eq!(rc.confidence, 0.3);
    }

    #[test]
    fn root_cause_renders_structured_path_steps_as_text() {
        let v = json!({
            "summary": "s",
            "error_category": null,
            "execution_path": [{"location": "a.py:3", "behavior": "calls f"}, "f returns None"],
            "trigger_conditions": "empty input",
            "confidence": 0.9
        });
        let rc = RootCause::from_json(&v).unwrap();
        assert_eq!(rc.error_category, "");
        assert_eq!(rc.execution_path.len(), 2);
        assert!(rc.execution_path[0].contains("location: a.py:3"));
        assert!(rc.execution_path[0].contains("behavior: calls f"));
        assert_eq!(rc.execution_path[1], "f returns None");
        assert_eq!(rc.trigger_conditions, vec!["empty input"]);
    }

    #[test]
    fn verdict_reads_word_booleans_and_passes_only_when_all_three_hold() {
        let v = json!({
            "aligns_with_issue": "yes",
            "failure_from_test_logic": true,
            "matches_reported_symptom": "PASS",
            "feedback": "fine"
        });
        assert!(ReviewVerdict::from_json(&v).unwrap().passed());
        let partial = json!({"aligns_with_issue": true, "failure_from_test_logic": "no"});
        let verdict = ReviewVerdict::from_json(&partial).unwrap();
        assert!(!verdict.passed());
        assert!(
            !verdict.matches_reported_symptom,
            "a missing check counts as failed"
        );
    }

    #[test]
    fn repo_paths_lose_decorations() {
        assert_eq!(
            normalize_repo_path(" `./tests/test_x.py` "),
            "tests/test_x.py"
        );
        assert_eq!(normalize_repo_path("/testbed/pkg/a.py"), "pkg/a.py");
        assert_eq!(normalize_repo_path("/pkg/a.py"), "pkg/a.py");
    }
}
