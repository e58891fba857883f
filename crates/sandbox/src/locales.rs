//! Locales an environment needs (`en_US.UTF-8` for django 3.x, whose SWT-bench `eval_commands`
//! generate it with `locale-gen`). A container image has them all; on the process executor the
//! host's are used when it has them, and otherwise they are compiled with `localedef` into the
//! environment's own directory and found through `LOCPATH`: the host's system is never changed.
//! Pure apart from [`on_host`] and [`compile`].

use std::path::Path;

/// A locale name's parts: `de_DE.ISO-8859-1@euro` → (`de_DE`, `ISO-8859-1`, `@euro`); `None`
/// for a name without a codeset (`C`, `POSIX`).
fn parts(name: &str) -> Option<(&str, &str, &str)> {
    let (lang, rest) = name.split_once('.')?;
    let (codeset, modifier) = match rest.find('@') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    Some((lang, codeset, modifier))
}

/// `en_US.UTF-8` as `locale -a` lists it (`en_US.utf8`): the codeset lower-cased without `-`.
pub fn normalized(name: &str) -> String {
    match parts(name) {
        Some((lang, codeset, modifier)) => {
            let codeset: String = codeset
                .chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .map(|c| c.to_ascii_lowercase())
                .collect();
            format!("{lang}.{codeset}{modifier}")
        }
        None => name.to_string(),
    }
}

/// `localedef`'s source and charmap for a locale name: `en_US.UTF-8` → (`en_US`, `UTF-8`);
/// `None` for a name without a codeset.
pub fn definition(name: &str) -> Option<(String, String)> {
    let (lang, codeset, modifier) = parts(name)?;
    if lang.is_empty() || codeset.is_empty() {
        return None;
    }
    Some((format!("{lang}{modifier}"), codeset.to_string()))
}

/// The locales of `wanted` that `locale -a` does not list on this host (all of them when it
/// cannot run).
pub fn missing_on_host(wanted: &[String]) -> Vec<String> {
    let listed = on_host();
    wanted
        .iter()
        .filter(|w| !listed.contains(&normalized(w)))
        .cloned()
        .collect()
}

/// The host's locales as `locale -a` lists them.
fn on_host() -> Vec<String> {
    std::process::Command::new("locale")
        .arg("-a")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| normalized(l.trim()))
                .collect()
        })
        .unwrap_or_default()
}

/// Compiles `name` with `localedef` into `dir/NAME`, where glibc finds it with `LOCPATH=dir`.
pub fn compile(dir: &Path, name: &str) -> Result<(), String> {
    let (source, charmap) = definition(name)
        .ok_or_else(|| format!("`{name}` is not a locale name of the form LANG.CODESET"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let out = std::process::Command::new("localedef")
        .args(["-i", &source, "-f", &charmap])
        .arg(dir.join(name))
        .output()
        .map_err(|e| {
            format!("cannot run localedef ({e}): install the `locales` package (`apt-get install -y locales`), or generate {name} on the host (`locale-gen {name}`)")
        })?;
    // localedef exits 1 on warnings with the locale written.
    if dir.join(name).join("LC_CTYPE").is_file() {
        return Ok(());
    }
    Err(format!(
        "localedef could not compile {name} (exit {}): {}; install the `locales` package (`apt-get install -y locales`), or generate {name} on the host (`locale-gen {name}`)",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_as_locale_lists_them() {
        assert_eq!(normalized("en_US.UTF-8"), "en_US.utf8");
        assert_eq!(normalized("en_US.utf8"), "en_US.utf8");
        assert_eq!(normalized("de_DE.ISO-8859-1@euro"), "de_DE.iso88591@euro");
        assert_eq!(normalized("C"), "C");
        assert_eq!(
            definition("en_US.UTF-8"),
            Some(("en_US".into(), "UTF-8".into()))
        );
        assert_eq!(
            definition("de_DE.ISO-8859-15@euro"),
            Some(("de_DE@euro".into(), "ISO-8859-15".into()))
        );
        assert_eq!(definition("C"), None);
    }

    #[test]
    fn a_compiled_locale_is_found_through_locpath() {
        let dir = tempfile::tempdir().unwrap();
        if let Err(e) = compile(dir.path(), "en_US.UTF-8") {
            // Only a host without glibc's locale sources (Debian's `locales`) may skip.
            assert!(
                std::env::var_os("REPROBENCH_REQUIRE_ISOLATION").is_none(),
                "{e}"
            );
            eprintln!("skipped: {e}");
            return;
        }
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import locale; print(locale.setlocale(locale.LC_ALL, ''), locale.getpreferredencoding())",
            ])
            .env_clear()
            .env("LOCPATH", dir.path())
            .env("LC_ALL", "en_US.UTF-8")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "en_US.UTF-8 UTF-8"
        );
        assert!(compile(dir.path(), "nonsense").is_err());
    }
}
