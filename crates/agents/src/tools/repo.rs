//! A read-only view of a repository checkout: regex search, glob listing and ranged reads,
//! confined to the checkout's root.
//!
//! The walk is ripgrep's `ignore` walker with none of its ignore rules (the view is the files on
//! disk, whatever a repository's or the host's ignore files say) and this module's own skipped
//! directories. grep searches each file with ripgrep's `grep-searcher`, and keeps only the lines
//! the pattern matches when that line's text alone is searched with `regex`, so that its answers
//! are those of a line-by-line search.

use super::ToolError;
use grep_matcher::LineTerminator;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{Searcher, SearcherBuilder, Sink, SinkMatch};
use ignore::WalkBuilder;
use regex::{Regex, RegexBuilder};
use regex_syntax::hir::Look;
use std::fs;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// Files larger than this are skipped by the walkers and refused by reads.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// Most lines one [`RepoView::read_file`] call returns.
pub const MAX_READ_LINES: usize = 400;
/// Most paths one [`RepoView::glob`] call returns.
pub const MAX_GLOB_RESULTS: usize = 1000;
/// Longest line text a [`GrepHit`] carries, in characters.
pub const MAX_HIT_CHARS: usize = 200;
/// Largest compiled program a grep pattern may make, in bytes.
const REGEX_SIZE_LIMIT: usize = 10 * 1024 * 1024;

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
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|error| ToolError::InvalidRegex {
                pattern: pattern.to_string(),
                message: first_line(&error.to_string()),
            })?;
        let matcher = line_matcher(pattern);
        let mut searcher = SearcherBuilder::new()
            .line_terminator(LineTerminator::crlf())
            // A UTF-16 file holds NUL bytes and is skipped as binary, and a UTF-8 BOM stays in
            // the first line, as when files were read as they are.
            .bom_sniffing(false)
            .build();
        let filter = path_glob
            .map(|glob| GlobPattern::parse(glob.trim_start_matches("./")))
            .transpose()?;
        let mut found = Hits {
            regex: &regex,
            path: String::new(),
            hits: Vec::new(),
            max_hits: max_hits.max(1),
        };
        let mut too_large = Vec::new();
        let mut bytes = Vec::new();
        for path in self.walk_files() {
            if let Some(filter) = &filter
                && !path_filter_matches(filter, &path)
            {
                continue;
            }
            match self.read_walked(&path, &mut bytes) {
                Walked::Text => {}
                Walked::TooLarge => {
                    too_large.push(path);
                    continue;
                }
                Walked::Skipped => continue,
            }
            found.path = path;
            match &matcher {
                Some(matcher) if lines_split_alike(&bytes) => {
                    // `Hits` never fails, and a searcher error could only end this file early.
                    let _ = searcher.search_slice(matcher, &bytes, &mut found);
                }
                _ => found.search_each_line(&bytes),
            }
            if found.is_full() {
                break;
            }
        }
        Ok((found.hits, too_large))
    }

    /// Reads the walked file at `path` into `bytes` when it is a text file grep searches.
    fn read_walked(&self, path: &str, bytes: &mut Vec<u8>) -> Walked {
        let full = self.root.join(path);
        let Ok(metadata) = fs::symlink_metadata(&full) else {
            return Walked::Skipped;
        };
        if !metadata.is_file() {
            return Walked::Skipped;
        }
        if metadata.len() > MAX_FILE_BYTES {
            return Walked::TooLarge;
        }
        bytes.clear();
        let read = fs::File::open(&full).and_then(|mut file| file.read_to_end(bytes));
        if read.is_err() || looks_binary(bytes) {
            return Walked::Skipped;
        }
        Walked::Text
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

    /// Relative paths of the regular files under the root, sorted; symlinks are not followed
    /// and skipped directories are not entered. No ignore file is read: hidden files and
    /// git-ignored ones are walked like any other.
    pub(crate) fn walk_files(&self) -> Vec<String> {
        let mut files: Vec<String> = WalkBuilder::new(&self.root)
            .standard_filters(false)
            .follow_links(false)
            .filter_entry(|entry| !is_skipped_dir(entry))
            .build()
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_some_and(|kind| kind.is_file()))
            .filter_map(|entry| {
                let relative = entry.path().strip_prefix(&self.root).ok()?;
                Some(relative.to_string_lossy().into_owned())
            })
            .collect();
        // One order for the whole list (the walker's own sorting orders each directory's
        // entries by name, which puts `a/b` before `a.py`).
        files.sort();
        files
    }
}

