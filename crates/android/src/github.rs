//! Android bug reports from GitHub issues (`datasets fetch` of a dataset whose manifest says
//! its reports are GitHub issues): which rows need a fetch and where their files go (pure), and
//! the GitHub REST calls that turn one row's issue and comments into a report file in
//! LTGDroid's form. The command around it (reachability, progress, the summary) is the binary's.

use reprobench_domain::android::{
    AndroidInstance, github_api_url, github_comments_api_url, report_file_name,
    report_from_github_issue,
};
use std::path::{Path, PathBuf};

/// Environment variable that overrides the GitHub API base (a mirror, or a test's server).
pub const GITHUB_API_ENV: &str = "REPROBENCH_GITHUB_API";

/// The GitHub REST API base used when `REPROBENCH_GITHUB_API` is not set.
pub const GITHUB_API_DEFAULT: &str = "https://api.github.com";

/// One report to fetch: a row's issue and comments addresses and the file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportJob {
    /// The row.
    pub instance_id: String,
    /// The issue's API address.
    pub issue_api: String,
    /// Its comments' API address.
    pub comments_api: String,
    /// The app's APK file name, written into the report.
    pub apk: String,
    /// The report file to write.
    pub file: PathBuf,
}

/// Which rows need fetching, which are there already, and which cannot be fetched.
#[derive(Debug, Default)]
pub struct ReportPlan {
    /// Rows to fetch.
    pub jobs: Vec<ReportJob>,
    /// Rows whose report file is there already.
    pub present: usize,
    /// Rows that cannot be fetched, with the reason.
    pub failed: Vec<(String, String)>,
}

/// An address made for `api.github.com`, under another API base.
pub fn at_api_base(api_url: &str, base: &str) -> String {
    match api_url.strip_prefix(GITHUB_API_DEFAULT) {
        Some(rest) => format!("{}{rest}", base.trim_end_matches('/')),
        None => api_url.to_string(),
    }
}

/// Plans a report fetch (pure apart from `exists`): rows whose file exists are skipped (so a
/// fetch resumes), rows without a GitHub issue address fail with the reason.
pub fn plan_reports(
    instances: &[AndroidInstance],
    reports_dir: &Path,
    base: &str,
    exists: impl Fn(&Path) -> bool,
) -> ReportPlan {
    let mut plan = ReportPlan::default();
    for inst in instances {
        let file = reports_dir.join(report_file_name(&inst.report_id));
        if exists(&file) {
            plan.present += 1;
            continue;
        }
        let url = inst.issue_url.as_deref().unwrap_or_default();
        match (github_api_url(url), github_comments_api_url(url)) {
            (Some(issue), Some(comments)) => plan.jobs.push(ReportJob {
                instance_id: inst.instance_id.clone(),
                issue_api: at_api_base(&issue, base),
                comments_api: at_api_base(&comments, base),
                apk: inst.apk.clone().unwrap_or_default(),
                file,
            }),
            _ => plan.failed.push((
                inst.instance_id.clone(),
                format!("issue_url `{url}` is not a GitHub issue address; fix the row"),
            )),
        }
    }
    plan
}

/// GETs a GitHub API address; the JSON body even on an error status (GitHub explains itself).
async fn github_get(client: &reqwest::Client, url: &str) -> Result<serde_json::Value, String> {
    let mut req = client
        .get(url)
        .header(reqwest::header::ACCEPT, "application/vnd.github+json");
    if let Ok(token) = std::env::var("GITHUB_TOKEN")
        && !token.trim().is_empty()
    {
        req = req.bearer_auth(token.trim());
    }
    let failed = |e: reqwest::Error| {
        let mut msg = format!("GET {url}: {e}");
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg.push_str(&format!(": {s}"));
            source = s.source();
        }
        msg
    };
    let resp = req.send().await.map_err(failed)?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(failed)?;
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(v) => Ok(v),
        Err(_) => Err(format!("GET {url}: HTTP {status}, not a JSON answer")),
    }
}

/// Fetches one row's issue and comments and writes its report file.
pub async fn fetch_report(client: &reqwest::Client, job: &ReportJob) -> Result<(), String> {
    let issue = github_get(client, &job.issue_api).await?;
    // An error answer for the issue makes the comments pointless; say what GitHub said.
    let comments = if issue.get("title").is_some() {
        github_get(client, &job.comments_api).await?
    } else {
        serde_json::Value::Array(vec![])
    };
    let report =
        report_from_github_issue(&issue, &comments, &job.apk).map_err(|e| e.to_string())?;
    let text = serde_json::to_string_pretty(&report).expect("a report serializes");
    // Write beside and rename, so an interrupted fetch never leaves half a file behind.
    let tmp = job.file.with_extension("json.part");
    std::fs::write(&tmp, text + "\n")
        .and_then(|()| std::fs::rename(&tmp, &job.file))
        .map_err(|e| format!("cannot write {}: {e}", job.file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reprobench_domain::android::{AndroidInstance, BugType};

    fn row(id: &str, url: &str) -> AndroidInstance {
        AndroidInstance {
            instance_id: id.into(),
            paper_id: None,
            report_id: id.replace('-', "#"),
            app: "App".into(),
            bug_type: BugType::Crash,
            ground_truth_actions: None,
            issue_url: Some(url.into()),
            apk: Some("App.apk".into()),
            report: None,
        }
    }

    #[test]
    fn plan_skips_present_files_and_reports_bad_rows() {
        let rows = [
            row("App-1", "https://github.com/o/App/issues/1"),
            row("App-2", "https://github.com/o/App/issues/2"),
            row("App-3", "https://example.com/o/App/issues/3"),
        ];
        let dir = Path::new("/r");
        let plan = plan_reports(&rows, dir, "http://127.0.0.1:9/", |p| {
            p.ends_with("App#1.json")
        });
        assert_eq!(plan.present, 1);
        assert_eq!(plan.jobs.len(), 1);
        assert_eq!(
            plan.jobs[0].issue_api,
            "http://127.0.0.1:9/repos/o/App/issues/2"
        );
        assert_eq!(
            plan.jobs[0].comments_api,
            "http://127.0.0.1:9/repos/o/App/issues/2/comments?per_page=100"
        );
        assert_eq!(plan.jobs[0].file, Path::new("/r/App#2.json"));
        assert_eq!(plan.failed.len(), 1);
        assert_eq!(plan.failed[0].0, "App-3");
        assert_eq!(
            at_api_base(
                "https://api.github.com/repos/a/b/issues/1",
                GITHUB_API_DEFAULT
            ),
            "https://api.github.com/repos/a/b/issues/1"
        );
    }
}
