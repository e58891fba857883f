//! System package steps of an environment spec (`apt-get update && apt-get install -y X Y`, as
//! SWT-bench's `pre_install` has them). In an image they run as written; on the process executor
//! they would change the host's packages, so they are read instead: the packages they install
//! must already be on the host, and the rest of the command runs. Pure apart from
//! [`missing_on_host`].

/// A shell command with its system package steps taken out.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SplitCommand {
    /// Packages the command's `apt-get install`/`apt install` steps install.
    pub packages: Vec<String>,
    /// The command had a system package step (install, update, upgrade, ...).
    pub had_system_steps: bool,
    /// What remains to run, its `&&` steps in order ("" for nothing).
    pub rest: String,
}

/// Splits `cmd` at `&&` into its system package steps and the rest. A step is a system package
/// step when its program (after `VAR=value` assignments and `sudo`) is `apt-get` or `apt`.
pub fn split(cmd: &str) -> SplitCommand {
    let mut out = SplitCommand::default();
    let mut rest = Vec::new();
    for step in cmd.split("&&").map(str::trim).filter(|s| !s.is_empty()) {
        let words: Vec<&str> = step
            .split_whitespace()
            .skip_while(|w| w.contains('=') && !w.starts_with('-') || *w == "sudo")
            .collect();
        match words.first() {
            Some(&("apt-get" | "apt")) => {
                out.had_system_steps = true;
                let args: Vec<&str> = words[1..]
                    .iter()
                    .copied()
                    .filter(|w| !w.starts_with('-'))
                    .collect();
                if args.first() == Some(&"install") {
                    out.packages.extend(
                        args[1..]
                            .iter()
                            .map(|p| p.trim_matches(['\'', '"']).to_string()),
                    );
                }
            }
            _ => rest.push(step),
        }
    }
    out.rest = rest.join(" && ");
    out
}

/// dpkg could not be asked which packages this host has (not a Debian-based host).
#[derive(Debug, thiserror::Error)]
#[error("cannot ask dpkg which packages this host has ({error})")]
pub struct DpkgQueryError {
    /// Why `dpkg-query` could not run.
    pub error: std::io::Error,
}

/// This host can say which Debian packages it has (dpkg-query runs; asked once per process).
pub fn dpkg_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        std::process::Command::new("dpkg-query")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The packages of `packages` that dpkg does not list as installed on this host; an error when
/// dpkg cannot be asked (not a Debian-based host).
pub fn missing_on_host(packages: &[String]) -> Result<Vec<String>, DpkgQueryError> {
    let mut missing = Vec::new();
    for p in packages {
        // `name=version` pins and `name/suite` choices name the package first.
        let name = p.split(['=', '/']).next().unwrap_or(p);
        let out = std::process::Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", name])
            .output()
            .map_err(|error| DpkgQueryError { error })?;
        let installed = out.status.success()
            && String::from_utf8_lossy(&out.stdout).ends_with("install ok installed");
        if !installed {
            missing.push(name.to_string());
        }
    }
    Ok(missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apt_steps_are_read_and_the_rest_is_kept() {
        let s = split("apt-get update && apt-get install -y libenchant-2-dev hunspell-en-us");
        assert_eq!(s.packages, vec!["libenchant-2-dev", "hunspell-en-us"]);
        assert!(s.had_system_steps);
        assert_eq!(s.rest, "");
        // matplotlib 1.0's spec has an empty step.
        let s = split(
            "apt-get -y update && apt-get -y upgrade && && apt-get install -y imagemagick ffmpeg",
        );
        assert_eq!(s.packages, vec!["imagemagick", "ffmpeg"]);
        let s = split(
            "DEBIAN_FRONTEND=noninteractive sudo apt install -y --no-install-recommends 'locales' && locale-gen en_US.UTF-8 && export LANG=en_US.UTF-8",
        );
        assert_eq!(s.packages, vec!["locales"]);
        assert_eq!(s.rest, "locale-gen en_US.UTF-8 && export LANG=en_US.UTF-8");
        let s = split("sed -i 's/pytest/pytest -rA/' tox.ini");
        assert_eq!(
            s,
            SplitCommand {
                rest: "sed -i 's/pytest/pytest -rA/' tox.ini".into(),
                ..Default::default()
            }
        );
        let s = split("echo apt-get install -y x");
        assert!(!s.had_system_steps && s.packages.is_empty());
    }

    #[test]
    fn installed_packages_are_not_missing() {
        if !dpkg_available() {
            eprintln!("skipped: no dpkg-query on this host");
            return;
        }
        let asked = vec![
            "coreutils".to_string(),
            "reprobench-no-such-package".to_string(),
        ];
        assert_eq!(
            missing_on_host(&asked).unwrap(),
            vec!["reprobench-no-such-package"]
        );
    }
}
