//! A read-only view of a repository checkout: regex search, glob listing and ranged reads,
//! confined to the checkout's root.

use super::ToolError;
use regex::RegexBuilder;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// Files larger than this are skipped by the walkers and refused by reads.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// Most lines one [`RepoView::read_file`] call returns.
pub const MAX_READ_LINES: usize = 400;
/// Most paths one [`RepoView::glob`] call returns.
pub const MAX_GLOB_RESULTS: usize = 1000;
/// Longest line text a [`GrepHit`] carries, in characters.
pub const MAX_HIT_CHARS: usize = 200;

/// Directory names never descended into: version control, caches, dependency trees.
const SKIPPED_DIRS: &[&str] = &[
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    "node_modules",
    ".venv",
    "venv",
    ".tox",
    ".nox",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".eggs",
    "site-packages",
];

/// One line matching a [`RepoView::grep`] pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrepHit {
    /// Path relative to the root, `/`-separated.
    pub path: String,
    /// 1-based line number.
    pub line: usize,
    /// The line's text, shortened to about [`MAX_HIT_CHARS`] characters around the match.
    pub text: String,
}

/// A read-only view of a checkout directory; every path it takes or gives is relative to the root.
#[derive(Debug, Clone)]
pub struct RepoView {
    root: PathBuf,
}

impl RepoView {
    /// A view of the checkout at `root`.
    pub fn new(root: impl Into<PathBuf>) -> RepoView {
        RepoView { root: root.into() }
    }

    /// The checkout's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Lines matching the regex `pattern` in text files whose path matches `path_glob` (see
    /// [`path_filter_matches`]), sorted by path then line, at most `max_hits` of them.
    pub fn grep(
        &self,
        pattern: &str,
        path_glob: Option<&str>,
        max_hits: usize,
    ) -> Result<Vec<GrepHit>, ToolError> {
        Ok(self.grep_reporting_skips(pattern, path_glob, max_hits)?.0)
    }

    /// [`RepoView::grep`], and the files it would have searched but did not because they are
    /// over [`MAX_FILE_BYTES`] (among those it reached before `max_hits`), so a caller can say so.
    pub fn grep_reporting_skips(
        &self,
        pattern: &str,
        path_glob: Option<&str>,
        max_hits: usize,
    ) -> Result<(Vec<GrepHit>, Vec<String>), ToolError> {
        let regex = RegexBuilder::new(pattern)
            .size_limit(10 * 1024 * 1024)
            .build()
            .map_err(|error| ToolError::InvalidRegex {
                pattern: pattern.to_string(),
                message: first_line(&error.to_string()),
            })?;
        // One scan of a whole file decides whether any of its lines can match: a match within a
        // line is a match in the text, `^` and `$` holding at line ends (multi-line mode).
        // Most files of a large repository hold no match and are never split into lines.
        let whole_file = RegexBuilder::new(pattern)
            .size_limit(10 * 1024 * 1024)
            .multi_line(true)
            .build()
            .ok();
        let filter = path_glob
            .map(|glob| GlobPattern::parse(glob.trim_start_matches("./")))
            .transpose()?;
        let max_hits = max_hits.max(1);
        let mut hits = Vec::new();
        let mut too_large = Vec::new();
        for path in self.walk_files() {
            if let Some(filter) = &filter
                && !path_filter_matches(filter, &path)
            {
                continue;
            }
            let Some(text) = self.load_text(&path) else {
                if self.is_too_large(&path) {
                    too_large.push(path);
                }
                continue;
            };
            // (`lines()` also drops a `\r` before each `\n`, which `$` would not pass: files with
            // a `\r` are searched line by line only.)
            if !text.contains('\r') && whole_file.as_ref().is_some_and(|w| !w.is_match(&text)) {
                continue;
            }
            for (index, line) in text.lines().enumerate() {
                if let Some(found) = regex.find(line) {
                    hits.push(GrepHit {
                        path: path.clone(),
                        line: index + 1,
                        text: shorten_around(line.trim_end(), found.start(), MAX_HIT_CHARS),
                    });
                    if hits.len() >= max_hits {
                        return Ok((hits, too_large));
                    }
                }
            }
        }
        Ok((hits, too_large))
    }

    /// Whether a walked file is a regular file over [`MAX_FILE_BYTES`].
    fn is_too_large(&self, path: &str) -> bool {
        fs::symlink_metadata(self.root.join(path))
            .is_ok_and(|m| m.is_file() && m.len() > MAX_FILE_BYTES)
    }

