//! Unified diffs as test patches: which files they touch, whether they are usable, and the test
//! directives they imply. Pure.

/// Largest patch accepted (SWT-bench predictions are small; 10 MB is a runaway generation).
pub const MAX_PATCH_BYTES: usize = 10 << 20;

/// One file a diff touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffFile {
    /// Path before (None for a new file).
    pub old: Option<String>,
    /// Path after (None for a deletion).
    pub new: Option<String>,
    /// The diff carries binary content for it.
    pub binary: bool,
}

/// Why a patch cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchProblem {
    /// Nothing but whitespace (or no patch at all).
    Empty,
    /// Larger than [`MAX_PATCH_BYTES`].
    TooLarge(usize),
    /// Binary content.
    Binary(String),
    /// A path outside the repository.
    OutsideRepo(String),
    /// No file headers found.
    NotADiff,
}

impl PatchProblem {
    /// Short machine-readable class for `error_class`/verdicts.
    pub fn class(&self) -> &'static str {
        match self {
            PatchProblem::Empty => "empty_patch",
            PatchProblem::TooLarge(_) => "patch_too_large",
            PatchProblem::Binary(_) => "binary_patch",
            PatchProblem::OutsideRepo(_) => "patch_outside_repo",
            PatchProblem::NotADiff => "not_a_diff",
        }
    }

    /// What is wrong and what to do, for a prediction of `instance`.
    pub fn message(&self, instance: &str) -> String {
        match self {
            PatchProblem::Empty => {
                format!("the prediction for {instance} is empty; the system produced no test")
            }
            PatchProblem::TooLarge(n) => format!(
                "the prediction for {instance} is {n} bytes, over the {MAX_PATCH_BYTES}-byte limit; a reproduction test patch should be small"
            ),
            PatchProblem::Binary(p) => format!(
                "the prediction for {instance} carries binary content ({p}); test patches must be text diffs"
            ),
            PatchProblem::OutsideRepo(p) => format!(
                "the prediction for {instance} touches `{p}`, outside the repository; paths must be relative (a/..., b/...) without `..`"
            ),
            PatchProblem::NotADiff => format!(
                "the prediction for {instance} is not a unified diff (no `diff --git`/`---`/`+++` headers); give model_patch as a git diff"
            ),
        }
    }
}

fn strip_prefix(path: &str) -> Option<String> {
    let path = path.trim();
    let path = path.split('\t').next().unwrap_or(path);
    if path == "/dev/null" {
        return None;
    }
    let p = path
        .strip_prefix("a/")
        .or_else(|| path.strip_prefix("b/"))
        .unwrap_or(path);
    Some(p.trim_matches('"').to_string())
}

/// Files a diff touches, in order of appearance.
pub fn diff_files(patch: &str) -> Vec<DiffFile> {
    let mut files: Vec<DiffFile> = Vec::new();
    let mut current: Option<DiffFile> = None;
    for line in patch.lines() {
        if let Some(rest) = line.strip_prefix("diff --git ") {
            files.extend(current.take());
            // `a/x b/x`: split at " b/" (paths with spaces are rare in test patches).
            let (a, b) = rest.split_once(" b/").map_or((rest, rest), |(a, b)| (a, b));
            current = Some(DiffFile {
                old: strip_prefix(a),
                new: strip_prefix(&format!("b/{b}")),
                binary: false,
            });
        } else if let Some(rest) = line.strip_prefix("--- ") {
            let f = current.get_or_insert(DiffFile {
                old: None,
                new: None,
                binary: false,
            });
            f.old = strip_prefix(rest);
        } else if let Some(rest) = line.strip_prefix("+++ ") {
            if let Some(f) = current.as_mut() {
                f.new = strip_prefix(rest);
            } else {
                current = Some(DiffFile {
                    old: None,
                    new: strip_prefix(rest),
                    binary: false,
                });
            }
        } else if line.starts_with("new file mode") {
            if let Some(f) = current.as_mut() {
                f.old = None;
            }
        } else if line.starts_with("deleted file mode") {
            if let Some(f) = current.as_mut() {
                f.new = None;
            }
        } else if (line.starts_with("GIT binary patch")
            || (line.starts_with("Binary files ") && line.ends_with(" differ")))
            && let Some(f) = current.as_mut()
        {
            f.binary = true;
        }
    }
    files.extend(current);
    files
}

