//! The android track's datasets: manifest rows (facts such as the app, the bug type and the
//! ground-truth action count) joined with bug reports in LTGDroid's JSON form
//! (`apk_name, url, repo, title, body, comments`), and the pure half of fetching reports from
//! the GitHub issues API.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

use crate::swt::{LoadError, RowError, load_rows};

/// A bug report as LTGDroid stores it (`REPORT_ID.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AndroidReport {
    /// File name of the APK the report is reproduced on.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub apk_name: String,
    /// The issue's web address.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub url: String,
    /// Repository name (without the owner).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub repo: String,
    /// Issue title.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub title: String,
    /// Issue body (empty when the issue has none).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub body: String,
    /// Comment bodies, oldest first.
    #[serde(default, deserialize_with = "lenient_comments")]
    pub comments: Vec<String>,
}

/// A JSON `null` (or a missing field) reads as the empty string.
fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// Comments as strings, or as objects with a `body` (GitHub's form); `null`s are skipped.
fn lenient_comments<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    use serde::de::Error;
    let items = Option::<Vec<serde_json::Value>>::deserialize(d)?.unwrap_or_default();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match item {
            serde_json::Value::String(s) => out.push(s),
            serde_json::Value::Null => {}
            serde_json::Value::Object(ref o) => match o.get("body") {
                Some(serde_json::Value::String(s)) => out.push(s.clone()),
                Some(serde_json::Value::Null) | None => {}
                Some(other) => {
                    return Err(D::Error::custom(format!(
                        "comment {i}: `body` must be a string, found {other}"
                    )));
                }
            },
            other => {
                return Err(D::Error::custom(format!(
                    "comment {i}: expected a string or an object with `body`, found {other}"
                )));
            }
        }
    }
    Ok(out)
}

/// Whether the bug shows as a crash (detected from logcat) or only on screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BugType {
    /// The app crashes (`FATAL EXCEPTION` in logcat).
    Crash,
    /// A wrong behaviour without a crash.
    #[serde(alias = "non_crash", alias = "noncrash")]
    NonCrash,
}

impl BugType {
    /// The name used in manifests (`crash`, `non-crash`).
    pub fn as_str(self) -> &'static str {
        match self {
            BugType::Crash => "crash",
            BugType::NonCrash => "non-crash",
        }
    }
}

impl std::fmt::Display for BugType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One bug report to reproduce: the manifest's facts and, once joined, the report itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AndroidInstance {
    /// Stable id used in results (`App-NUMBER`).
    pub instance_id: String,
    /// Row number in the source paper's table, when the dataset comes from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paper_id: Option<u32>,
    /// Report id (`App#NUMBER`); the report file is `REPORT_ID.json`.
    pub report_id: String,
    /// App name.
    pub app: String,
    /// Crash or non-crash.
    pub bug_type: BugType,
    /// UI actions of the ground-truth reproduction, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ground_truth_actions: Option<u32>,
    /// The issue's web address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issue_url: Option<String>,
    /// APK file name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apk: Option<String>,
    /// The report, inline in the row or joined from the reports directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<AndroidReport>,
}

/// Where an android dataset's reports come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AndroidSource {
    /// Provenance of the rows (paper and table).
    pub origin: String,
    /// How `datasets fetch` gets the report texts.
    pub reports: ReportSource,
}

/// A service that serves report texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReportSource {
    /// The GitHub issues API, one issue and its comments per row's `issue_url`.
    GithubIssues,
}

/// An android dataset manifest (`datasets/NAME/manifest.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AndroidManifest {
    /// Dataset name.
    pub name: String,
    /// Track (`android`).
    pub track: String,
    /// Rows file, relative to the manifest.
    pub instances: String,
    /// Reports directory, relative to the manifest (filled by `datasets fetch`).
    #[serde(default)]
    pub reports: Option<String>,
    /// Where the rows and reports come from.
    #[serde(default)]
    pub source: Option<AndroidSource>,
}

