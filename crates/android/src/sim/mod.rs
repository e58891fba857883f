//! The `sim` device: self-made app models described as data, run without an emulator. It always
//! says it is a simulator (`backend()` is `sim`). The dataset lives in `datasets/android-sim/`.

pub mod device;
pub mod model;
pub mod render;

pub use device::{SimDevice, SimLatency};
pub use model::{AppModel, ModelError};

use crate::device::{Action, Crash, Device, DeviceError, Hierarchy};
use reprobench_domain::android::AndroidReport;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// `manifest.json` of an android dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Dataset name (`android-sim`).
    pub name: String,
    /// Track (`android`).
    pub track: String,
    /// Folder of app models, relative to the manifest.
    pub apps: String,
    /// Folder of reports, relative to the manifest.
    pub reports: String,
}

/// Crash or non-crash bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BugKind {
    /// The app dies.
    Crash,
    /// Wrong behaviour on screen.
    NonCrash,
}

/// What a verifier checks on screen for a non-crash bug.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Symptom {
    /// Full resource id of the widget.
    pub resource_id: String,
    /// Its (wrong) text when the bug shows.
    pub text: String,
}

/// A bug report in the LTGDroid form plus the sim's ground truth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    /// APK file name (`<package>.apk`).
    pub apk_name: String,
    /// Issue URL (these are self-made reports; the URL says so).
    pub url: String,
    /// Repository name.
    pub repo: String,
    /// Title.
    pub title: String,
    /// Body.
    pub body: String,
    /// Comments.
    pub comments: Vec<String>,
    /// Crash or non-crash.
    #[serde(rename = "type")]
    pub kind: BugKind,
    /// App model name (file stem in `apps/`).
    pub app: String,
    /// A trace that reproduces the bug, starting right after launch.
    pub ground_truth: Vec<Action>,
    /// A similar trace that must not reproduce the bug (a check on the model).
    #[serde(default)]
    pub near_miss: Vec<Action>,
    /// Expected exception class (crash reports).
    #[serde(default)]
    pub exception: Option<String>,
    /// The on-screen symptom (non-crash reports).
    #[serde(default)]
    pub symptom: Option<Symptom>,
}

impl SimReport {
    /// The report as agents see it (no ground truth, verifier or app model name).
    pub fn android_report(&self) -> AndroidReport {
        AndroidReport {
            apk_name: self.apk_name.clone(),
            url: self.url.clone(),
            repo: self.repo.clone(),
            title: self.title.clone(),
            body: self.body.clone(),
            comments: self.comments.clone(),
        }
    }

    /// Whether the device state shows this bug (pure).
    pub fn reproduced(&self, hierarchy: &Hierarchy, crash: Option<&Crash>) -> bool {
        match self.kind {
            BugKind::Crash => match (crash, &self.exception) {
                (Some(c), Some(e)) => c.exception == *e,
                (Some(_), None) => true,
                (None, _) => false,
            },
            BugKind::NonCrash => self.symptom.as_ref().is_some_and(|s| {
                hierarchy
                    .widgets()
                    .iter()
                    .any(|w| w.resource_id == s.resource_id && w.text == s.text)
            }),
        }
    }
}

/// Where the android-sim dataset lives in the source tree (`datasets/android-sim`).
pub fn source_dataset_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets/android-sim")
}

/// A loaded android-sim dataset.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The manifest.
    pub manifest: Manifest,
    /// App models by name.
    pub apps: BTreeMap<String, AppModel>,
    /// Reports by id (file stem).
    pub reports: BTreeMap<String, SimReport>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ModelError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|err| ModelError::Io {
        path: p.clone(),
        err,
    })?;
    serde_json::from_str(&text).map_err(|err| ModelError::Json { path: p, err })
}

fn json_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, ModelError> {
    let rd = std::fs::read_dir(dir).map_err(|err| ModelError::Io {
        path: dir.display().to_string(),
        err,
    })?;
    let mut files: Vec<_> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    Ok(files)
}

fn stem(p: &Path) -> String {
    p.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_string()
}

impl Dataset {
    /// Loads `dir/manifest.json`, every app model and every report; checks that each report names
    /// a known app.
    pub fn load(dir: &Path) -> Result<Dataset, ModelError> {
        let manifest: Manifest = read_json(&dir.join("manifest.json"))?;
        let mut apps = BTreeMap::new();
        for f in json_files(&dir.join(&manifest.apps))? {
            apps.insert(stem(&f), AppModel::load(&f)?);
        }
        let mut reports = BTreeMap::new();
        for f in json_files(&dir.join(&manifest.reports))? {
            let r: SimReport = read_json(&f)?;
            if !apps.contains_key(&r.app) {
                return Err(ModelError::Invalid {
                    package: r.app.clone(),
                    problem: format!("report {} names unknown app `{}`", stem(&f), r.app),
                });
            }
            reports.insert(stem(&f), r);
        }
        Ok(Dataset {
            manifest,
            apps,
            reports,
        })
    }

    /// A fresh device running the app of report `id`, with its package name.
    pub fn device_for(&self, id: &str, latency: SimLatency) -> Option<(SimDevice, String)> {
        let model = self.apps.get(&self.reports.get(id)?.app)?.clone();
        let package = model.package.clone();
        Some((SimDevice::new(model, latency), package))
    }
}

/// Launches the app and plays `actions`, stopping early at a crash; returns the final hierarchy
/// and the crash, if any.
pub async fn replay(
    dev: &dyn Device,
    package: &str,
    actions: &[Action],
) -> Result<(Hierarchy, Option<Crash>), DeviceError> {
    dev.launch(package).await?;
    for a in actions {
        dev.act(a).await?;
        if let Some(c) = dev.crash().await? {
            return Ok((dev.hierarchy().await?, Some(c)));
        }
    }
    Ok((dev.hierarchy().await?, dev.crash().await?))
}

#[cfg(test)]
mod tests;