/// What [`RepoView::read_walked`] found.
enum Walked {
    /// A text file, now in the buffer.
    Text,
    /// A regular file over [`MAX_FILE_BYTES`], not read.
    TooLarge,
    /// Binary, unreadable or no longer a regular file.
    Skipped,
}

/// Whether a walked directory is one never descended into: a [`SKIPPED_DIRS`] name or a
/// virtual environment (it holds a `pyvenv.cfg`).
fn is_skipped_dir(entry: &ignore::DirEntry) -> bool {
    entry.file_type().is_some_and(|kind| kind.is_dir())
        && (entry
            .file_name()
            .to_str()
            .is_some_and(|name| SKIPPED_DIRS.contains(&name))
            || entry.path().join("pyvenv.cfg").exists())
}

/// The grep-searcher matcher for `pattern`, or `None` when `pattern` must be searched line by
/// line instead: ripgrep refuses a literal `\n` or `\r` in a pattern (each line's search has
/// none, so only another branch of the pattern can match there), and `\A` and `\z` (or
/// `(?-m)^` and `(?-m)$`) mean the line's start and end only when a line is searched alone.
fn line_matcher(pattern: &str) -> Option<RegexMatcher> {
    let hir = regex_syntax::ParserBuilder::new()
        .multi_line(true)
        .crlf(true)
        .build()
        .parse(pattern)
        .ok()?;
    let looks = hir.properties().look_set();
    if looks.contains(Look::Start) || looks.contains(Look::End) {
        return None;
    }
    RegexMatcherBuilder::new()
        .multi_line(true)
        .crlf(true)
        // The lazy DFA's cache, per search (grep-regex's default allows about 1 GB).
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build(pattern)
        .ok()
}

/// Whether grep-searcher's lines of `bytes` are the lines a line-by-line search of the file's
/// text has: the text is UTF-8 as it is (no byte stands in for U+FFFD), and every `\r` ends a
/// line with the `\n` after it.
fn lines_split_alike(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_ok()
        && memchr::memchr_iter(b'\r', bytes).all(|at| bytes.get(at + 1) == Some(&b'\n'))
}

/// The hits of one grep call so far, and the file being searched.
struct Hits<'r> {
    regex: &'r Regex,
    path: String,
    hits: Vec<GrepHit>,
    max_hits: usize,
}

impl Hits<'_> {
    fn is_full(&self) -> bool {
        self.hits.len() >= self.max_hits
    }

    /// Records line `number` (its text without the line end) when `regex` matches it; whether
    /// more hits are wanted.
    fn offer(&mut self, number: usize, line: &str) -> bool {
        if let Some(found) = self.regex.find(line) {
            self.hits.push(GrepHit {
                path: self.path.clone(),
                line: number,
                text: shorten_around(line.trim_end(), found.start(), MAX_HIT_CHARS),
            });
        }
        !self.is_full()
    }

    /// Offers each line of the file's text (invalid UTF-8 replaced; `lines()` drops the `\r` of
    /// each `\r\n`).
    fn search_each_line(&mut self, bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes);
        for (index, line) in text.lines().enumerate() {
            if !self.offer(index + 1, line) {
                return;
            }
        }
    }
}

impl Sink for Hits<'_> {
    type Error = std::io::Error;

    /// Offers the line the searcher found (a candidate: the searcher saw the whole file).
    fn matched(&mut self, _: &Searcher, found: &SinkMatch<'_>) -> Result<bool, std::io::Error> {
        let first = found.line_number().unwrap_or(1) as usize;
        for (offset, line) in found.lines().enumerate() {
            let line = match line.strip_suffix(b"\n") {
                Some(line) => line.strip_suffix(b"\r").unwrap_or(line),
                None => line,
            };
            if !self.offer(first + offset, &String::from_utf8_lossy(line)) {
                return Ok(false);
            }
        }
        Ok(true)
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
    memchr::memchr(0, &bytes[..bytes.len().min(8192)]).is_some()
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