fn escapes(path: &str) -> bool {
    let p = std::path::Path::new(path);
    p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
}

/// Checks a prediction's patch before any sandbox is spent on it.
pub fn validate(patch: Option<&str>) -> Result<Vec<DiffFile>, PatchProblem> {
    let patch = patch.unwrap_or("");
    if patch.trim().is_empty() {
        return Err(PatchProblem::Empty);
    }
    if patch.len() > MAX_PATCH_BYTES {
        return Err(PatchProblem::TooLarge(patch.len()));
    }
    if patch.contains('\0') {
        return Err(PatchProblem::Binary("NUL bytes".into()));
    }
    let files = diff_files(patch);
    if files.is_empty() {
        return Err(PatchProblem::NotADiff);
    }
    for f in &files {
        for p in f.old.iter().chain(f.new.iter()) {
            if escapes(p) {
                return Err(PatchProblem::OutsideRepo(p.clone()));
            }
        }
        if f.binary {
            return Err(PatchProblem::Binary(
                f.new.clone().or(f.old.clone()).unwrap_or_default(),
            ));
        }
    }
    Ok(files)
}

/// Test directives for the runner: the Python files the test patch leaves in place, as paths
/// (`tests/test_x.py`) or dotted modules (`tests.test_x`).
/// A prediction's patch as SWT-bench evaluates it (`remove_binary_diffs`): Python's line breaks
/// become `\n`, the diffs of files with `Binary files` in them are left out, and it ends with a
/// newline (so an empty prediction becomes `"\n"`).
pub fn swt_bench_model_patch(patch: &str) -> String {
    let lines = crate::grading::pytext::splitlines(patch);
    let mut kept: Vec<String> = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    let mut skip = false;
    for line in lines.iter().copied().chain(std::iter::once("diff --git")) {
        if line.starts_with("diff --git") {
            if !current.is_empty() && !skip {
                kept.push(current.join("\n"));
            }
            current.clear();
            skip = false;
        }
        if line.contains("Binary files") {
            skip = true;
        }
        current.push(line);
    }
    kept.join("\n") + "\n"
}

/// Endings SWT-bench drops from test directives (its `NON_TEST_EXTS`; `csv` has no dot there).
const NON_TEST_ENDINGS: [&str; 11] = [
    ".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml",
];

/// SWT-bench's test directives of a patch (`get_test_directives`): the `b/` path of every
/// `diff --git` header, in order, data files left out; django's as dotted modules without
/// `tests/`.
pub fn swt_bench_directives(patch: &str, repo: &str) -> Vec<String> {
    patch
        .split('\n')
        .filter_map(|line| {
            let rest = line.strip_prefix("diff --git a/")?;
            let (_, b) = rest.rsplit_once(" b/")?;
            Some(b.to_string())
        })
        .filter(|d| !NON_TEST_ENDINGS.iter().any(|e| d.ends_with(e)))
        .map(|d| {
            if repo == "django/django" {
                let d = d.strip_suffix(".py").unwrap_or(&d);
                let d = d.strip_prefix("tests/").unwrap_or(d);
                d.replace('/', ".")
            } else {
                d
            }
        })
        .collect()
}