    /// Files (not directories) whose relative path matches `pattern`, sorted, at most
    /// [`MAX_GLOB_RESULTS`]. `*` and `?` stay within one path segment, `**` spans any number of
    /// directories, `[abc]`, `[a-z]` and `[!abc]` match one character.
    pub fn glob(&self, pattern: &str) -> Result<Vec<String>, ToolError> {
        if pattern.starts_with('/') {
            return Err(ToolError::InvalidGlob {
                pattern: pattern.to_string(),
                reason: "patterns are relative to the repository root; drop the leading `/`"
                    .to_string(),
            });
        }
        let glob = GlobPattern::parse(pattern.trim_start_matches("./"))?;
        Ok(self
            .walk_files()
            .into_iter()
            .filter(|path| glob.matches(path))
            .take(MAX_GLOB_RESULTS)
            .collect())
    }

    /// Lines `start_line..=end_line` (1-based, default the whole file) of the file at `path`,
    /// numbered like `  12| text`, at most [`MAX_READ_LINES`] of them, followed by a note on how
    /// to read on when lines remain.
    pub fn read_file(
        &self,
        path: &str,
        start_line: Option<usize>,
        end_line: Option<usize>,
    ) -> Result<String, ToolError> {
        let text = self.read_text(path)?;
        let lines: Vec<&str> = text.lines().collect();
        let numbered = number_lines(path, &lines, start_line, end_line)?;
        Ok(numbered)
    }

    /// The whole text of the file at `path` (invalid UTF-8 replaced), after the same checks as
    /// [`RepoView::read_file`].
    pub fn read_text(&self, path: &str) -> Result<String, ToolError> {
        let full = self.resolve(path)?;
        let metadata = fs::metadata(&full).map_err(|error| io_error(path, &error))?;
        if metadata.is_dir() {
            return Err(ToolError::IsDirectory {
                path: path.to_string(),
            });
        }
        if metadata.len() > MAX_FILE_BYTES {
            return Err(ToolError::TooLarge {
                path: path.to_string(),
                bytes: metadata.len(),
            });
        }
        let bytes = fs::read(&full).map_err(|error| io_error(path, &error))?;
        if looks_binary(&bytes) {
            return Err(ToolError::Binary {
                path: path.to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Every `.py` file under the root (skipping the directories grep skips), sorted.
    pub fn python_files(&self) -> Vec<String> {
        self.walk_files()
            .into_iter()
            .filter(|path| path.ends_with(".py"))
            .collect()
    }

    /// The absolute path of `path` once it is known to stay inside the root, symlinks resolved.
    fn resolve(&self, path: &str) -> Result<PathBuf, ToolError> {
        let relative = checked_relative_path(path)?;
        let root = self
            .root
            .canonicalize()
            .map_err(|error| io_error(".", &error))?;
        let joined = root.join(relative);
        let full = match joined.canonicalize() {
            Ok(full) => full,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(ToolError::NotFound {
                    path: path.to_string(),
                });
            }
            Err(error) => return Err(io_error(path, &error)),
        };
        if !full.starts_with(&root) {
            return Err(ToolError::PathRefused {
                path: path.to_string(),
                reason: "it resolves (through a symlink) outside the repository".to_string(),
            });
        }
        Ok(full)
    }

    /// The text of a walked file, or `None` when it is too large, binary or unreadable.
    fn load_text(&self, path: &str) -> Option<String> {
        let full = self.root.join(path);
        let metadata = fs::symlink_metadata(&full).ok()?;
        if !metadata.is_file() || metadata.len() > MAX_FILE_BYTES {
            return None;
        }
        let bytes = fs::read(&full).ok()?;
        if looks_binary(&bytes) {
            return None;
        }
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Relative paths of the regular files under the root, sorted; symlinks are not followed
    /// and skipped directories are not entered.
    pub(crate) fn walk_files(&self) -> Vec<String> {
        let mut files = Vec::new();
        let mut pending = vec![(self.root.clone(), String::new())];
        while let Some((dir, prefix)) = pending.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(file_type) = entry.file_type() else {
                    continue;
                };
                let name = entry.file_name().to_string_lossy().into_owned();
                let relative = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}/{name}")
                };
                if file_type.is_dir() {
                    let path = entry.path();
                    if !SKIPPED_DIRS.contains(&name.as_str()) && !path.join("pyvenv.cfg").exists() {
                        pending.push((path, relative));
                    }
                } else if file_type.is_file() {
                    files.push(relative);
                }
            }
        }
        files.sort();
        files
    }
}

