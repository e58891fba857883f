//! What the process sandbox checks on the host instead of changing it: system packages, build
//! packages and locales an environment's recipe names.

use super::*;

impl ProcessSandbox {
    /// Those of `wanted` (named `KIND:NAME` in the memo) that `missing` reports absent; present
    /// ones are remembered.
    fn missing_on_host<E>(
        &self,
        kind: &str,
        wanted: &[String],
        missing: impl FnOnce(&[String]) -> Result<Vec<String>, E>,
    ) -> Result<Vec<String>, E> {
        let key = |w: &String| format!("{kind}:{w}");
        let unknown: Vec<String> = {
            let memo = self.on_host.lock().expect("memo lock");
            wanted
                .iter()
                .filter(|w| !memo.contains(&key(w)))
                .cloned()
                .collect()
        };
        if unknown.is_empty() {
            return Ok(Vec::new());
        }
        let absent = missing(&unknown)?;
        let mut memo = self.on_host.lock().expect("memo lock");
        memo.extend(unknown.iter().filter(|u| !absent.contains(u)).map(key));
        Ok(absent)
    }

    /// The recipe's locales the host lacks.
    pub(super) fn locales_missing(&self, recipe: &EnvRecipe) -> Vec<String> {
        self.missing_on_host::<std::convert::Infallible>("locale", &recipe.locales, |w| {
            Ok(crate::locales::missing_on_host(w))
        })
        .unwrap_or_else(|e| match e {})
    }

    /// The system packages the recipe's build needs (a C compiler, ...) are on the host; they
    /// are never installed on it. A host dpkg cannot be asked about is not checked: the build
    /// then fails with its own message if one is missing.
    pub(super) fn build_packages_on_host(&self, recipe: &EnvRecipe) -> Result<(), SandboxError> {
        if recipe.system_packages.is_empty() || !system_packages::dpkg_available() {
            return Ok(());
        }
        let missing = self
            .missing_on_host(
                "pkg",
                &recipe.system_packages,
                system_packages::missing_on_host,
            )
            .map_err(|e| SandboxError::Infra(e.to_string()))?;
        if missing.is_empty() {
            return Ok(());
        }
        Err(SandboxError::BadInput(format!(
            "building {}'s environment needs system packages that SWT-bench's base image has and this host lacks: {}; the process executor never changes this host's packages: install them (`apt-get install -y {}`), or use the docker executor, whose base image has them",
            recipe.repo,
            missing.join(" "),
            missing.join(" ")
        )))
    }
}

/// `cmd` without its system package steps, which would change the host's packages: they are
/// checked instead (the packages they install must be on the host already).
pub(super) fn without_system_steps(cmd: &str, repo: &str) -> Result<String, SandboxError> {
    let split = system_packages::split(cmd);
    if !split.packages.is_empty() {
        let missing = system_packages::missing_on_host(&split.packages).map_err(|e| {
            SandboxError::BadInput(format!(
                "{repo}'s environment installs system packages ({}) with `{cmd}`, and {e}: use the docker executor, where they go into the image",
                split.packages.join(" ")
            ))
        })?;
        if !missing.is_empty() {
            return Err(SandboxError::BadInput(format!(
                "{repo}'s environment installs system packages with `{cmd}`; the process executor never changes this host's packages, and {} {} not installed here: install them (`apt-get install -y {}`), or use the docker executor, where they go into the image",
                missing.join(" "),
                if missing.len() == 1 { "is" } else { "are" },
                missing.join(" ")
            )));
        }
    }
    Ok(split.rest)
}