/// Test directives of a patch's files in a named style (`paths`, `modules`, `swt-bench`, the
/// last as [`swt_bench_directives`] for files already parsed).
pub fn test_directives(files: &[DiffFile], style: &str) -> Vec<String> {
    if style == reprobench_domain::swt_bench::SWT_BENCH_DIRECTIVES {
        return files
            .iter()
            .filter_map(|f| f.new.as_ref().or(f.old.as_ref()))
            .filter(|d| !NON_TEST_ENDINGS.iter().any(|e| d.ends_with(e)))
            .cloned()
            .collect();
    }
    let mut out: Vec<String> = files
        .iter()
        .filter_map(|f| f.new.as_ref())
        .filter(|p| p.ends_with(".py"))
        .map(|p| {
            if style == "modules" {
                p.trim_end_matches(".py").replace('/', ".")
            } else {
                p.clone()
            }
        })
        .collect();
    out.dedup();
    out
}

/// A git-style diff that adds one new text file (applies with `git apply`; a missing final
/// newline is marked as git marks it).
pub fn new_file_diff(path: &str, contents: &str) -> String {
    let mut patch = format!(
        "diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
    );
    if contents.is_empty() {
        return patch;
    }
    let ends_with_newline = contents.ends_with('\n');
    let body = contents.strip_suffix('\n').unwrap_or(contents);
    let lines: Vec<&str> = body.split('\n').collect();
    if lines.len() == 1 {
        patch.push_str("@@ -0,0 +1 @@\n");
    } else {
        patch.push_str(&format!("@@ -0,0 +1,{} @@\n", lines.len()));
    }
    for line in &lines {
        patch.push('+');
        patch.push_str(line);
        patch.push('\n');
    }
    if !ends_with_newline {
        patch.push_str("\\ No newline at end of file\n");
    }
    patch
}

/// One hunk of a unified diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk<'a> {
    /// The 1-based line its old side starts at (its header's).
    pub old_start: usize,
    /// The 1-based line its new side starts at (its header's).
    pub new_start: usize,
    /// Its lines, each with its kind: `' '`, `'-'`, `'+'`, or `'\\'` for git's "no newline at
    /// end of file" marker.
    pub lines: Vec<(char, &'a str)>,
}

impl Hunk<'_> {
    /// How many lines of the old file it covers.
    pub fn old_len(&self) -> usize {
        self.lines
            .iter()
            .filter(|(k, _)| matches!(k, ' ' | '-'))
            .count()
    }

    /// The 1-based line numbers, in the new file, of the lines it adds.
    pub fn added_line_numbers(&self) -> impl Iterator<Item = usize> + '_ {
        self.lines
            .iter()
            .filter(|(k, _)| matches!(k, ' ' | '+'))
            .enumerate()
            .filter(|(_, (k, _))| *k == '+')
            .map(|(i, _)| self.new_start + i)
    }
}

/// One file's section of a unified diff: its paths and its hunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHunks<'a> {
    /// Path before (None for a new file).
    pub old: Option<String>,
    /// Path after (None for a deletion).
    pub new: Option<String>,
    /// Its hunks, in order.
    pub hunks: Vec<Hunk<'a>>,
}