/// Whether `path` passes a grep path filter: the glob matches the whole path, or (for a
/// pattern without `/`) the file name, or a directory the file lies under.
pub fn path_filter_matches(glob: &GlobPattern, path: &str) -> bool {
    if glob.matches(path) {
        return true;
    }
    if !glob.has_separator() {
        let name = path.rsplit('/').next().unwrap_or(path);
        if glob.matches(name) {
            return true;
        }
    }
    let mut end = 0;
    while let Some(offset) = path[end..].find('/') {
        end += offset;
        if glob.matches(&path[..end]) {
            return true;
        }
        end += 1;
    }
    false
}

/// `path` as a relative path, refused when empty, absolute or climbing with `..`.
pub(crate) fn checked_relative_path(path: &str) -> Result<PathBuf, ToolError> {
    let refuse = |reason: &str| ToolError::PathRefused {
        path: path.to_string(),
        reason: reason.to_string(),
    };
    if path.trim().is_empty() {
        return Err(refuse("the path is empty"));
    }
    let mut relative = PathBuf::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => relative.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(refuse("it climbs out with `..`")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(refuse("it is absolute"));
            }
        }
    }
    if relative.as_os_str().is_empty() {
        return Err(refuse("it names the repository root itself, not a file"));
    }
    Ok(relative)
}

/// `path` with leading `./` removed and backslashes turned into `/`, as the walkers spell paths.
pub(crate) fn normalize_relative(path: &str) -> String {
    let path = path.replace('\\', "/");
    let mut rest = path.as_str();
    while let Some(stripped) = rest.strip_prefix("./") {
        rest = stripped;
    }
    rest.trim_end_matches('/').to_string()
}

/// Numbers `lines[start-1..end]` (capped at [`MAX_READ_LINES`]) and adds a read-on note.
fn number_lines(
    path: &str,
    lines: &[&str],
    start_line: Option<usize>,
    end_line: Option<usize>,
) -> Result<String, ToolError> {
    let total = lines.len();
    let start = start_line.unwrap_or(1).max(1);
    if total == 0 {
        return Ok(format!("[{path} is empty]"));
    }
    if start > total {
        return Err(ToolError::LineOutOfRange {
            path: path.to_string(),
            start,
            lines: total,
        });
    }
    let requested_end = end_line.unwrap_or(total).min(total);
    if requested_end < start {
        return Err(ToolError::InvalidRange {
            start,
            end: requested_end,
        });
    }
    let end = requested_end.min(start + MAX_READ_LINES - 1);
    let width = end.to_string().len().max(4);
    let mut out = String::new();
    for (offset, line) in lines[start - 1..end].iter().enumerate() {
        out.push_str(&format!(
            "{:>width$}| {}\n",
            start + offset,
            line.trim_end()
        ));
    }
    if end < requested_end {
        out.push_str(&format!(
            "[showing lines {start}-{end} of {total}; at most {MAX_READ_LINES} lines per call; \
             call read_file with start_line={} to read on]\n",
            end + 1
        ));
    } else if end < total && end_line.is_none() {
        out.push_str(&format!("[lines {start}-{end} of {total}]\n"));
    }
    Ok(out)
}

/// Whether `bytes` look like a binary file (a NUL byte in the first 8 KiB).
fn looks_binary(bytes: &[u8]) -> bool {
    bytes.iter().take(8192).any(|&byte| byte == 0)
}

fn io_error(path: &str, error: &std::io::Error) -> ToolError {
    ToolError::Io {
        path: path.to_string(),
        message: error.to_string(),
    }
}