/// An android dataset read from disk: every row, its report when found, and every problem.
#[derive(Debug, Clone)]
pub struct LoadedAndroidDataset {
    /// Name used in results.
    pub name: String,
    /// Directory of the manifest (None for a plain rows file).
    pub dir: Option<PathBuf>,
    /// The manifest, when there is one.
    pub manifest: Option<AndroidManifest>,
    /// The reports directory used, if any.
    pub reports_dir: Option<PathBuf>,
    /// Usable rows; `report` is None for those listed in `missing_reports` or `errors`.
    pub instances: Vec<AndroidInstance>,
    /// Rows or report files that could not be used.
    pub errors: Vec<RowError>,
    /// Rows whose report file does not exist (yet).
    pub missing_reports: Vec<RowError>,
}

impl LoadedAndroidDataset {
    /// Rows of the given bug type.
    pub fn count(&self, bug_type: BugType) -> usize {
        self.instances
            .iter()
            .filter(|i| i.bug_type == bug_type)
            .count()
    }

    /// Rows that have their report.
    pub fn with_reports(&self) -> impl Iterator<Item = &AndroidInstance> {
        self.instances.iter().filter(|i| i.report.is_some())
    }
}

/// The report file name of a report id (`App#12` → `App#12.json`).
pub fn report_file_name(report_id: &str) -> String {
    format!("{report_id}.json")
}

/// Why an android dataset, a bug report, or a report from GitHub's answer could not be had.
// Underlying errors are in the messages, not `source()`: anyhow's `{:#}` would repeat them.
#[derive(Debug, thiserror::Error)]
pub enum AndroidDatasetError {
    /// The dataset's rows could not be found or read.
    #[error(transparent)]
    Rows(#[from] LoadError),
    /// A file could not be read.
    #[error("cannot read {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A report file that is not JSON, or whose fields have the wrong types.
    #[error(
        "{name}: not a bug report in LTGDroid's form (an object with apk_name, url, repo, title, body, comments): {error}; fix the file or fetch it again"
    )]
    ReportNotParsed {
        /// The report's file name.
        name: String,
        /// What is wrong.
        error: serde_json::Error,
    },
    /// A report file that is JSON but not a report (`defect` says why).
    #[error(
        "{name}: not a bug report in LTGDroid's form (an object with apk_name, url, repo, title, body, comments): {defect}; fix the file or fetch it again"
    )]
    NotAReport {
        /// The report's file name.
        name: String,
        /// What it lacks.
        defect: &'static str,
    },
    /// The reports directory given does not exist.
    #[error(
        "reports directory {} does not exist; pass a directory of REPORT_ID.json files",
        path.display()
    )]
    NoReportsDir {
        /// The directory given.
        path: PathBuf,
    },
    /// A manifest that does not parse.
    #[error("{}: not an android dataset manifest: {error}", path.display())]
    BadManifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        error: serde_json::Error,
    },
    /// A manifest of another track's dataset.
    #[error(
        "{}: dataset `{dataset}` is for the `{track}` track, not android",
        path.display()
    )]
    WrongTrack {
        /// The manifest.
        path: PathBuf,
        /// The dataset's name.
        dataset: String,
        /// Its track.
        track: String,
    },
    /// A manifest whose rows file is not there.
    #[error(
        "dataset `{dataset}` has no rows at {}; restore it from the repository",
        rows.display()
    )]
    NoRows {
        /// The dataset's name.
        dataset: String,
        /// Where its rows should be.
        rows: PathBuf,
    },
    /// GitHub answered with an error message instead of the issue or its comments.
    #[error(
        "GitHub answered `{message}` instead of the {what}; check the issue URL, or set GITHUB_TOKEN if rate limited"
    )]
    GithubRefused {
        /// What was asked for (`issue`, `comments array`).
        what: &'static str,
        /// GitHub's message.
        message: String,
    },
    /// GitHub's answer is not the issue or comments it should be.
    #[error("the {what} is not in the GitHub API's form")]
    NotGithubForm {
        /// What was asked for (`issue`, `comments array`).
        what: &'static str,
    },
    /// The issue's own address is not a GitHub issue address.
    #[error("the issue's html_url `{url}` is not a GitHub issue address")]
    NotAnIssueAddress {
        /// The issue's `html_url`.
        url: String,
    },
}