/// Every file section of `patch` with its hunks, each hunk read by its header's line counts (so
/// a hunk line that looks like a header, `+++ x` or `--- x`, stays in the hunk). `Err` names a
/// hunk header that cannot be read.
pub fn file_hunks(patch: &str) -> Result<Vec<FileHunks<'_>>, String> {
    let mut files: Vec<FileHunks> = Vec::new();
    let mut lines = patch.lines().peekable();
    // A `--- ` line opens a section unless a `diff --git` header just did.
    let mut opened_by_git = false;
    while let Some(line) = lines.next() {
        if line.starts_with("diff --git ") {
            files.push(FileHunks {
                old: None,
                new: None,
                hunks: Vec::new(),
            });
            opened_by_git = true;
        } else if let Some(rest) = line.strip_prefix("--- ") {
            if !opened_by_git {
                files.push(FileHunks {
                    old: None,
                    new: None,
                    hunks: Vec::new(),
                });
            }
            opened_by_git = false;
            if let Some(file) = files.last_mut() {
                file.old = strip_prefix(rest);
            }
        } else if let Some(rest) = line.strip_prefix("+++ ") {
            if let Some(file) = files.last_mut() {
                file.new = strip_prefix(rest);
            }
        } else if let Some(header) = line.strip_prefix("@@ -") {
            let bad = || format!("a hunk header cannot be read: {line}");
            let (old, new) = header.split_once(" +").ok_or_else(bad)?;
            let new = new.split(' ').next().ok_or_else(bad)?;
            let range = |r: &str| -> Option<(usize, usize)> {
                match r.split_once(',') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => Some((r.parse().ok()?, 1)),
                }
            };
            let ((old_start, mut old_left), (new_start, mut new_left)) =
                (range(old).ok_or_else(bad)?, range(new).ok_or_else(bad)?);
            let mut body = Vec::new();
            while old_left + new_left > 0 || lines.peek().is_some_and(|l| l.starts_with('\\')) {
                let Some(l) = lines.next() else { break };
                let kind = l.chars().next().unwrap_or(' ');
                match kind {
                    '-' => old_left = old_left.saturating_sub(1),
                    '+' => new_left = new_left.saturating_sub(1),
                    '\\' => {}
                    _ => {
                        old_left = old_left.saturating_sub(1);
                        new_left = new_left.saturating_sub(1);
                    }
                }
                // A context line whose leading space an editor dropped is kept whole.
                let marked = matches!(kind, ' ' | '-' | '+' | '\\');
                let text = if marked { &l[1..] } else { l };
                body.push((if marked { kind } else { ' ' }, text));
            }
            if let Some(file) = files.last_mut() {
                file.hunks.push(Hunk {
                    old_start,
                    new_start,
                    lines: body,
                });
            }
        }
    }
    Ok(files)
}

/// The hunks `patch` has for `path` (its new name).
pub fn hunks_of<'a>(patch: &'a str, path: &str) -> Result<Vec<Hunk<'a>>, String> {
    Ok(file_hunks(patch)?
        .into_iter()
        .filter(|f| f.new.as_deref() == Some(path))
        .flat_map(|f| f.hunks)
        .collect())
}

/// The text of `path` after `patch`'s hunks for it are applied to `original` (the file before;
/// empty for a new file), in memory: each hunk where its header says, else at the nearest place
/// its old lines match exactly. `Err` says which hunk did not apply.
pub fn apply_to_text(original: &str, patch: &str, path: &str) -> Result<String, String> {
    let hunks = hunks_of(patch, path)?;
    if hunks.is_empty() {
        return Err(format!("the patch has no hunk for {path}"));
    }
    let mut lines: Vec<&str> = original.lines().collect();
    let mut ends_with_newline = original.is_empty() || original.ends_with('\n');
    let mut shift: isize = 0;
    for (number, hunk) in hunks.iter().enumerate() {
        let (start, body) = (hunk.old_start, &hunk.lines);
        let side = |keep: char| -> Vec<&str> {
            body.iter()
                .filter(|(k, _)| *k == ' ' || *k == keep)
                .map(|(_, l)| *l)
                .collect()
        };
        let (old, new) = (side('-'), side('+'));
        let expected = (start.saturating_sub(1) as isize + shift).max(0) as usize;
        let fits =
            |at: usize| at + old.len() <= lines.len() && lines[at..at + old.len()] == old[..];
        let at = (0..=lines.len())
            .flat_map(|d| [expected.checked_add(d), expected.checked_sub(d)])
            .flatten()
            .find(|&at| fits(at))
            .ok_or_else(|| format!("hunk {} of {path} does not apply", number + 1))?;
        lines.splice(at..at + old.len(), new.iter().copied());
        shift += new.len() as isize - old.len() as isize;
        if at + new.len() == lines.len() {
            // The hunk reaches the end: git's marker after a new-side line says the file now
            // ends without a newline.
            let last_new = body.iter().rposition(|(k, _)| *k != '-' && *k != '\\');
            ends_with_newline = match last_new {
                Some(i) => body.get(i + 1).map(|(k, _)| *k) != Some('\\'),
                None => ends_with_newline,
            };
        }
    }
    let mut text = lines.join("\n");
    if ends_with_newline && !text.is_empty() {
        text.push('\n');
    }
    Ok(text)
}