fn first_line(text: &str) -> String {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `line` cut to at most `max_chars` characters, keeping the part around byte `match_start`.
fn shorten_around(line: &str, match_start: usize, max_chars: usize) -> String {
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    if chars.len() <= max_chars {
        return line.to_string();
    }
    let match_char = chars
        .iter()
        .position(|&(byte, _)| byte >= match_start)
        .unwrap_or(0);
    let begin = match_char
        .saturating_sub(max_chars / 4)
        .min(chars.len() - max_chars);
    let end = begin + max_chars;
    let mut out = String::new();
    if begin > 0 {
        out.push('…');
    }
    out.extend(chars[begin..end].iter().map(|&(_, c)| c));
    if end < chars.len() {
        out.push('…');
    }
    out
}

/// A compiled glob over `/`-separated relative paths.
#[derive(Debug, Clone)]
pub struct GlobPattern {
    segments: Vec<Segment>,
}

#[derive(Debug, Clone)]
enum Segment {
    /// `**`: any number of path segments, including none.
    AnyDirs,
    /// One path segment's pattern.
    Parts(Vec<Part>),
}

#[derive(Debug, Clone)]
enum Part {
    Literal(char),
    AnyChar,
    AnyRun,
    Class {
        negated: bool,
        items: Vec<ClassItem>,
    },
}

#[derive(Debug, Clone)]
enum ClassItem {
    Single(char),
    Range(char, char),
}

impl GlobPattern {
    /// Parses `pattern`; an empty pattern or an unclosed `[` is an error.
    pub fn parse(pattern: &str) -> Result<GlobPattern, ToolError> {
        let invalid = |reason: &str| ToolError::InvalidGlob {
            pattern: pattern.to_string(),
            reason: reason.to_string(),
        };
        if pattern.is_empty() {
            return Err(invalid("the pattern is empty; try `**/*.py`"));
        }
        let mut segments = Vec::new();
        for raw in pattern.split('/').filter(|segment| !segment.is_empty()) {
            if raw == "**" {
                segments.push(Segment::AnyDirs);
                continue;
            }
            let chars: Vec<char> = raw.chars().collect();
            let mut parts = Vec::new();
            let mut index = 0;
            while index < chars.len() {
                match chars[index] {
                    '*' => {
                        while index + 1 < chars.len() && chars[index + 1] == '*' {
                            index += 1;
                        }
                        parts.push(Part::AnyRun);
                    }
                    '?' => parts.push(Part::AnyChar),
                    '[' => {
                        let (part, next) = parse_class(&chars, index).ok_or_else(|| {
                            invalid(
                                "a `[` is never closed; write `[abc]`, or `[[]` for a literal `[`",
                            )
                        })?;
                        parts.push(part);
                        index = next;
                        continue;
                    }
                    other => parts.push(Part::Literal(other)),
                }
                index += 1;
            }
            segments.push(Segment::Parts(parts));
        }
        if segments.is_empty() {
            return Err(invalid("the pattern has no path segments; try `**/*.py`"));
        }
        Ok(GlobPattern { segments })
    }

    /// Whether the relative `path` matches the whole pattern.
    pub fn matches(&self, path: &str) -> bool {
        let names: Vec<&str> = path.split('/').filter(|name| !name.is_empty()).collect();
        match_segments(&self.segments, &names)
    }

    /// Whether the pattern has more than one segment (so it is matched against whole paths).
    pub fn has_separator(&self) -> bool {
        self.segments.len() > 1
    }
}

/// The class starting at `chars[open]` (a `[`) and the index just past its `]`.
fn parse_class(chars: &[char], open: usize) -> Option<(Part, usize)> {
    let mut index = open + 1;
    let negated = matches!(chars.get(index), Some('!') | Some('^'));
    if negated {
        index += 1;
    }
    let mut items = Vec::new();
    let mut first = true;
    while index < chars.len() {
        let c = chars[index];
        if c == ']' && !first {
            return Some((Part::Class { negated, items }, index + 1));
        }
        first = false;
        if index + 2 < chars.len() && chars[index + 1] == '-' && chars[index + 2] != ']' {
            items.push(ClassItem::Range(c, chars[index + 2]));
            index += 3;
        } else {
            items.push(ClassItem::Single(c));
            index += 1;
        }
    }
    None
}

fn match_segments(segments: &[Segment], names: &[&str]) -> bool {
    wildcard_match(
        segments,
        names,
        |segment| matches!(segment, Segment::AnyDirs),
        |segment, name| match segment {
            Segment::AnyDirs => true,
            Segment::Parts(parts) => {
                let chars: Vec<char> = name.chars().collect();
                match_parts(parts, &chars)
            }
        },
    )
}

fn match_parts(parts: &[Part], chars: &[char]) -> bool {
    wildcard_match(
        parts,
        chars,
        |part| matches!(part, Part::AnyRun),
        |part, &c| part_matches(part, c),
    )
}

/// Whether `pattern` matches all of `items`, where items for which `is_star` holds match any
/// run of items and the others match one item each when `matches_one` says so. Backtracks only
/// to the latest star, so the time stays proportional to `pattern.len() * items.len()`.
fn wildcard_match<P, I>(
    pattern: &[P],
    items: &[I],
    is_star: impl Fn(&P) -> bool,
    matches_one: impl Fn(&P, &I) -> bool,
) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut last_star: Option<(usize, usize)> = None;
    while i < items.len() {
        if p < pattern.len() && is_star(&pattern[p]) {
            last_star = Some((p, i));
            p += 1;
        } else if p < pattern.len() && matches_one(&pattern[p], &items[i]) {
            p += 1;
            i += 1;
        } else if let Some((star, consumed)) = last_star {
            p = star + 1;
            i = consumed + 1;
            last_star = Some((star, consumed + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(is_star)
}

fn part_matches(part: &Part, c: char) -> bool {
    match part {
        Part::Literal(literal) => *literal == c,
        Part::AnyChar => true,
        Part::AnyRun => true,
        Part::Class { negated, items } => {
            let inside = items.iter().any(|item| match item {
                ClassItem::Single(single) => *single == c,
                ClassItem::Range(low, high) => (*low..=*high).contains(&c),
            });
            inside != *negated
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(pattern: &str) -> GlobPattern {
        GlobPattern::parse(pattern).expect("valid glob")
    }

    #[test]
    fn star_and_question_mark_stay_within_one_segment() {
        assert!(glob("*.py").matches("setup.py"));
        assert!(!glob("*.py").matches("pkg/mod.py"));
        assert!(glob("pkg/?od.py").matches("pkg/mod.py"));
        assert!(!glob("pkg/?od.py").matches("pkg/mood.py"));
    }

    #[test]
    fn double_star_spans_zero_or_more_directories() {
        let pattern = glob("**/test_*.py");
        assert!(pattern.matches("test_a.py"));
        assert!(pattern.matches("tests/unit/test_a.py"));
        assert!(!pattern.matches("tests/unit/a_test.py"));
        assert!(glob("src/**/*.py").matches("src/a/b/c.py"));
        assert!(glob("src/**").matches("src/a/b/c.py"));
        assert!(glob("a/**/b/**/c").matches("a/x/b/y/z/c"));
        assert!(!glob("a/**/b/**/c").matches("a/x/c"));
    }

    #[test]
    fn many_stars_match_quickly() {
        let name = "a".repeat(200);
        assert!(!glob("*a*a*a*a*a*a*a*a*b").matches(&name));
        assert!(glob("*a*a*a*a*a*a*a*a").matches(&name));
    }

    #[test]
    fn classes_match_sets_ranges_and_negations() {
        assert!(glob("[abc].py").matches("b.py"));
        assert!(!glob("[abc].py").matches("d.py"));
        assert!(glob("v[0-9].txt").matches("v7.txt"));
        assert!(glob("[!_]*.py").matches("mod.py"));
        assert!(!glob("[!_]*.py").matches("__init__.py"));
    }

    #[test]
    fn malformed_globs_are_errors_that_explain() {
        let error = GlobPattern::parse("src/[ab").unwrap_err().to_string();
        assert!(error.contains("never closed"), "{error}");
        assert!(GlobPattern::parse("").is_err());
    }

    #[test]
    fn path_filters_match_file_names_and_directories() {
        assert!(path_filter_matches(&glob("*.py"), "pkg/sub/mod.py"));
        assert!(path_filter_matches(&glob("pkg/sub"), "pkg/sub/mod.py"));
        assert!(!path_filter_matches(&glob("pkg/other"), "pkg/sub/mod.py"));
    }

    #[test]
    fn relative_paths_that_escape_are_refused() {
        assert!(checked_relative_path("/etc/passwd").is_err());
        assert!(checked_relative_path("pkg/../../x").is_err());
        assert!(checked_relative_path("").is_err());
        assert!(checked_relative_path(".").is_err());
        assert_eq!(
            checked_relative_path("./pkg/mod.py").unwrap(),
            PathBuf::from("pkg/mod.py")
        );
    }

    #[test]
    fn long_hit_lines_keep_the_match() {
        let line = format!("{}NEEDLE{}", "a".repeat(500), "b".repeat(500));
        let short = shorten_around(&line, 500, 200);
        assert!(short.contains("NEEDLE"));
        assert!(short.chars().count() <= 202);
    }

    #[test]
    fn numbered_ranges_are_capped_with_a_read_on_note() {
        let lines: Vec<String> = (1..=1000).map(|n| format!("line {n}")).collect();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let text = number_lines("big.py", &lines, Some(10), None).unwrap();
        assert!(text.starts_with("  10| line 10\n"));
        assert!(text.contains(" 409| line 409\n"));
        assert!(!text.contains("line 410\n"));
        assert!(text.contains("start_line=410"), "{text}");
        let error = number_lines("big.py", &lines, Some(2000), None).unwrap_err();
        assert!(error.to_string().contains("1000 lines"), "{error}");
    }
}