/// Parses a report file's text (a JSON object with at least a `title`); `name` names the file
/// in errors.
pub fn parse_android_report(name: &str, text: &str) -> Result<AndroidReport, AndroidDatasetError> {
    let not_parsed = |error| AndroidDatasetError::ReportNotParsed {
        name: name.to_string(),
        error,
    };
    let not_a_report = |defect| AndroidDatasetError::NotAReport {
        name: name.to_string(),
        defect,
    };
    let value: serde_json::Value = serde_json::from_str(text).map_err(not_parsed)?;
    match value.get("title") {
        Some(serde_json::Value::String(_)) => {}
        _ if !value.is_object() => return Err(not_a_report("not a JSON object")),
        _ => return Err(not_a_report("no `title` string")),
    }
    serde_json::from_value(value).map_err(not_parsed)
}

/// Reads one report file.
pub fn load_android_report(path: &Path) -> Result<AndroidReport, AndroidDatasetError> {
    let text = std::fs::read_to_string(path).map_err(|error| AndroidDatasetError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    parse_android_report(&path.display().to_string(), &text)
}

/// Loads an android dataset by name (a directory under `datasets_dir` with a manifest), by
/// directory, or from a JSONL/JSON rows file, and joins each row with `REPORT_ID.json` from
/// `reports_dir` (default: the manifest's `reports`). A row whose report is missing or broken
/// stays in `instances` without a report and is listed in `missing_reports` or `errors`.
pub fn load_android_dataset(
    name_or_path: &str,
    datasets_dir: &Path,
    reports_dir: Option<&Path>,
) -> Result<LoadedAndroidDataset, AndroidDatasetError> {
    let dir = crate::swt::dataset_location(name_or_path, datasets_dir, "android dataset")?;
    let as_path = Path::new(name_or_path);
    if let Some(r) = reports_dir
        && !r.is_dir()
    {
        return Err(AndroidDatasetError::NoReportsDir {
            path: r.to_path_buf(),
        });
    }
    let (name, rows_path, manifest, manifest_reports) = match &dir {
        Some(d) => {
            let mpath = d.join("manifest.json");
            let text =
                std::fs::read_to_string(&mpath).map_err(|error| AndroidDatasetError::Read {
                    path: mpath.clone(),
                    error,
                })?;
            let m: AndroidManifest =
                serde_json::from_str(&text).map_err(|error| AndroidDatasetError::BadManifest {
                    path: mpath.clone(),
                    error,
                })?;
            if m.track != "android" {
                return Err(AndroidDatasetError::WrongTrack {
                    path: mpath,
                    dataset: m.name,
                    track: m.track,
                });
            }
            let rows = d.join(&m.instances);
            if !rows.is_file() {
                return Err(AndroidDatasetError::NoRows {
                    dataset: m.name,
                    rows,
                });
            }
            let reports = m.reports.as_ref().map(|r| d.join(r));
            (m.name.clone(), rows, Some(m), reports)
        }
        None => {
            let stem = as_path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("dataset")
                .to_string();
            (stem, as_path.to_path_buf(), None, None)
        }
    };
    let reports_dir = reports_dir.map(Path::to_path_buf).or(manifest_reports);
    let parsed = load_rows::<AndroidInstance>(&rows_path)?;
    let fetch_hint = match &manifest {
        Some(m) if m.source.is_some() => format!("run `reprobench datasets fetch {}`", m.name),
        _ => "pass a reports directory that has it".to_string(),
    };
    let mut out = LoadedAndroidDataset {
        name,
        dir,
        manifest,
        reports_dir: reports_dir.clone(),
        instances: Vec::new(),
        errors: parsed.errors,
        missing_reports: Vec::new(),
    };
    let mut seen = std::collections::BTreeSet::new();
    for mut inst in parsed.rows {
        let location = rows_path.display().to_string();
        if !seen.insert(inst.instance_id.clone()) {
            out.errors.push(RowError {
                location,
                instance_id: Some(inst.instance_id.clone()),
                message: "duplicate instance_id; keep one row per id".into(),
            });
            continue;
        }
        if inst.report.is_none() {
            join_report(&mut inst, reports_dir.as_deref(), &fetch_hint, &mut out);
        }
        out.instances.push(inst);
    }
    Ok(out)
}

/// Attaches `REPORT_ID.json` from `reports_dir` to `inst`, or records why it could not.
fn join_report(
    inst: &mut AndroidInstance,
    reports_dir: Option<&Path>,
    fetch_hint: &str,
    out: &mut LoadedAndroidDataset,
) {
    let file = report_file_name(&inst.report_id);
    let Some(dir) = reports_dir else {
        out.missing_reports.push(RowError {
            location: file,
            instance_id: Some(inst.instance_id.clone()),
            message: format!("no reports directory; {fetch_hint}"),
        });
        return;
    };
    let path = dir.join(&file);
    if !path.is_file() {
        out.missing_reports.push(RowError {
            location: path.display().to_string(),
            instance_id: Some(inst.instance_id.clone()),
            message: format!("no report file; {fetch_hint}"),
        });
        return;
    }
    match load_android_report(&path) {
        Ok(report) => {
            if let Some(url) = &inst.issue_url
                && !report.url.is_empty()
                && report.url.trim_end_matches('/') != url.trim_end_matches('/')
            {
                out.errors.push(RowError {
                    location: path.display().to_string(),
                    instance_id: Some(inst.instance_id.clone()),
                    message: format!(
                        "report is for {} but the row's issue is {url}; replace the file",
                        report.url
                    ),
                });
                return;
            }
            inst.report = Some(report);
        }
        Err(e) => out.errors.push(RowError {
            location: path.display().to_string(),
            instance_id: Some(inst.instance_id.clone()),
            message: e.to_string(),
        }),
    }
}

/// Owner, repository and number of a GitHub issue or pull-request address.
fn github_issue_parts(issue_url: &str) -> Option<(&str, &str, u64)> {
    let rest = issue_url
        .trim()
        .strip_prefix("https://")
        .or_else(|| issue_url.trim().strip_prefix("http://"))?;
    let rest = rest.strip_prefix("www.").unwrap_or(rest);
    let rest = rest.strip_prefix("github.com/")?;
    let rest = rest.split(['?', '#']).next()?.trim_end_matches('/');
    let mut parts = rest.split('/');
    let (owner, repo, kind, number) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || owner.is_empty()
        || repo.is_empty()
        || !matches!(kind, "issues" | "pull" | "pulls")
    {
        return None;
    }
    Some((owner, repo, number.parse().ok()?))
}

/// The GitHub API address of an issue (`https://github.com/o/r/issues/7` →
/// `https://api.github.com/repos/o/r/issues/7`); None for anything else.
pub fn github_api_url(issue_url: &str) -> Option<String> {
    let (owner, repo, n) = github_issue_parts(issue_url)?;
    Some(format!(
        "https://api.github.com/repos/{owner}/{repo}/issues/{n}"
    ))
}

/// The GitHub API address of an issue's comments (first 100); None for a non-issue address.
pub fn github_comments_api_url(issue_url: &str) -> Option<String> {
    github_api_url(issue_url).map(|u| format!("{u}/comments?per_page=100"))
}

/// Builds a report from the GitHub API's issue object and comments array; `apk_name` comes from
/// the manifest row. Errors name what GitHub answered instead (not found, rate limit).
pub fn report_from_github_issue(
    issue_json: &serde_json::Value,
    comments_json: &serde_json::Value,
    apk_name: &str,
) -> Result<AndroidReport, AndroidDatasetError> {
    let api_error =
        |what: &'static str, v: &serde_json::Value| match v.get("message").and_then(|m| m.as_str())
        {
            Some(m) => AndroidDatasetError::GithubRefused {
                what,
                message: m.to_string(),
            },
            None => AndroidDatasetError::NotGithubForm { what },
        };
    let issue = issue_json
        .as_object()
        .filter(|o| o.contains_key("title"))
        .ok_or_else(|| api_error("issue", issue_json))?;
    let text = |k: &str| {
        issue
            .get(k)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let url = text("html_url");
    let repo = github_issue_parts(&url)
        .map(|(_, r, _)| r.to_string())
        .ok_or_else(|| AndroidDatasetError::NotAnIssueAddress { url: url.clone() })?;
    let comments = comments_json
        .as_array()
        .ok_or_else(|| api_error("comments array", comments_json))?
        .iter()
        .filter_map(|c| c.get("body").and_then(|b| b.as_str()).map(str::to_string))
        .collect();
    Ok(AndroidReport {
        apk_name: apk_name.to_string(),
        url,
        repo,
        title: text("title"),
        body: text("body"),
        comments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_urls_from_issue_addresses() {
        let api = "https://api.github.com/repos/k3b/APhotoManager/issues/116";
        for u in [
            "https://github.com/k3b/APhotoManager/issues/116",
            "https://github.com/k3b/APhotoManager/issues/116/",
            "http://www.github.com/k3b/APhotoManager/issues/116#issuecomment-1",
            "https://github.com/k3b/APhotoManager/pull/116?x=1",
        ] {
            assert_eq!(github_api_url(u).as_deref(), Some(api), "{u}");
        }
        assert_eq!(
            github_comments_api_url("https://github.com/a/b/issues/3").as_deref(),
            Some("https://api.github.com/repos/a/b/issues/3/comments?per_page=100")
        );
        for bad in [
            "https://gitlab.com/a/b/issues/1",
            "https://github.com/a/b",
            "https://github.com/a/b/issues/x",
            "https://github.com/a/b/wiki/1",
            "https://github.com/a/b/issues/1/extra",
            "github.com/a/b/issues/1",
        ] {
            assert_eq!(github_api_url(bad), None, "{bad}");
        }
    }

    #[test]
    fn lenient_report_fields() {
        let r = parse_android_report(
            "x.json",
            r#"{"apk_name":"a.apk","url":"u","repo":"r","title":"t","body":null,
                "comments":["one",{"body":"two","user":{}},null,{"body":null}]}"#,
        )
        .unwrap();
        assert_eq!(r.body, "");
        assert_eq!(r.comments, ["one", "two"]);
        let e = parse_android_report("x.json", r#"{"title":"t","comments":[1]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.json: ") && e.contains("comment 0"), "{e}");
    }

    #[test]
    fn bug_type_names() {
        let b: BugType = serde_json::from_str("\"non-crash\"").unwrap();
        assert_eq!(b, BugType::NonCrash);
        let b: BugType = serde_json::from_str("\"non_crash\"").unwrap();
        assert_eq!(b.to_string(), "non-crash");
        assert!(serde_json::from_str::<BugType>("\"hang\"").is_err());
    }
}

/// Attachment key of an android dataset's rows (`android:NAME`).
pub fn android_rows_key(name: &str) -> String {
    format!("android:{name}")
}

/// A row of an android dataset as a sweep carries it: the node holds the apps and reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AndroidRow {
    /// Report id (the instance).
    pub instance_id: String,
    /// App (the affinity key: a device with the app installed is warm for it).
    pub app: String,
    /// Crash or non-crash.
    pub bug_type: BugType,
    /// Actions in the ground-truth reproduction.
    pub ground_truth_actions: Option<u32>,
    /// Whether the row is a real app's report (run on an emulator) rather than a simulator
    /// suite's (absent: `sim`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub real_app: bool,
}

/// What an android task tells the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AndroidPayload {
    /// Dataset name (the node looks the report and app up in it).
    pub dataset: String,
    /// The report.
    pub instance_id: String,
    /// Agent name.
    pub agent: String,
    /// Variant.
    pub variant: String,
    /// Seed of anything random the agent does.
    pub seed: u64,
    /// UI actions allowed.
    pub max_actions: u32,
    /// Minutes allowed.
    pub max_minutes: f64,
    /// The backbone of an LLM agent (none for gold-trace and monkey).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backbone: Option<crate::sweep::BackboneSpec>,
    /// The task's whole budget (LLM calls, tokens, cost) for an LLM agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::sweep::Budget>,
}