#[cfg(test)]
mod directive_tests {
    use super::{swt_bench_directives, swt_bench_model_patch};

    #[test]
    fn model_patches_are_normalised_as_swt_bench_does() {
        assert_eq!(swt_bench_model_patch(""), "\n");
        assert_eq!(
            swt_bench_model_patch("diff --git a/t.py b/t.py\r\n+x"),
            "diff --git a/t.py b/t.py\n+x\n"
        );
        let with_binary =
            "diff --git a/a.png b/a.png\nBinary files differ\ndiff --git a/t.py b/t.py\n+y\n";
        assert_eq!(
            swt_bench_model_patch(with_binary),
            "diff --git a/t.py b/t.py\n+y\n"
        );
    }

    #[test]
    fn swt_bench_directives_are_its_headers_without_data_files() {
        let patch = "diff --git a/tests/test_a.py b/tests/test_a.py\n--- a/x\n+++ b/x\n\
                     diff --git a/tests/data.json b/tests/data.json\n\
                     diff --git a/old name.py b/new b/name.py\n\
                     diff --git a/t.csv b/t.csv\n";
        assert_eq!(
            swt_bench_directives(patch, "psf/requests"),
            vec!["tests/test_a.py", "name.py"]
        );
        let django = "diff --git a/tests/admin_views/tests.py b/tests/admin_views/tests.py\n";
        assert_eq!(
            swt_bench_directives(django, "django/django"),
            vec!["admin_views.tests"]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::apply_to_text;

    #[test]
    fn hunks_apply_in_memory_where_they_match() {
        let original = "a\nb\nc\nd\ne\nf\n";
        // The second hunk's header is off by two lines: it applies where its lines match.
        let patch = "diff --git a/t.py b/t.py\n--- a/t.py\n+++ b/t.py\n@@ -1,2 +1,3 @@\n a\n+a2\n b\n@@ -3,2 +4,2 @@\n e\n-f\n+F\n";
        assert_eq!(
            apply_to_text(original, patch, "t.py").unwrap(),
            "a\na2\nb\nc\nd\ne\nF\n"
        );
        assert!(apply_to_text(original, patch, "other.py").is_err());
        let wrong = "--- a/t.py\n+++ b/t.py\n@@ -1,1 +1,1 @@\n-zzz\n+y\n";
        assert_eq!(
            apply_to_text(original, wrong, "t.py").unwrap_err(),
            "hunk 1 of t.py does not apply"
        );
    }

    #[test]
    fn new_files_and_missing_final_newlines_come_out_as_git_writes_them() {
        let created = super::new_file_diff("tests/test_x.py", "def test():\n    pass");
        assert_eq!(
            apply_to_text("", &created, "tests/test_x.py").unwrap(),
            "def test():\n    pass"
        );
        // A line that starts like a file header inside a hunk is a line of the hunk.
        let tricky = "--- a/t.py\n+++ b/t.py\n@@ -1 +1,2 @@\n x\n+++ not a header\n";
        assert_eq!(
            apply_to_text("x\n", tricky, "t.py").unwrap(),
            "x\n++ not a header\n"
        );
        let gains_newline =
            "--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-x\n\\ No newline at end of file\n+x\n";
        assert_eq!(apply_to_text("x", gains_newline, "t.py").unwrap(), "x\n");
    }

    #[test]
    fn file_sections_give_each_hunk_its_starts_and_added_line_numbers() {
        let patch = "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n\
                     @@ -3,3 +3,4 @@\n x\n-y\n+Y\n+++ z\n w\n\
                     @@ -20 +21,2 @@\n k\n+m\n\
                     --- b.py\n+++ b.py\n@@ -0,0 +1 @@\n+n\n";
        let files = super::file_hunks(patch).unwrap();
        let paths: Vec<_> = files
            .iter()
            .map(|f| (f.old.clone(), f.new.clone()))
            .collect();
        let named = |p: &str| Some(p.to_string());
        assert_eq!(
            paths,
            vec![
                (named("a.py"), named("a.py")),
                (named("b.py"), named("b.py"))
            ]
        );
        let a = &files[0].hunks;
        assert_eq!((a[0].old_start, a[0].new_start, a[0].old_len()), (3, 3, 3));
        // The `+++ z` line is the hunk's, counted by its header, not a file header.
        assert_eq!(a[0].added_line_numbers().collect::<Vec<_>>(), vec![4, 5]);
        assert_eq!(a[1].added_line_numbers().collect::<Vec<_>>(), vec![22]);
        assert_eq!(super::hunks_of(patch, "b.py").unwrap().len(), 1);
        assert!(super::hunks_of(patch, "c.py").unwrap().is_empty());
        assert!(super::file_hunks("--- a\n+++ b\n@@ -x +1 @@\n").is_err());
    }

    use super::*;

    const MODIFY: &str = "diff --git a/tests/test_a.py b/tests/test_a.py\nindex 1..2 100644\n--- a/tests/test_a.py\n+++ b/tests/test_a.py\n@@ -1 +1,2 @@\n x\n+y\n";

    #[test]
    fn reads_files_of_modifications_additions_and_deletions() {
        let added = new_file_diff("tests/test_new.py", "def test_x():\n    assert 1\n");
        let deleted = "diff --git a/old.py b/old.py\ndeleted file mode 100644\n--- a/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n";
        let files = diff_files(&format!("{MODIFY}{added}{deleted}"));
        assert_eq!(files.len(), 3);
        assert_eq!(files[0].new.as_deref(), Some("tests/test_a.py"));
        assert_eq!(
            (files[1].old.as_deref(), files[1].new.as_deref()),
            (None, Some("tests/test_new.py"))
        );
        assert_eq!(
            (files[2].old.as_deref(), files[2].new.as_deref()),
            (Some("old.py"), None)
        );
        assert_eq!(
            test_directives(&files, "paths"),
            vec!["tests/test_a.py", "tests/test_new.py"]
        );
        assert_eq!(
            test_directives(&files, "modules"),
            vec!["tests.test_a", "tests.test_new"]
        );
    }

    #[test]
    fn refuses_unusable_patches() {
        assert_eq!(validate(None), Err(PatchProblem::Empty));
        assert_eq!(validate(Some("  \n\t")), Err(PatchProblem::Empty));
        assert_eq!(
            validate(Some("just some text\n")),
            Err(PatchProblem::NotADiff)
        );
        let big = format!("{MODIFY}{}", "+x\n".repeat(MAX_PATCH_BYTES / 3 + 1));
        assert!(matches!(
            validate(Some(&big)),
            Err(PatchProblem::TooLarge(_))
        ));
        let escape = MODIFY.replace("tests/test_a.py", "../outside.py");
        assert_eq!(
            validate(Some(&escape)),
            Err(PatchProblem::OutsideRepo("../outside.py".into()))
        );
        let absolute = "--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(matches!(
            validate(Some(absolute)),
            Err(PatchProblem::OutsideRepo(_))
        ));
        let binary =
            "diff --git a/x.bin b/x.bin\nnew file mode 100644\nGIT binary patch\nliteral 3\nabc\n";
        assert!(matches!(
            validate(Some(binary)),
            Err(PatchProblem::Binary(_))
        ));
        assert!(validate(Some(MODIFY)).is_ok());
        assert_eq!(PatchProblem::Empty.class(), "empty_patch");
    }
}
